//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), server side, and
//! credentials as Kafka stores them (salt, iterations, stored key, server
//! key; never the password). Pure: no I/O, the nonce is given.

use super::constant_time_eq;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};
use tessera_metadata::{ScramCredentialRecord, MAX_SCRAM_ITERATIONS, MIN_SCRAM_ITERATIONS};

/// A SCRAM mechanism, with Kafka's type byte (`ScramMechanism`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScramMechanism {
    Sha256,
    Sha512,
}

impl ScramMechanism {
    pub const ALL: [ScramMechanism; 2] = [ScramMechanism::Sha256, ScramMechanism::Sha512];

    pub fn name(self) -> &'static str {
        match self {
            ScramMechanism::Sha256 => "SCRAM-SHA-256",
            ScramMechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_name(name: &str) -> Option<ScramMechanism> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Kafka's type byte: 1 = SCRAM-SHA-256, 2 = SCRAM-SHA-512.
    pub fn kafka_type(self) -> i8 {
        match self {
            ScramMechanism::Sha256 => 1,
            ScramMechanism::Sha512 => 2,
        }
    }

    pub fn from_kafka_type(t: i8) -> Option<ScramMechanism> {
        Self::ALL.into_iter().find(|m| m.kafka_type() == t)
    }

    /// Kafka's lower bound on iterations (`ScramMechanism.minIterations`).
    pub const MIN_ITERATIONS: u32 = MIN_SCRAM_ITERATIONS;
    /// The upper bound AlterUserScramCredentials enforces.
    pub const MAX_ITERATIONS: u32 = MAX_SCRAM_ITERATIONS;

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => Sha256::digest(data).to_vec(),
            ScramMechanism::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => {
                let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key");
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
            ScramMechanism::Sha512 => {
                let mut m = Hmac::<Sha512>::new_from_slice(key).expect("HMAC takes any key");
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
        }
    }

    /// RFC 5802's `Hi(password, salt, i)`: PBKDF2 with HMAC of the hash.
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            ScramMechanism::Sha256 => {
                let mut out = [0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
                out.to_vec()
            }
            ScramMechanism::Sha512 => {
                let mut out = [0u8; 64];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out);
                out.to_vec()
            }
        }
    }
}

/// What the server keeps of a password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScramCredential {
    pub salt: Vec<u8>,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
    pub iterations: u32,
}

impl ScramCredential {
    /// From the salted password (what AlterUserScramCredentials carries).
    pub fn from_salted_password(
        mechanism: ScramMechanism,
        salted_password: &[u8],
        salt: &[u8],
        iterations: u32,
    ) -> ScramCredential {
        let client_key = mechanism.hmac(salted_password, b"Client Key");
        ScramCredential {
            salt: salt.to_vec(),
            stored_key: mechanism.hash(&client_key),
            server_key: mechanism.hmac(salted_password, b"Server Key"),
            iterations,
        }
    }

    /// From the password itself (`tessera users add`).
    pub fn from_password(
        mechanism: ScramMechanism,
        password: &str,
        salt: &[u8],
        iterations: u32,
    ) -> ScramCredential {
        let salted = mechanism.salted_password(password.as_bytes(), salt, iterations);
        Self::from_salted_password(mechanism, &salted, salt, iterations)
    }

    /// Whether `password` is the one this credential was made from (a
    /// login that carries the password itself: the admin port's Basic).
    pub fn verify_password(&self, mechanism: ScramMechanism, password: &str) -> bool {
        let candidate = Self::from_password(mechanism, password, &self.salt, self.iterations);
        constant_time_eq(&candidate.stored_key, &self.stored_key)
    }

    pub fn to_record(&self, user: &str, mechanism: ScramMechanism) -> ScramCredentialRecord {
        ScramCredentialRecord {
            user: user.to_string(),
            mechanism: mechanism.kafka_type() as u8,
            salt: self.salt.clone(),
            stored_key: self.stored_key.clone(),
            server_key: self.server_key.clone(),
            iterations: self.iterations,
        }
    }

    pub fn from_record(r: &ScramCredentialRecord) -> ScramCredential {
        ScramCredential {
            salt: r.salt.clone(),
            stored_key: r.stored_key.clone(),
            server_key: r.server_key.clone(),
            iterations: r.iterations,
        }
    }
}

/// Why a SCRAM exchange failed; the message is what the client is told
/// (Kafka's wording where it has one).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    #[error("Invalid SCRAM client message: {0}")]
    Malformed(String),
    #[error("Authentication failed: Invalid user credentials")]
    UnknownUser,
    #[error("Authentication failed: Client requested an authorization id that is different from username")]
    AuthorizationId,
    #[error("Authentication failed: channel binding is not supported")]
    ChannelBinding,
    #[error("Authentication failed: Invalid client nonce in the final client message.")]
    Nonce,
    #[error("Authentication failed: Invalid client credentials")]
    Proof,
    #[error("Authentication failed: unexpected SCRAM message")]
    State,
}

enum State {
    ClientFirst,
    ClientFinal {
        user: String,
        gs2_header: String,
        client_first_bare: String,
        server_first: String,
        nonce: String,
        credential: ScramCredential,
    },
    Done,
}

/// The server side of one SCRAM exchange.
pub struct ScramServer {
    mechanism: ScramMechanism,
    server_nonce: String,
    state: State,
}

/// The outcome of a step.
#[derive(Debug, PartialEq, Eq)]
pub enum ScramStep {
    /// Send this (server-first) and wait for the client's final message.
    Challenge(Vec<u8>),
    /// Send this (server-final); the user is authenticated.
    Success { user: String, response: Vec<u8> },
}

/// RFC 5802 `saslname`: `=2C` is `,` and `=3D` is `=`; any other `=` is invalid.
fn decode_saslname(s: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(ScramError::Malformed(format!("invalid username {s:?}"))),
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

fn attribute(part: Option<&str>, name: char) -> Result<&str, ScramError> {
    part.and_then(|p| p.strip_prefix(name))
        .and_then(|p| p.strip_prefix('='))
        .ok_or_else(|| ScramError::Malformed(format!("expected attribute {name}")))
}

impl ScramServer {
    /// `server_nonce`: fresh printable characters without `,`.
    pub fn new(mechanism: ScramMechanism, server_nonce: String) -> ScramServer {
        ScramServer {
            mechanism,
            server_nonce,
            state: State::ClientFirst,
        }
    }

    pub fn mechanism(&self) -> ScramMechanism {
        self.mechanism
    }

    /// The user named by the client-first message, once it has arrived.
    pub fn user(&self) -> Option<&str> {
        match &self.state {
            State::ClientFinal { user, .. } => Some(user),
            _ => None,
        }
    }

    /// Feeds the next client message; `lookup` finds a user's credential.
    pub fn step(
        &mut self,
        message: &[u8],
        lookup: impl FnOnce(&str) -> Option<ScramCredential>,
    ) -> Result<ScramStep, ScramError> {
        let message =
            std::str::from_utf8(message).map_err(|_| ScramError::Malformed("not UTF-8".into()))?;
        match std::mem::replace(&mut self.state, State::Done) {
            State::ClientFirst => self.client_first(message, lookup),
            State::ClientFinal {
                user,
                gs2_header,
                client_first_bare,
                server_first,
                nonce,
                credential,
            } => {
                let response = self.client_final(
                    message,
                    &gs2_header,
                    &client_first_bare,
                    &server_first,
                    &nonce,
                    &credential,
                )?;
                Ok(ScramStep::Success { user, response })
            }
            State::Done => Err(ScramError::State),
        }
    }

    fn client_first(
        &mut self,
        message: &str,
        lookup: impl FnOnce(&str) -> Option<ScramCredential>,
    ) -> Result<ScramStep, ScramError> {
        // gs2-header = gs2-cbind-flag "," [ authzid ] ","
        let mut parts = message.splitn(3, ',');
        let flag = parts.next().unwrap_or("");
        let authzid = parts
            .next()
            .ok_or_else(|| ScramError::Malformed("no gs2 header".into()))?;
        let bare = parts
            .next()
            .ok_or_else(|| ScramError::Malformed("no client-first-bare".into()))?;
        match flag {
            "n" | "y" => {}
            f if f.starts_with("p=") => return Err(ScramError::ChannelBinding),
            _ => return Err(ScramError::Malformed("invalid gs2 flag".into())),
        }
        let mut fields = bare.split(',');
        let first = fields.next();
        if first.is_some_and(|f| f.starts_with("m=")) {
            return Err(ScramError::Malformed(
                "mandatory extension not supported".into(),
            ));
        }
        let user = decode_saslname(attribute(first, 'n')?)?;
        let client_nonce = attribute(fields.next(), 'r')?;
        if user.is_empty() || client_nonce.is_empty() {
            return Err(ScramError::Malformed("empty username or nonce".into()));
        }
        if !authzid.is_empty() {
            let authzid = decode_saslname(attribute(Some(authzid), 'a')?)?;
            if authzid != user {
                return Err(ScramError::AuthorizationId);
            }
        }
        let credential = lookup(&user).ok_or(ScramError::UnknownUser)?;
        let nonce = format!("{client_nonce}{}", self.server_nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&credential.salt),
            credential.iterations
        );
        let gs2_header = format!("{flag},{authzid},");
        self.state = State::ClientFinal {
            user,
            gs2_header,
            client_first_bare: bare.to_string(),
            server_first: server_first.clone(),
            nonce,
            credential,
        };
        Ok(ScramStep::Challenge(server_first.into_bytes()))
    }

    fn client_final(
        &self,
        message: &str,
        gs2_header: &str,
        client_first_bare: &str,
        server_first: &str,
        nonce: &str,
        credential: &ScramCredential,
    ) -> Result<Vec<u8>, ScramError> {
        let (without_proof, proof) = message
            .rsplit_once(",p=")
            .ok_or_else(|| ScramError::Malformed("no proof".into()))?;
        let mut fields = without_proof.split(',');
        let binding = attribute(fields.next(), 'c')?;
        let binding = B64
            .decode(binding)
            .map_err(|_| ScramError::Malformed("channel binding is not base64".into()))?;
        if binding != gs2_header.as_bytes() {
            return Err(ScramError::ChannelBinding);
        }
        // Kafka accepts a final nonce that ends with the server's
        // (`ScramSaslServer`): librdkafka sends its own nonce followed by
        // the whole server nonce, which already starts with it.
        if !attribute(fields.next(), 'r')?.ends_with(nonce) {
            return Err(ScramError::Nonce);
        }
        let proof = B64
            .decode(proof)
            .map_err(|_| ScramError::Malformed("proof is not base64".into()))?;
        let m = self.mechanism;
        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let client_signature = m.hmac(&credential.stored_key, auth_message.as_bytes());
        if proof.len() != client_signature.len() {
            return Err(ScramError::Proof);
        }
        let client_key: Vec<u8> = proof
            .iter()
            .zip(&client_signature)
            .map(|(a, b)| a ^ b)
            .collect();
        if !constant_time_eq(&m.hash(&client_key), &credential.stored_key) {
            return Err(ScramError::Proof);
        }
        let server_signature = m.hmac(&credential.server_key, auth_message.as_bytes());
        Ok(format!("v={}", B64.encode(server_signature)).into_bytes())
    }
}

/// A fresh server nonce: 32 random alphanumeric characters (Kafka's
/// `ScramFormatter.secureRandomString` is alphanumeric too; some clients
/// mishandle `+`, `/` or `=` in a nonce).
pub fn fresh_nonce() -> String {
    use rand::distributions::{Alphanumeric, DistString};
    Alphanumeric.sample_string(&mut rand::thread_rng(), 32)
}

/// A fresh salt for a new credential (Kafka's are random too).
pub fn fresh_salt() -> Vec<u8> {
    use rand::RngCore;
    let mut bytes = vec![0u8; 16];
    rand::thread_rng().fill_bytes(&mut bytes);
    bytes
}

/// The client side (the migrator, tests): RFC 5802's client-final-message
/// for `server_first`, and the server-final-message the client must then
/// get. A server-first that does not extend the client's nonce, or asks
/// for too few or too many iterations, is refused.
pub fn client_final_message(
    mechanism: ScramMechanism,
    password: &str,
    client_first_bare: &str,
    server_first: &str,
) -> Result<(String, Vec<u8>), ScramError> {
    let mut fields = server_first.split(',');
    let nonce = attribute(fields.next(), 'r')?;
    let salt = B64
        .decode(attribute(fields.next(), 's')?)
        .map_err(|e| ScramError::Malformed(format!("salt: {e}")))?;
    let iterations: u32 = attribute(fields.next(), 'i')?
        .parse()
        .map_err(|e| ScramError::Malformed(format!("iterations: {e}")))?;
    let client_nonce = client_first_bare
        .split(',')
        .find_map(|f| f.strip_prefix("r="))
        .unwrap_or_default();
    if !nonce.starts_with(client_nonce) || nonce.len() == client_nonce.len() {
        return Err(ScramError::Malformed(
            "the server nonce does not extend the client's".into(),
        ));
    }
    if !(MIN_SCRAM_ITERATIONS..=MAX_SCRAM_ITERATIONS).contains(&iterations) {
        return Err(ScramError::Malformed(format!(
            "{iterations} iterations requested"
        )));
    }
    let salted = mechanism.salted_password(password.as_bytes(), &salt, iterations);
    let client_key = mechanism.hmac(&salted, b"Client Key");
    let stored_key = mechanism.hash(&client_key);
    let without_proof = format!("c=biws,r={nonce}");
    let auth = format!("{client_first_bare},{server_first},{without_proof}");
    let signature = mechanism.hmac(&stored_key, auth.as_bytes());
    let proof: Vec<u8> = client_key
        .iter()
        .zip(&signature)
        .map(|(a, b)| a ^ b)
        .collect();
    let server_key = mechanism.hmac(&salted, b"Server Key");
    let expected = format!(
        "v={}",
        B64.encode(mechanism.hmac(&server_key, auth.as_bytes()))
    );
    Ok((
        format!("{without_proof},p={}", B64.encode(proof)),
        expected.into_bytes(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// RFC 7677 section 3: user "user", password "pencil".
    #[test]
    fn rfc7677_sha256_vector() {
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let cred = ScramCredential::from_password(ScramMechanism::Sha256, "pencil", &salt, 4096);
        let mut server = ScramServer::new(
            ScramMechanism::Sha256,
            "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".into(),
        );
        let first = server
            .step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO", |u| {
                assert_eq!(u, "user");
                Some(cred.clone())
            })
            .unwrap();
        assert_eq!(
            first,
            ScramStep::Challenge(
                b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
                    .to_vec()
            )
        );
        let last = server
            .step(
                b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
                |_| unreachable!(),
            )
            .unwrap();
        assert_eq!(
            last,
            ScramStep::Success {
                user: "user".into(),
                response: b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=".to_vec()
            }
        );
        // Nothing after the end.
        assert_eq!(server.step(b"x", |_| None), Err(ScramError::State));
    }

    fn exchange(
        mechanism: ScramMechanism,
        stored_password: &str,
        given_password: &str,
        user_in_message: &str,
    ) -> Result<ScramStep, ScramError> {
        let cred = ScramCredential::from_password(mechanism, stored_password, b"salt", 4096);
        let mut server = ScramServer::new(mechanism, "srv".into());
        let bare = format!("n={user_in_message},r=cli");
        let ScramStep::Challenge(first) =
            server.step(format!("n,,{bare}").as_bytes(), |_| Some(cred))?
        else {
            panic!("expected a challenge")
        };
        let first = String::from_utf8(first).unwrap();
        let (last, expected) =
            client_final_message(mechanism, given_password, &bare, &first).unwrap();
        let step = server.step(last.as_bytes(), |_| None)?;
        if let ScramStep::Success { response, .. } = &step {
            assert_eq!(response, &expected);
        }
        Ok(step)
    }

    #[test]
    fn sha512_round_trip_and_wrong_password() {
        for m in ScramMechanism::ALL {
            assert!(matches!(
                exchange(m, "secret", "secret", "bob"),
                Ok(ScramStep::Success { ref user, .. }) if user == "bob"
            ));
            assert_eq!(
                exchange(m, "secret", "wrong", "bob"),
                Err(ScramError::Proof)
            );
        }
        // saslname escapes.
        assert!(matches!(
            exchange(ScramMechanism::Sha512, "p", "p", "a=2Cb=3Dc"),
            Ok(ScramStep::Success { ref user, .. }) if user == "a,b=c"
        ));
    }

    #[test]
    fn bad_client_messages() {
        let cred = || {
            Some(ScramCredential::from_password(
                ScramMechanism::Sha256,
                "p",
                b"s",
                4096,
            ))
        };
        let first = |msg: &str| {
            ScramServer::new(ScramMechanism::Sha256, "x".into()).step(msg.as_bytes(), |_| cred())
        };
        assert!(matches!(first(""), Err(ScramError::Malformed(_))));
        assert!(matches!(first("n,,r=abc"), Err(ScramError::Malformed(_))));
        assert!(matches!(first("n,,n=u"), Err(ScramError::Malformed(_))));
        assert!(matches!(
            first("n,,n=a=b,r=x"),
            Err(ScramError::Malformed(_))
        ));
        assert!(matches!(first("q,,n=u,r=x"), Err(ScramError::Malformed(_))));
        assert_eq!(
            first("p=tls-unique,,n=u,r=x"),
            Err(ScramError::ChannelBinding)
        );
        assert_eq!(first("n,a=other,n=u,r=x"), Err(ScramError::AuthorizationId));
        assert!(first("n,a=u,n=u,r=x").is_ok());
        assert_eq!(
            ScramServer::new(ScramMechanism::Sha256, "x".into()).step(b"n,,n=u,r=x", |_| None),
            Err(ScramError::UnknownUser)
        );
        // A final message with the wrong nonce or channel binding.
        let mut s = ScramServer::new(ScramMechanism::Sha256, "x".into());
        s.step(b"n,,n=u,r=c", |_| cred()).unwrap();
        assert_eq!(
            s.step(b"c=biws,r=cy,p=AAAA", |_| None),
            Err(ScramError::Nonce)
        );
        // librdkafka's form: its nonce, then the whole server nonce.
        let mut s = ScramServer::new(ScramMechanism::Sha256, "x".into());
        s.step(b"n,,n=u,r=c", |_| cred()).unwrap();
        assert_eq!(
            s.step(b"c=biws,r=ccx,p=AAAA", |_| None),
            Err(ScramError::Proof)
        );
        let mut s = ScramServer::new(ScramMechanism::Sha256, "x".into());
        s.step(b"n,,n=u,r=c", |_| cred()).unwrap();
        assert_eq!(
            s.step(b"c=eSws,r=cx,p=AAAA", |_| None),
            Err(ScramError::ChannelBinding)
        );
        let mut s = ScramServer::new(ScramMechanism::Sha256, "x".into());
        s.step(b"n,,n=u,r=c", |_| cred()).unwrap();
        assert_eq!(
            s.step(b"c=biws,r=cx,p=AAAA", |_| None),
            Err(ScramError::Proof)
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Whatever the client sends, the server answers or refuses; it never panics.
        #[test]
        fn arbitrary_messages_never_panic(
            a in proptest::collection::vec(any::<u8>(), 0..80),
            b in proptest::collection::vec(any::<u8>(), 0..80),
        ) {
            let cred = ScramCredential::from_password(ScramMechanism::Sha256, "p", b"s", 4096);
            let mut s = ScramServer::new(ScramMechanism::Sha256, "x".into());
            let _ = s.step(&a, |_| Some(cred));
            let _ = s.step(&b, |_| None);
        }

        #[test]
        fn printable_first_messages_never_panic(msg in "[n,=a-z0-9r]{0,40}") {
            let cred = ScramCredential::from_password(ScramMechanism::Sha512, "p", b"s", 4096);
            let mut s = ScramServer::new(ScramMechanism::Sha512, "x".into());
            let _ = s.step(msg.as_bytes(), |_| Some(cred));
        }
    }
}
