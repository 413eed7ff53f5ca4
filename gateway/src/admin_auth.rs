//! Who is asking on the admin HTTP port, and whether they may. Kafka has
//! no admin HTTP port; this follows Redpanda's admin API: HTTP Basic
//! credentials checked against the broker's own users (the PLAIN users of
//! its listeners' JAAS entries and the SCRAM credentials of the metadata
//! image), then the ACLs, as a Kafka request with that principal would be.
//!
//! - `/health`, `/ready` and `/metrics` are open (probes and Prometheus).
//! - Reading ranges and segments needs DESCRIBE on the cluster; splitting
//!   and merging need ALTER on the cluster (what Kafka's
//!   AlterPartitionReassignments needs).
//! - The console (`/`, `/console/...`, `/api/v1/...`) needs an
//!   authenticated caller; what it shows them is then what the ACLs let
//!   them describe or read.
//! - Without credentials the caller is `User:ANONYMOUS`, and only where an
//!   anonymous client could use the Kafka port too: every listener
//!   PLAINTEXT. On a broker with a SASL or SSL listener, anonymous admin
//!   requests get 401.
//!
//! The decisions are pure functions, tested below; `admin.rs` applies them.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use tessera_metadata::MetadataImage;

use crate::listeners::{Listener, SecurityProtocol};
use crate::sasl::constant_time_eq;
use crate::sasl::scram::{ScramCredential, ScramMechanism};

/// What a route needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Nothing: probes and metrics.
    Open,
    /// An authenticated caller: the console, whose answers the ACLs then
    /// narrow resource by resource.
    Authenticated,
    /// DESCRIBE on the cluster.
    Describe,
    /// ALTER on the cluster.
    Alter,
}

/// The admin routes and what each needs (unknown routes are open: they
/// answer 404 and reveal nothing).
pub fn need_of(method: &str, path: &str) -> Need {
    match (method, path) {
        (_, path) if crate::console::owns(path) => Need::Authenticated,
        ("GET", "/ranges") | ("GET", "/segments") | ("GET", "/balance") => Need::Describe,
        ("POST", _) => Need::Alter,
        _ => Need::Open,
    }
}

/// Who the caller is, or why they are refused before the ACLs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// `User:<name>` or `User:ANONYMOUS`.
    Principal(String),
    /// Answered 401 with this reason.
    Unauthenticated(&'static str),
}

/// The value of header `name` (case-insensitive) in an HTTP request head.
pub fn header<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines().skip(1).find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The user and password of an `Authorization: Basic` header in the
/// request head, None without one.
pub fn basic_credentials(head: &str) -> Result<Option<(String, String)>, &'static str> {
    let Some(value) = header(head, "authorization") else {
        return Ok(None);
    };
    let Some((scheme, token)) = value.split_once(' ') else {
        return Err("malformed Authorization header");
    };
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err("only Basic authentication is accepted");
    }
    let decoded = B64
        .decode(token.trim())
        .map_err(|_| "malformed Basic credentials")?;
    let text = String::from_utf8(decoded).map_err(|_| "malformed Basic credentials")?;
    let (user, password) = text.split_once(':').ok_or("malformed Basic credentials")?;
    Ok(Some((user.to_string(), password.to_string())))
}

/// Whether `password` is `user`'s: a PLAIN user of any listener, or any
/// of the user's SCRAM credentials.
pub fn verify(user: &str, password: &str, listeners: &[Listener], image: &MetadataImage) -> bool {
    let plain = listeners
        .iter()
        .filter_map(|l| l.plain_users.get(user))
        .any(|expected| constant_time_eq(expected.as_bytes(), password.as_bytes()));
    plain || scram_matches(user, password, &image.scram_credentials)
}

fn scram_matches(
    user: &str,
    password: &str,
    credentials: &BTreeMap<(String, u8), tessera_metadata::ScramCredentialRecord>,
) -> bool {
    credentials
        .range((user.to_string(), 0)..=(user.to_string(), u8::MAX))
        .any(|(_, record)| {
            ScramMechanism::from_kafka_type(record.mechanism as i8).is_some_and(|mechanism| {
                ScramCredential::from_record(record).verify_password(mechanism, password)
            })
        })
}

/// Whether an anonymous client could use this broker's Kafka port: every
/// listener PLAINTEXT.
pub fn anonymous_allowed(listeners: &[Listener]) -> bool {
    listeners
        .iter()
        .all(|l| l.protocol == SecurityProtocol::Plaintext)
}

/// Who is asking, from the request head.
pub fn caller(head: &str, listeners: &[Listener], image: &MetadataImage) -> Caller {
    match basic_credentials(head) {
        Err(reason) => Caller::Unauthenticated(reason),
        Ok(Some((user, password))) => {
            if verify(&user, &password, listeners, image) {
                Caller::Principal(format!("User:{user}"))
            } else {
                Caller::Unauthenticated("invalid username or password")
            }
        }
        Ok(None) if anonymous_allowed(listeners) => Caller::Principal("User:ANONYMOUS".into()),
        Ok(None) => Caller::Unauthenticated("authentication required"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener(protocol: SecurityProtocol, users: &[(&str, &str)]) -> Listener {
        Listener {
            name: "L".into(),
            protocol,
            host: "127.0.0.1".into(),
            port: 0,
            advertised_host: "127.0.0.1".into(),
            advertised_port: 0,
            mechanisms: vec!["PLAIN".into()],
            plain_users: users
                .iter()
                .map(|(u, p)| (u.to_string(), p.to_string()))
                .collect(),
            oauthbearer: Default::default(),
            reauth_ms: Default::default(),
        }
    }

    fn head(authorization: Option<&str>) -> String {
        let mut h = "POST /ranges/split?range=1 HTTP/1.1\r\nHost: x\r\n".to_string();
        if let Some(a) = authorization {
            h.push_str(&format!("Authorization: {a}\r\n"));
        }
        h + "\r\n"
    }

    fn basic(user: &str, password: &str) -> String {
        format!("Basic {}", B64.encode(format!("{user}:{password}")))
    }

    fn image_with_scram(user: &str, password: &str) -> MetadataImage {
        let mut image = MetadataImage::default();
        let m = ScramMechanism::Sha256;
        let record =
            ScramCredential::from_password(m, password, b"salt-salt", 4096).to_record(user, m);
        image
            .scram_credentials
            .insert((user.to_string(), record.mechanism), record);
        image
    }

    #[test]
    fn routes_need_what_kafka_would_ask() {
        assert_eq!(need_of("GET", "/metrics"), Need::Open);
        assert_eq!(need_of("GET", "/health"), Need::Open);
        assert_eq!(need_of("GET", "/ready"), Need::Open);
        assert_eq!(need_of("GET", "/ranges"), Need::Describe);
        assert_eq!(need_of("GET", "/segments"), Need::Describe);
        assert_eq!(need_of("GET", "/balance"), Need::Describe);
        assert_eq!(need_of("POST", "/ranges/split"), Need::Alter);
        assert_eq!(need_of("POST", "/ranges/merge"), Need::Alter);
        assert_eq!(need_of("POST", "/anything"), Need::Alter);
        assert_eq!(need_of("GET", "/"), Need::Authenticated);
        assert_eq!(need_of("GET", "/api/v1/topics"), Need::Authenticated);
        assert_eq!(need_of("POST", "/api/v1/topics"), Need::Authenticated);
    }

    #[test]
    fn plaintext_only_brokers_take_anonymous_callers() {
        let plain = [listener(SecurityProtocol::Plaintext, &[])];
        let image = MetadataImage::default();
        assert_eq!(
            caller(&head(None), &plain, &image),
            Caller::Principal("User:ANONYMOUS".into())
        );
        // Credentials still name the caller (and wrong ones are refused).
        let with_user = [listener(SecurityProtocol::Plaintext, &[("admin", "pw")])];
        assert_eq!(
            caller(&head(Some(&basic("admin", "pw"))), &with_user, &image),
            Caller::Principal("User:admin".into())
        );
        assert!(matches!(
            caller(&head(Some(&basic("admin", "nope"))), &with_user, &image),
            Caller::Unauthenticated(_)
        ));
    }

    #[test]
    fn a_broker_with_sasl_or_ssl_wants_credentials() {
        let image = image_with_scram("scram-user", "s3cret");
        for protocol in [
            SecurityProtocol::SaslPlaintext,
            SecurityProtocol::SaslSsl,
            SecurityProtocol::Ssl,
        ] {
            let listeners = [
                listener(SecurityProtocol::Plaintext, &[]),
                listener(protocol, &[("alice", "alice-secret")]),
            ];
            assert_eq!(
                caller(&head(None), &listeners, &image),
                Caller::Unauthenticated("authentication required"),
                "{protocol:?}"
            );
            assert_eq!(
                caller(
                    &head(Some(&basic("alice", "alice-secret"))),
                    &listeners,
                    &image
                ),
                Caller::Principal("User:alice".into())
            );
            assert_eq!(
                caller(
                    &head(Some(&basic("scram-user", "s3cret"))),
                    &listeners,
                    &image
                ),
                Caller::Principal("User:scram-user".into())
            );
            for wrong in [
                basic("alice", "alice-secre"),
                basic("alice", ""),
                basic("scram-user", "s3cre"),
                basic("nobody", "s3cret"),
                "Bearer abc".to_string(),
                "Basic !!!".to_string(),
                format!("Basic {}", B64.encode("no-colon")),
            ] {
                assert!(
                    matches!(
                        caller(&head(Some(&wrong)), &listeners, &image),
                        Caller::Unauthenticated(_)
                    ),
                    "{wrong}"
                );
            }
        }
    }

    #[test]
    fn the_header_name_is_case_insensitive_and_only_in_headers() {
        let h = "GET /ranges HTTP/1.1\r\nauthorization: Basic YTpi\r\n\r\n";
        assert_eq!(
            basic_credentials(h),
            Ok(Some(("a".to_string(), "b".to_string())))
        );
        // A request line that looks like a header is not one.
        let h = "Authorization: Basic YTpi HTTP/1.1\r\n\r\n";
        assert_eq!(basic_credentials(h), Ok(None));
    }
}
