//! SASL/PLAIN (RFC 4616) and Kafka's static user list: the
//! `user_NAME="password"` options of a `PlainLoginModule` JAAS entry
//! (`listener.name.<listener>.plain.sasl.jaas.config`). Pure.

use super::constant_time_eq;
use std::collections::BTreeMap;

/// Why a PLAIN exchange failed: Kafka's messages (`PlainSaslServer`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlainError {
    #[error("Invalid SASL/PLAIN response: expected 3 tokens, got {0}")]
    Tokens(usize),
    #[error("Authentication failed: username not specified")]
    NoUser,
    #[error("Authentication failed: password not specified")]
    NoPassword,
    #[error("Authentication failed: Client requested an authorization id that is different from username")]
    AuthorizationId,
    #[error("Authentication failed: Invalid username or password")]
    Credentials,
}

/// Checks a PLAIN message (`authzid NUL authcid NUL passwd`) against the
/// users; the authenticated user on success.
pub fn authenticate(
    message: &[u8],
    users: &BTreeMap<String, String>,
) -> Result<String, PlainError> {
    let tokens: Vec<&[u8]> = message.split(|b| *b == 0).collect();
    if tokens.len() != 3 {
        return Err(PlainError::Tokens(tokens.len()));
    }
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let (authzid, user, password) = (text(tokens[0]), text(tokens[1]), tokens[2]);
    if user.is_empty() {
        return Err(PlainError::NoUser);
    }
    if password.is_empty() {
        return Err(PlainError::NoPassword);
    }
    if !authzid.is_empty() && authzid != user {
        return Err(PlainError::AuthorizationId);
    }
    match users.get(&user) {
        Some(expected) if constant_time_eq(expected.as_bytes(), password) => Ok(user),
        _ => Err(PlainError::Credentials),
    }
}

/// A JAAS entry's options: `LoginModuleClass required key="value" key2=value;`.
/// Kafka's `JaasConfig` grammar: a class name, a control flag, `key=value`
/// options (values quoted or bare), a closing `;`.
pub fn parse_jaas_options(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut chars = text.trim().chars().peekable();
    let word = |chars: &mut std::iter::Peekable<std::str::Chars>| {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut w = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_whitespace() || c == '=' || c == ';' || c == '"' {
                break;
            }
            w.push(c);
            chars.next();
        }
        w
    };
    let class = word(&mut chars);
    if class.is_empty() {
        return Err("no login module".into());
    }
    let flag = word(&mut chars);
    if !["required", "requisite", "sufficient", "optional"].contains(&flag.as_str()) {
        return Err(format!("invalid control flag {flag:?}"));
    }
    let mut options = BTreeMap::new();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        match chars.peek() {
            Some(';') => {
                chars.next();
                break;
            }
            None => return Err("missing ';' at the end".into()),
            _ => {}
        }
        let key = word(&mut chars);
        if key.is_empty() || chars.next() != Some('=') {
            return Err(format!("expected key=value near {key:?}"));
        }
        let value = if chars.peek() == Some(&'"') {
            chars.next();
            let mut v = String::new();
            loop {
                match chars.next() {
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some(c) => v.push(c),
                        None => return Err("unterminated value".into()),
                    },
                    Some(c) => v.push(c),
                    None => return Err(format!("unterminated value of {key}")),
                }
            }
            v
        } else {
            word(&mut chars)
        };
        options.insert(key, value);
    }
    if chars.any(|c| !c.is_whitespace()) {
        return Err("text after ';' (one login module per listener)".into());
    }
    Ok(options)
}

/// The PLAIN users of a JAAS entry: every `user_NAME="password"` option.
pub fn jaas_users(text: &str) -> Result<BTreeMap<String, String>, String> {
    Ok(parse_jaas_options(text)?
        .into_iter()
        .filter_map(|(k, v)| k.strip_prefix("user_").map(|u| (u.to_string(), v)))
        .filter(|(u, _)| !u.is_empty())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const JAAS: &str = r#"org.apache.kafka.common.security.plain.PlainLoginModule required
        username="admin" password="admin-secret"
        user_admin="admin-secret" user_alice="alice \"quoted\"" user_bob=bare;"#;

    #[test]
    fn kafka_jaas_form() {
        let users = jaas_users(JAAS).unwrap();
        assert_eq!(users.len(), 3);
        assert_eq!(users["admin"], "admin-secret");
        assert_eq!(users["alice"], "alice \"quoted\"");
        assert_eq!(users["bob"], "bare");
        assert!(jaas_users("x required a=\"b\"").is_err());
        assert!(jaas_users("x maybe a=b;").is_err());
        assert!(jaas_users("").is_err());
        assert!(jaas_users("x required a=\"b;").is_err());
    }

    #[test]
    fn plain_messages() {
        let users = jaas_users(JAAS).unwrap();
        assert_eq!(
            authenticate(b"\0alice\0alice \"quoted\"", &users).unwrap(),
            "alice"
        );
        assert_eq!(
            authenticate(b"admin\0admin\0admin-secret", &users).unwrap(),
            "admin"
        );
        assert_eq!(
            authenticate(b"\0admin\0nope", &users),
            Err(PlainError::Credentials)
        );
        assert_eq!(
            authenticate(b"\0carol\0x", &users),
            Err(PlainError::Credentials)
        );
        assert_eq!(authenticate(b"\0\0x", &users), Err(PlainError::NoUser));
        assert_eq!(
            authenticate(b"\0admin\0", &users),
            Err(PlainError::NoPassword)
        );
        assert_eq!(
            authenticate(b"bob\0admin\0admin-secret", &users),
            Err(PlainError::AuthorizationId)
        );
        assert_eq!(authenticate(b"admin", &users), Err(PlainError::Tokens(1)));
    }

    proptest! {
        #[test]
        fn never_panics(msg in proptest::collection::vec(any::<u8>(), 0..64), jaas in ".{0,64}") {
            let users = jaas_users(JAAS).unwrap();
            let _ = authenticate(&msg, &users);
            let _ = parse_jaas_options(&jaas);
        }
    }
}
