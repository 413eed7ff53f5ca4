//! SASL/OAUTHBEARER (RFC 7628, KIP-255) with Kafka's default server-side
//! validation, `OAuthBearerUnsecuredValidatorCallbackHandler`: the token
//! is an unsecured JWS (`alg: none`, empty signature), its principal claim
//! (`sub` unless `unsecuredValidatorPrincipalClaimName` says otherwise)
//! names the user, `exp` must be in the future and `iat` not in it (with
//! `unsecuredValidatorAllowableClockSkewMs`), and
//! `unsecuredValidatorRequiredScope` lists scopes the token must carry.
//! Options come from `listener.name.<l>.oauthbearer.sasl.jaas.config`.
//! For tests and development, as in Kafka: nothing is signed.

use std::collections::BTreeMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::Value;

/// Why a token was refused (the message the client and the log get).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("Authentication failed: {0}")]
pub struct OAuthError(pub String);

fn refuse(m: impl Into<String>) -> OAuthError {
    OAuthError(m.into())
}

/// The validator's options (Kafka's `unsecuredValidator*` JAAS options).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidatorOptions {
    pub principal_claim: String,
    pub scope_claim: String,
    pub required_scope: Vec<String>,
    pub clock_skew_ms: i64,
}

impl Default for ValidatorOptions {
    fn default() -> Self {
        ValidatorOptions {
            principal_claim: "sub".into(),
            scope_claim: "scope".into(),
            required_scope: Vec::new(),
            clock_skew_ms: 0,
        }
    }
}

impl ValidatorOptions {
    /// From the JAAS options of the listener's OAUTHBEARER entry.
    pub fn from_jaas(options: &BTreeMap<String, String>) -> Result<ValidatorOptions, String> {
        let mut o = ValidatorOptions::default();
        if let Some(v) = options.get("unsecuredValidatorPrincipalClaimName") {
            o.principal_claim = v.trim().to_string();
        }
        if let Some(v) = options.get("unsecuredValidatorScopeClaimName") {
            o.scope_claim = v.trim().to_string();
        }
        if let Some(v) = options.get("unsecuredValidatorRequiredScope") {
            o.required_scope = v
                .split([' ', ','])
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
        }
        if let Some(v) = options.get("unsecuredValidatorAllowableClockSkewMs") {
            o.clock_skew_ms = v
                .trim()
                .parse()
                .ok()
                .filter(|ms: &i64| *ms >= 0)
                .ok_or_else(|| format!("unsecuredValidatorAllowableClockSkewMs {v:?}"))?;
        }
        Ok(o)
    }
}

/// The token of an RFC 7628 client-first message
/// (`gs2-header %x01 auth=Bearer <token> %x01 [key=value %x01]* %x01`).
fn bearer_token(message: &[u8]) -> Result<&str, OAuthError> {
    let text = std::str::from_utf8(message).map_err(|_| refuse("the message is not UTF-8"))?;
    let mut parts = text.split('\u{1}');
    let gs2 = parts.next().unwrap_or_default();
    if !(gs2.starts_with("n,") || gs2.starts_with("y,")) {
        return Err(refuse("invalid OAUTHBEARER client first message"));
    }
    if !text.ends_with("\u{1}\u{1}") {
        return Err(refuse("invalid OAUTHBEARER client first message"));
    }
    parts
        .find_map(|kv| kv.strip_prefix("auth="))
        .and_then(|auth| auth.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| refuse("no bearer token in the OAUTHBEARER message"))
}

fn json_part(part: &str, what: &str) -> Result<serde_json::Map<String, Value>, OAuthError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .map_err(|_| refuse(format!("the token's {what} is not base64url")))?;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(refuse(format!("the token's {what} is not a JSON object"))),
    }
}

/// A JWT NumericDate claim (seconds, possibly fractional) in milliseconds.
fn time_claim(
    claims: &serde_json::Map<String, Value>,
    name: &str,
) -> Result<Option<i64>, OAuthError> {
    match claims.get(name) {
        None => Ok(None),
        Some(Value::Number(n)) => n
            .as_f64()
            .map(|s| Some((s * 1000.0) as i64))
            .ok_or_else(|| refuse(format!("claim {name} is not a number"))),
        Some(_) => Err(refuse(format!("claim {name} is not a number"))),
    }
}

/// A token that passed validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validated {
    pub user: String,
    /// Its `exp` (ms since the epoch): the session ends there (KIP-368).
    pub expires_ms: i64,
}

/// Validates one client-first message at `now_ms`.
pub fn authenticate(
    message: &[u8],
    options: &ValidatorOptions,
    now_ms: i64,
) -> Result<Validated, OAuthError> {
    let token = bearer_token(message)?;
    let parts: Vec<&str> = token.split('.').collect();
    if parts.len() != 3 {
        return Err(refuse("the token is not a JWS (three dot-separated parts)"));
    }
    if !parts[2].is_empty() {
        return Err(refuse(
            "the token is signed; only unsecured tokens (alg none) are validated here",
        ));
    }
    let header = json_part(parts[0], "header")?;
    if header.get("alg").and_then(Value::as_str) != Some("none") {
        return Err(refuse("the token's alg is not \"none\""));
    }
    let claims = json_part(parts[1], "payload")?;
    let user = match claims.get(&options.principal_claim) {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        _ => {
            return Err(refuse(format!(
                "the token has no principal claim {:?}",
                options.principal_claim
            )))
        }
    };
    let skew = options.clock_skew_ms;
    let exp = time_claim(&claims, "exp")?
        .ok_or_else(|| refuse("the token has no expiration time (exp)"))?;
    if exp + skew <= now_ms {
        return Err(refuse("the token has expired"));
    }
    if let Some(iat) = time_claim(&claims, "iat")? {
        if iat > now_ms + skew {
            return Err(refuse("the token was issued in the future (iat)"));
        }
        if exp <= iat {
            return Err(refuse("the token expires before it was issued"));
        }
    }
    if !options.required_scope.is_empty() {
        let scope: Vec<String> = match claims.get(&options.scope_claim) {
            Some(Value::String(s)) => s.split(' ').map(str::to_string).collect(),
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        };
        let missing: Vec<&String> = options
            .required_scope
            .iter()
            .filter(|s| !scope.contains(s))
            .collect();
        if !missing.is_empty() {
            return Err(refuse(format!(
                "the token lacks the required scope {missing:?}"
            )));
        }
    }
    Ok(Validated {
        user,
        expires_ms: exp,
    })
}

/// The client side, as librdkafka builds an unsecured token from
/// `sasl.oauthbearer.config` (`enable.sasl.oauthbearer.unsecure.jwt`):
/// `principal=<name>` (required), `principalClaimName=` (`sub`),
/// `scope=<a,b>`, `scopeClaimName=` (`scope`), `lifeSeconds=` (3600) and
/// `extension_<key>=<value>` (SASL extensions). `tessera migrate` logs in
/// to an OAUTHBEARER source with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsecuredLogin {
    pub principal: String,
    principal_claim: String,
    scope: Vec<String>,
    scope_claim: String,
    life_seconds: u64,
    extensions: Vec<(String, String)>,
}

impl UnsecuredLogin {
    pub fn parse(config: &str) -> Result<UnsecuredLogin, String> {
        let mut login = UnsecuredLogin {
            principal: String::new(),
            principal_claim: "sub".into(),
            scope: Vec::new(),
            scope_claim: "scope".into(),
            life_seconds: 3600,
            extensions: Vec::new(),
        };
        for pair in config.split_whitespace() {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not key=value"))?;
            match key {
                "principal" => login.principal = value.to_string(),
                "principalClaimName" => login.principal_claim = value.to_string(),
                "scope" => {
                    login.scope = value
                        .split(',')
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect()
                }
                "scopeClaimName" => login.scope_claim = value.to_string(),
                "lifeSeconds" => {
                    login.life_seconds = value
                        .parse()
                        .ok()
                        .filter(|s| *s > 0)
                        .ok_or_else(|| format!("lifeSeconds {value:?}"))?
                }
                _ => match key.strip_prefix("extension_") {
                    Some(ext) if !ext.is_empty() => {
                        login.extensions.push((ext.to_string(), value.to_string()))
                    }
                    _ => return Err(format!("unknown key {key:?}")),
                },
            }
        }
        if login.principal.is_empty() {
            return Err("principal=<name> is required".into());
        }
        Ok(login)
    }

    /// The client-first message (RFC 7628) with a token issued at `now_ms`.
    pub fn client_first_message(&self, now_ms: i64) -> Vec<u8> {
        let issued = now_ms / 1000;
        let mut claims = serde_json::Map::new();
        claims.insert(self.principal_claim.clone(), self.principal.clone().into());
        claims.insert("iat".into(), issued.into());
        claims.insert("exp".into(), (issued + self.life_seconds as i64).into());
        if !self.scope.is_empty() {
            claims.insert(self.scope_claim.clone(), self.scope.clone().into());
        }
        let token = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#),
            URL_SAFE_NO_PAD.encode(Value::Object(claims).to_string())
        );
        let mut message = format!("n,,\u{1}auth=Bearer {token}\u{1}");
        for (key, value) in &self.extensions {
            message.push_str(&format!("{key}={value}\u{1}"));
        }
        message.push('\u{1}');
        message.into_bytes()
    }
}

/// The user an OAUTHBEARER message claims, for the log of a failure.
pub fn claimed_user(message: &[u8]) -> Option<String> {
    let token = bearer_token(message).ok()?;
    let claims = json_part(token.split('.').nth(1)?, "payload").ok()?;
    claims.get("sub")?.as_str().map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    fn token(header: &str, payload: &str, signature: &str) -> String {
        format!(
            "{}.{}.{signature}",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(payload)
        )
    }

    fn message(token: &str) -> Vec<u8> {
        format!("n,,\u{1}auth=Bearer {token}\u{1}\u{1}").into_bytes()
    }

    fn unsecured(payload: &str) -> Vec<u8> {
        message(&token(r#"{"alg":"none"}"#, payload, ""))
    }

    fn check(msg: &[u8]) -> Result<String, OAuthError> {
        authenticate(msg, &ValidatorOptions::default(), NOW).map(|v| v.user)
    }

    #[test]
    fn an_unsecured_token_names_its_subject() {
        // As librdkafka's enable.sasl.oauthbearer.unsecure.jwt builds it.
        let msg =
            unsecured(r#"{"iat":1799999999.5,"exp":1800003600,"sub":"alice","scope":["a","b"]}"#);
        assert_eq!(check(&msg).unwrap(), "alice");
        assert_eq!(
            authenticate(&msg, &ValidatorOptions::default(), NOW)
                .unwrap()
                .expires_ms,
            1_800_003_600_000
        );
        assert_eq!(claimed_user(&msg).as_deref(), Some("alice"));
        // Extensions after the token are allowed.
        let with_ext = format!(
            "n,,\u{1}auth=Bearer {}\u{1}traceId=1\u{1}\u{1}",
            token(r#"{"alg":"none"}"#, r#"{"exp":1800003600,"sub":"bob"}"#, "")
        );
        assert_eq!(check(with_ext.as_bytes()).unwrap(), "bob");
    }

    #[test]
    fn refusals() {
        let err = |msg: &[u8]| check(msg).unwrap_err().0;
        assert!(err(&unsecured(r#"{"exp":1700000000,"sub":"a"}"#)).contains("expired"));
        assert!(err(&unsecured(r#"{"sub":"a"}"#)).contains("exp"));
        assert!(err(&unsecured(r#"{"exp":1800003600}"#)).contains("principal"));
        assert!(err(&unsecured(r#"{"exp":1800003600,"sub":""}"#)).contains("principal"));
        assert!(err(&unsecured(r#"{"exp":"soon","sub":"a"}"#)).contains("number"));
        assert!(err(&unsecured(
            r#"{"iat":1900000000,"exp":1900003600,"sub":"a"}"#
        ))
        .contains("future"));
        let signed = message(&token(
            r#"{"alg":"HS256"}"#,
            r#"{"exp":1800003600,"sub":"a"}"#,
            "c2ln",
        ));
        assert!(err(&signed).contains("signed"));
        let hs = message(&token(
            r#"{"alg":"HS256"}"#,
            r#"{"exp":1800003600,"sub":"a"}"#,
            "",
        ));
        assert!(err(&hs).contains("alg"));
        assert!(err(&message("not-a-jwt")).contains("JWS"));
        assert!(err(&message("!!.??.")).contains("base64url"));
        assert!(err(b"n,,\x01auth=Basic abc\x01\x01").contains("bearer"));
        assert!(err(b"garbage").contains("client first"));
        let e = err(b"n,,\x01auth=Bearer eHl6.eHl6.\x01\x01");
        assert!(e.contains("JSON"), "{e}");
        assert!(err(&[0xff, 0xfe]).contains("UTF-8"));
    }

    #[test]
    fn options_from_jaas() {
        let jaas: BTreeMap<String, String> = [
            ("unsecuredValidatorPrincipalClaimName", "email"),
            ("unsecuredValidatorRequiredScope", "read write"),
            ("unsecuredValidatorAllowableClockSkewMs", "5000"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let o = ValidatorOptions::from_jaas(&jaas).unwrap();
        assert_eq!(o.principal_claim, "email");
        assert_eq!(o.required_scope, vec!["read", "write"]);
        let msg = unsecured(r#"{"exp":1799999998,"email":"c@x","scope":"read write admin"}"#);
        // Expired by 2 s, within the 5 s skew.
        assert_eq!(authenticate(&msg, &o, NOW).unwrap().user, "c@x");
        let narrow = unsecured(r#"{"exp":1800003600,"email":"c@x","scope":["read"]}"#);
        assert!(authenticate(&narrow, &o, NOW)
            .unwrap_err()
            .0
            .contains("scope"));
        let bad: BTreeMap<String, String> = [(
            "unsecuredValidatorAllowableClockSkewMs".to_string(),
            "-1".to_string(),
        )]
        .into();
        assert!(ValidatorOptions::from_jaas(&bad).is_err());
    }

    #[test]
    fn an_unsecured_login_passes_the_validator() {
        let login =
            UnsecuredLogin::parse("principal=alice scope=tessera,other lifeSeconds=60").unwrap();
        let options = ValidatorOptions::from_jaas(&BTreeMap::from([(
            "unsecuredValidatorRequiredScope".to_string(),
            "tessera".to_string(),
        )]))
        .unwrap();
        let message = login.client_first_message(NOW);
        let v = authenticate(&message, &options, NOW).unwrap();
        assert_eq!(
            v,
            Validated {
                user: "alice".into(),
                expires_ms: NOW + 60_000
            }
        );
        // Past its life the validator refuses it.
        assert!(authenticate(&message, &options, NOW + 61_000).is_err());
        // Without the scope the validator asks for, refused.
        let other = UnsecuredLogin::parse("principal=alice scope=other").unwrap();
        assert!(authenticate(&other.client_first_message(NOW), &options, NOW).is_err());
        // Another principal claim, and an extension before the end.
        let named =
            UnsecuredLogin::parse("principal=bob principalClaimName=azp extension_traceId=7")
                .unwrap();
        let message = named.client_first_message(NOW);
        assert!(String::from_utf8_lossy(&message).ends_with("\u{1}traceId=7\u{1}\u{1}"));
        let azp = ValidatorOptions::from_jaas(&BTreeMap::from([(
            "unsecuredValidatorPrincipalClaimName".to_string(),
            "azp".to_string(),
        )]))
        .unwrap();
        assert_eq!(authenticate(&message, &azp, NOW).unwrap().user, "bob");
    }

    #[test]
    fn unsecured_login_config_errors() {
        assert!(UnsecuredLogin::parse("scope=a")
            .unwrap_err()
            .contains("principal"));
        assert!(UnsecuredLogin::parse("principal=a lifeSeconds=x").is_err());
        assert!(UnsecuredLogin::parse("principal=a nonsense=1").is_err());
        assert!(UnsecuredLogin::parse("principal").is_err());
    }
}
