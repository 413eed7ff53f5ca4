//! The client side of Kafka's SASL exchange (Kafka's
//! `SaslClientAuthenticator`), for the broker's own connections to other
//! brokers and controllers: SaslHandshake v1 naming the mechanism, then
//! the mechanism's tokens in SaslAuthenticate v1 requests. PLAIN and
//! SCRAM-SHA-256/512 with a user and password, OAUTHBEARER with an
//! unsecured token. A handshake or token the server refuses is an error
//! with the server's code and message.

use bytes::Bytes;
use kafka_protocol::messages::{SaslAuthenticateRequest, SaslHandshakeRequest};
use kafka_protocol::protocol::StrBytes;
use tokio::io::{AsyncRead, AsyncWrite};

use super::oauthbearer::UnsecuredLogin;
use super::scram::{self, ScramMechanism};

/// A SASL mechanism a client of this build speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    Plain,
    Scram(ScramMechanism),
    OAuthBearer,
}

impl Mechanism {
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::Scram(m) => m.name(),
            Mechanism::OAuthBearer => "OAUTHBEARER",
        }
    }

    /// A Kafka mechanism name (`sasl.mechanism`), if this build speaks it.
    pub fn from_name(name: &str) -> Option<Mechanism> {
        match name.trim().to_ascii_uppercase().as_str() {
            "PLAIN" => Some(Mechanism::Plain),
            "OAUTHBEARER" => Some(Mechanism::OAuthBearer),
            other => ScramMechanism::from_name(other).map(Mechanism::Scram),
        }
    }
}

/// Who a client logs in as.
#[derive(Clone)]
pub struct Login {
    pub mechanism: Mechanism,
    pub user: String,
    pub password: String,
    /// OAUTHBEARER's token settings (a fresh token on every login).
    pub oauthbearer: Option<UnsecuredLogin>,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("mechanism", &self.mechanism.name())
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// Authenticates a fresh connection as `login`; afterwards the
/// connection serves requests (or takes the replication upgrade).
pub async fn authenticate<S>(stream: &mut S, login: &Login) -> Result<(), String>
where
    S: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let mechanism = login.mechanism;
    let handshake = crate::peer::request(
        stream,
        1,
        1,
        &SaslHandshakeRequest::default()
            .with_mechanism(StrBytes::from_static_str(mechanism.name())),
    )
    .await?;
    if handshake.error_code != 0 {
        let enabled: Vec<String> = handshake.mechanisms.iter().map(|m| m.to_string()).collect();
        return Err(format!(
            "SaslHandshake {} refused with error {} (the server enables {enabled:?})",
            mechanism.name(),
            handshake.error_code
        ));
    }
    let mut round = Round { stream, next: 2 };
    match mechanism {
        Mechanism::Plain => {
            round
                .step(format!("\0{}\0{}", login.user, login.password).into_bytes())
                .await?;
        }
        Mechanism::Scram(m) => {
            let saslname = login.user.replace('=', "=3D").replace(',', "=2C");
            let bare = format!("n={saslname},r={}", scram::fresh_nonce());
            let first = round.step(format!("n,,{bare}").into_bytes()).await?;
            let first = String::from_utf8(first)
                .map_err(|_| "SASL: a server-first message that is not UTF-8".to_string())?;
            let (last, expected) = scram::client_final_message(m, &login.password, &bare, &first)
                .map_err(|e| format!("SASL: {e}"))?;
            if round.step(last.into_bytes()).await? != expected {
                return Err("SASL: the server's signature does not verify".into());
            }
        }
        Mechanism::OAuthBearer => {
            let token = login
                .oauthbearer
                .as_ref()
                .ok_or("SASL: OAUTHBEARER without token settings")?
                .client_first_message(tessera_log::now_ms());
            round.step(token).await?;
        }
    }
    Ok(())
}

/// SaslAuthenticate requests, numbered after the handshake.
struct Round<'s, S: ?Sized> {
    stream: &'s mut S,
    next: i32,
}

impl<S: AsyncRead + AsyncWrite + Unpin + ?Sized> Round<'_, S> {
    /// One token out, the server's answer back.
    async fn step(&mut self, token: Vec<u8>) -> Result<Vec<u8>, String> {
        let correlation = self.next;
        self.next += 1;
        let response = crate::peer::request(
            self.stream,
            correlation,
            1,
            &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token)),
        )
        .await?;
        if response.error_code != 0 {
            return Err(format!(
                "SaslAuthenticate refused with error {}: {}",
                response.error_code,
                response.error_message.as_deref().unwrap_or("")
            ));
        }
        Ok(response.auth_bytes.to_vec())
    }
}
