//! SASL authentication of a connection on a SASL listener, as Kafka's
//! `SaslServerAuthenticator` does it: ApiVersions and SaslHandshake first,
//! then the mechanism's tokens in SaslAuthenticate requests (handshake v1)
//! or as raw size-prefixed frames (handshake v0); any other request before
//! authentication closes the connection. Decisions only: the connection
//! (server.rs) does the I/O.
//!
//! Re-authentication (KIP-368): a session may have a lifetime (the
//! listener's `connections.max.reauth.ms`, bounded by an OAUTHBEARER
//! token's `exp`), told to the client in SaslAuthenticate v1+'s
//! `session_lifetime_ms`. A client that authenticated with v1+ may send
//! SaslHandshake again on the authenticated connection (at most once a
//! second) and run the same mechanism for the same principal; a request
//! other than that after the session expired closes the connection. A
//! session without a lifetime cannot re-authenticate (its handshake gets
//! ILLEGAL_SASL_STATE, as in Kafka).

pub mod client;
pub mod credentials;
pub mod oauthbearer;
pub mod plain;
pub mod scram;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    ApiKey, RequestHeader, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Decodable, StrBytes};
use tessera_metadata::MetadataImage;

use crate::listeners::Listener;
use crate::wire::encode_response;
use scram::{ScramCredential, ScramMechanism, ScramServer, ScramStep};

/// Equality of two secrets in time that depends on their length only (no
/// early exit on the first differing byte): every password and key check.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One mechanism's exchange in progress.
pub enum Exchange {
    Plain,
    Scram(Box<ScramServer>),
    OAuthBearer,
}

/// The outcome of one client token.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Send this challenge; more tokens follow.
    Continue(Vec<u8>),
    /// Authenticated as `user`; send `response` (may be empty).
    /// `expires_ms`: when the credential itself expires (OAUTHBEARER's `exp`).
    Authenticated {
        user: String,
        response: Vec<u8>,
        expires_ms: Option<i64>,
    },
    /// Refused, with the message the client is told (and the log gets).
    Failed {
        user: Option<String>,
        message: String,
    },
}

impl Exchange {
    /// Starts `mechanism` if it is enabled on the listener.
    pub fn start(listener: &Listener, mechanism: &str) -> Option<Exchange> {
        if !listener.mechanism_enabled(mechanism) {
            return None;
        }
        if mechanism == "PLAIN" {
            return Some(Exchange::Plain);
        }
        if mechanism == "OAUTHBEARER" {
            return Some(Exchange::OAuthBearer);
        }
        ScramMechanism::from_name(mechanism)
            .map(|m| Exchange::Scram(Box::new(ScramServer::new(m, scram::fresh_nonce()))))
    }

    pub fn mechanism(&self) -> &'static str {
        match self {
            Exchange::Plain => "PLAIN",
            Exchange::Scram(s) => s.mechanism().name(),
            Exchange::OAuthBearer => "OAUTHBEARER",
        }
    }

    /// Feeds one client token at `now_ms`. SCRAM credentials come from the image.
    pub fn step(
        &mut self,
        token: &[u8],
        listener: &Listener,
        image: &MetadataImage,
        now_ms: i64,
    ) -> Outcome {
        match self {
            Exchange::Plain => match plain::authenticate(token, &listener.plain_users) {
                Ok(user) => Outcome::Authenticated {
                    user,
                    response: Vec::new(),
                    expires_ms: None,
                },
                Err(e) => Outcome::Failed {
                    user: plain_user(token),
                    message: e.to_string(),
                },
            },
            // Refused at once (Kafka first sends an error challenge and
            // waits for the client's %x01; clients report the same failure).
            Exchange::OAuthBearer => {
                match oauthbearer::authenticate(token, &listener.oauthbearer, now_ms) {
                    Ok(token) => Outcome::Authenticated {
                        user: token.user,
                        response: Vec::new(),
                        expires_ms: Some(token.expires_ms),
                    },
                    Err(e) => Outcome::Failed {
                        user: oauthbearer::claimed_user(token),
                        message: e.to_string(),
                    },
                }
            }
            Exchange::Scram(server) => {
                let mechanism = server.mechanism();
                let lookup = |user: &str| {
                    image
                        .scram_credentials
                        .get(&(user.to_string(), mechanism.kafka_type() as u8))
                        .map(ScramCredential::from_record)
                };
                let user_before = server.user().map(str::to_string);
                match server.step(token, lookup) {
                    Ok(ScramStep::Challenge(c)) => Outcome::Continue(c),
                    Ok(ScramStep::Success { user, response }) => Outcome::Authenticated {
                        user,
                        response,
                        expires_ms: None,
                    },
                    Err(e) => Outcome::Failed {
                        user: user_before.or_else(|| scram_user(token)),
                        message: match e {
                            scram::ScramError::Proof => format!(
                                "Authentication failed during authentication due to invalid credentials with SASL mechanism {}",
                                mechanism.name()
                            ),
                            other => other.to_string(),
                        },
                    },
                }
            }
        }
    }
}

/// The user a PLAIN token names, for the log.
fn plain_user(token: &[u8]) -> Option<String> {
    token
        .split(|b| *b == 0)
        .nth(1)
        .map(|u| String::from_utf8_lossy(u).into_owned())
}

/// The user a SCRAM client-first message names, for the log.
fn scram_user(token: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(token).ok()?;
    text.split(',')
        .find_map(|f| f.strip_prefix("n="))
        .map(str::to_string)
}

/// Where a connection on a SASL listener is in authentication.
#[derive(Default)]
pub enum State {
    /// Waiting for SaslHandshake (ApiVersions may come first).
    #[default]
    Handshake,
    /// After a v1 handshake: tokens arrive in SaslAuthenticate requests.
    Authenticate(Exchange),
    /// After a v0 handshake: tokens arrive as raw frames.
    RawTokens(Exchange),
    /// Authenticated: requests are served.
    Done,
}

/// What the connection does with a frame.
#[derive(Debug)]
pub enum Action {
    /// Serve it as usual (authenticated, ApiVersions, or no SASL).
    Dispatch,
    /// Write this frame (size prefix included) and read the next.
    Reply(Bytes),
    /// Write this frame, if any, then close.
    Close {
        reply: Option<Bytes>,
        reason: String,
    },
}

/// An authentication event, for metrics and the log.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    Succeeded {
        user: String,
        mechanism: &'static str,
        /// A re-authentication of an authenticated connection (KIP-368).
        reauthentication: bool,
    },
    Failed {
        user: Option<String>,
        mechanism: String,
        reason: String,
        reauthentication: bool,
    },
    /// A request came after the session's lifetime without a
    /// re-authentication: the connection is closed.
    SessionExpired { principal: String },
}

/// The authentication of one connection on a SASL listener.
#[derive(Default)]
pub struct Authenticator {
    pub state: State,
    /// `User:<name>` once authenticated.
    pub principal: Option<String>,
    /// When the session ends (ms since the epoch), if it has a lifetime.
    pub session_expires_ms: Option<i64>,
    /// The mechanism the session authenticated with (re-authentication
    /// must use it again).
    mechanism: Option<&'static str>,
    /// The client sent SaslAuthenticate v1 or later: it knows KIP-368 and
    /// may re-authenticate.
    can_reauthenticate: bool,
    /// A re-authentication is under way.
    reauthenticating: bool,
    /// When the last re-authentication began (at most one a second).
    last_reauth_start_ms: Option<i64>,
    /// A re-authentication asked for another mechanism: its token is
    /// refused with this message (Kafka's REAUTH_BAD_MECHANISM).
    bad_mechanism: Option<String>,
}

fn raw_frame(bytes: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(4 + bytes.len());
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
    Bytes::from(out)
}

impl Authenticator {
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Decides what to do with a frame at `now_ms` (ms since the epoch):
    /// before authentication, the exchange; after it, a re-authentication
    /// or the session's expiry. `event` reports a success or failure.
    pub fn on_frame(
        &mut self,
        frame: &Bytes,
        listener: &Listener,
        image: &MetadataImage,
        now_ms: i64,
    ) -> (Action, Option<Event>) {
        match std::mem::replace(&mut self.state, State::Done) {
            State::Done => {
                // Kafka's `maybeBeginServerReauthentication`: only a session
                // with a lifetime, from a client that knows KIP-368, at most
                // once a second; otherwise the handshake is served as a
                // request (ILLEGAL_SASL_STATE).
                let may_reauthenticate = self.can_reauthenticate
                    && self.session_expires_ms.is_some()
                    && self
                        .last_reauth_start_ms
                        .is_none_or(|last| now_ms - last >= 1_000);
                if may_reauthenticate && starts_reauthentication(frame) {
                    self.reauthenticating = true;
                    self.last_reauth_start_ms = Some(now_ms);
                    return self.on_request(
                        State::Handshake,
                        frame.clone(),
                        listener,
                        image,
                        now_ms,
                    );
                }
                match self.session_expires_ms {
                    Some(expires) if now_ms >= expires => {
                        let principal = self.principal.clone().unwrap_or_default();
                        (
                            Action::Close {
                                reply: None,
                                reason: format!(
                                    "the SASL session of {principal} expired {} ms ago without re-authentication",
                                    now_ms - expires
                                ),
                            },
                            Some(Event::SessionExpired { principal }),
                        )
                    }
                    _ => (Action::Dispatch, None),
                }
            }
            State::RawTokens(mut exchange) => {
                let outcome = exchange.step(frame, listener, image, now_ms);
                let mechanism = exchange.mechanism();
                let outcome = self.complete(outcome, mechanism, listener, now_ms).0;
                match outcome {
                    Outcome::Continue(challenge) => {
                        self.state = State::RawTokens(exchange);
                        (Action::Reply(raw_frame(&challenge)), None)
                    }
                    Outcome::Authenticated { user, response, .. } => (
                        Action::Reply(raw_frame(&response)),
                        Some(Event::Succeeded {
                            user,
                            mechanism,
                            reauthentication: false,
                        }),
                    ),
                    // v0 has no way to carry an error: the connection closes.
                    Outcome::Failed { user, message } => (
                        Action::Close {
                            reply: None,
                            reason: message.clone(),
                        },
                        Some(Event::Failed {
                            user,
                            mechanism: mechanism.to_string(),
                            reason: message,
                            reauthentication: false,
                        }),
                    ),
                }
            }
            state => self.on_request(state, frame.clone(), listener, image, now_ms),
        }
    }

    /// Settles an exchange's outcome: on success the principal and the
    /// session's lifetime (Kafka's `calcCompletionTimesAndReturnSessionLifetimeMs`:
    /// the listener's `connections.max.reauth.ms`, bounded by the
    /// credential's own expiry); a re-authentication that names another
    /// principal fails. Returns the lifetime told to the client (0: none).
    fn complete(
        &mut self,
        outcome: Outcome,
        mechanism: &'static str,
        listener: &Listener,
        now_ms: i64,
    ) -> (Outcome, i64) {
        let Outcome::Authenticated {
            user,
            response,
            expires_ms,
        } = outcome
        else {
            return (outcome, 0);
        };
        let principal = format!("User:{user}");
        if self.reauthenticating {
            if let Some(previous) = self.principal.as_deref().filter(|p| *p != principal) {
                let dotted = |p: &str| p.replacen(':', ".", 1);
                return (
                    Outcome::Failed {
                        user: Some(user),
                        message: format!(
                            "Cannot change principals during re-authentication from {}: {}",
                            dotted(previous),
                            dotted(&principal)
                        ),
                    },
                    0,
                );
            }
        }
        let lifetime = match (expires_ms, listener.max_reauth_ms(mechanism)) {
            (None, None) => None,
            (None, Some(max)) => Some(max),
            (Some(expires), None) => Some((expires - now_ms).max(0)),
            (Some(expires), Some(max)) => Some((expires - now_ms).min(max).max(0)),
        };
        self.session_expires_ms = lifetime.map(|l| now_ms + l);
        self.principal = Some(principal);
        self.mechanism = Some(mechanism);
        self.reauthenticating = false;
        (
            Outcome::Authenticated {
                user,
                response,
                expires_ms,
            },
            lifetime.unwrap_or(0),
        )
    }

    fn on_request(
        &mut self,
        state: State,
        mut frame: Bytes,
        listener: &Listener,
        image: &MetadataImage,
        now_ms: i64,
    ) -> (Action, Option<Event>) {
        let close = |reason: String| {
            (
                Action::Close {
                    reply: None,
                    reason,
                },
                None,
            )
        };
        if frame.len() < 8 {
            return close("request shorter than a request header".into());
        }
        let api_key = i16::from_be_bytes([frame[0], frame[1]]);
        let version = i16::from_be_bytes([frame[2], frame[3]]);
        let api = ApiKey::try_from(api_key).ok();
        match (&state, api) {
            // ApiVersions is served before the handshake (KIP-35/KIP-43).
            (State::Handshake, Some(ApiKey::ApiVersions)) => {
                self.state = state;
                (Action::Dispatch, None)
            }
            (State::Handshake, Some(ApiKey::SaslHandshake)) if (0..=1).contains(&version) => {
                let Some((header, request)) =
                    decode::<SaslHandshakeRequest>(&mut frame, ApiKey::SaslHandshake, version)
                else {
                    return close("malformed SaslHandshake request".into());
                };
                let mechanism = request.mechanism.to_string();
                let mechanisms = listener
                    .mechanisms
                    .iter()
                    .map(|m| StrBytes::from_string(m.clone()))
                    .collect();
                let mut response = SaslHandshakeResponse::default().with_mechanisms(mechanisms);
                match Exchange::start(listener, &mechanism) {
                    Some(exchange) => {
                        if let Some(previous) = self
                            .mechanism
                            .filter(|p| self.reauthenticating && *p != mechanism)
                        {
                            self.bad_mechanism = Some(format!(
                                "SASL mechanism '{mechanism}' requested by client is not supported for re-authentication of mechanism '{previous}'"
                            ));
                        }
                        self.state = if version == 0 {
                            State::RawTokens(exchange)
                        } else {
                            State::Authenticate(exchange)
                        };
                        let reply = encode_response(
                            ApiKey::SaslHandshake,
                            version,
                            header.correlation_id,
                            &response,
                        );
                        (Action::Reply(reply), None)
                    }
                    None => {
                        response.error_code = ResponseError::UnsupportedSaslMechanism.code();
                        let reply = encode_response(
                            ApiKey::SaslHandshake,
                            version,
                            header.correlation_id,
                            &response,
                        );
                        let reason = format!(
                            "Unsupported SASL mechanism {mechanism} (enabled: {})",
                            listener.mechanisms.join(", ")
                        );
                        (
                            Action::Close {
                                reply: Some(reply),
                                reason: reason.clone(),
                            },
                            Some(Event::Failed {
                                user: None,
                                mechanism,
                                reason,
                                reauthentication: self.reauthenticating,
                            }),
                        )
                    }
                }
            }
            (State::Authenticate(_), Some(ApiKey::SaslAuthenticate))
                if (0..=2).contains(&version) =>
            {
                let State::Authenticate(mut exchange) = state else {
                    unreachable!()
                };
                let Some((header, request)) = decode::<SaslAuthenticateRequest>(
                    &mut frame,
                    ApiKey::SaslAuthenticate,
                    version,
                ) else {
                    return close("malformed SaslAuthenticate request".into());
                };
                let mechanism = exchange.mechanism();
                let encode = |r: &SaslAuthenticateResponse| {
                    encode_response(ApiKey::SaslAuthenticate, version, header.correlation_id, r)
                };
                self.can_reauthenticate |= version > 0;
                let reauthentication = self.reauthenticating;
                let outcome = match self.bad_mechanism.take() {
                    Some(message) => Outcome::Failed {
                        user: None,
                        message,
                    },
                    None => exchange.step(&request.auth_bytes, listener, image, now_ms),
                };
                let (outcome, lifetime_ms) = self.complete(outcome, mechanism, listener, now_ms);
                match outcome {
                    Outcome::Continue(challenge) => {
                        self.state = State::Authenticate(exchange);
                        let r = SaslAuthenticateResponse::default()
                            .with_auth_bytes(Bytes::from(challenge));
                        (Action::Reply(encode(&r)), None)
                    }
                    Outcome::Authenticated { user, response, .. } => {
                        let r = SaslAuthenticateResponse::default()
                            .with_auth_bytes(Bytes::from(response))
                            .with_session_lifetime_ms(lifetime_ms);
                        (
                            Action::Reply(encode(&r)),
                            Some(Event::Succeeded {
                                user,
                                mechanism,
                                reauthentication,
                            }),
                        )
                    }
                    Outcome::Failed { user, message } => {
                        let r = SaslAuthenticateResponse::default()
                            .with_error_code(ResponseError::SaslAuthenticationFailed.code())
                            .with_error_message(Some(StrBytes::from_string(message.clone())));
                        (
                            Action::Close {
                                reply: Some(encode(&r)),
                                reason: message.clone(),
                            },
                            Some(Event::Failed {
                                user,
                                mechanism: mechanism.to_string(),
                                reason: message,
                                reauthentication,
                            }),
                        )
                    }
                }
            }
            (_, api) => {
                let what = api.map_or_else(|| format!("API key {api_key}"), |a| format!("{a:?}"));
                let reason = format!(
                    "Unexpected Kafka request of type {what} v{version} during SASL handshake"
                );
                (
                    Action::Close {
                        reply: None,
                        reason: reason.clone(),
                    },
                    Some(Event::Failed {
                        user: None,
                        mechanism: match &state {
                            State::Authenticate(e) | State::RawTokens(e) => e.mechanism().into(),
                            _ => String::new(),
                        },
                        reason,
                        reauthentication: self.reauthenticating,
                    }),
                )
            }
        }
    }
}

/// Is `frame` a SaslHandshake v1+ (how a KIP-368 client starts re-authenticating)?
fn starts_reauthentication(frame: &[u8]) -> bool {
    frame.len() >= 4
        && i16::from_be_bytes([frame[0], frame[1]]) == ApiKey::SaslHandshake as i16
        && i16::from_be_bytes([frame[2], frame[3]]) >= 1
}

fn decode<R: Decodable>(
    frame: &mut Bytes,
    api: ApiKey,
    version: i16,
) -> Option<(RequestHeader, R)> {
    let header = RequestHeader::decode(frame, api.request_header_version(version)).ok()?;
    let request = R::decode(frame, version).ok()?;
    Some((header, request))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::messages::{ResponseHeader, SaslAuthenticateResponse};
    use kafka_protocol::protocol::Encodable;
    use std::collections::BTreeMap;

    const NOW: i64 = 1_800_000_000_000;

    fn listener(mechanisms: &[&str]) -> Listener {
        Listener {
            name: "SASL_PLAINTEXT".into(),
            protocol: crate::listeners::SecurityProtocol::SaslPlaintext,
            host: "127.0.0.1".into(),
            port: 1,
            advertised_host: "127.0.0.1".into(),
            advertised_port: 1,
            mechanisms: mechanisms.iter().map(|m| m.to_string()).collect(),
            plain_users: BTreeMap::from([
                ("alice".to_string(), "pw".to_string()),
                ("bob".to_string(), "pw2".to_string()),
            ]),
            oauthbearer: Default::default(),
            reauth_ms: BTreeMap::new(),
        }
    }

    fn request<R: Encodable>(api: ApiKey, version: i16, body: &R) -> Bytes {
        let mut buf = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(api as i16)
            .with_request_api_version(version)
            .with_correlation_id(7)
            .encode(&mut buf, api.request_header_version(version))
            .unwrap();
        body.encode(&mut buf, version).unwrap();
        buf.freeze()
    }

    fn handshake(m: &str, version: i16) -> Bytes {
        request(
            ApiKey::SaslHandshake,
            version,
            &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_string(m.into())),
        )
    }

    fn authenticate(token: &[u8], version: i16) -> Bytes {
        request(
            ApiKey::SaslAuthenticate,
            version,
            &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::copy_from_slice(token)),
        )
    }

    fn response<R: Decodable>(api: ApiKey, version: i16, frame: &Bytes) -> R {
        let mut b = frame.slice(4..);
        ResponseHeader::decode(&mut b, api.response_header_version(version)).unwrap();
        R::decode(&mut b, version).unwrap()
    }

    #[test]
    fn plain_v1_success_and_failure() {
        let l = listener(&["PLAIN", "SCRAM-SHA-256"]);
        let img = MetadataImage::default();
        let mut a = Authenticator::default();
        let api_versions = request(
            ApiKey::ApiVersions,
            3,
            &kafka_protocol::messages::ApiVersionsRequest::default(),
        );
        assert!(matches!(
            a.on_frame(&api_versions, &l, &img, NOW).0,
            Action::Dispatch
        ));
        let (Action::Reply(r), None) = a.on_frame(&handshake("PLAIN", 1), &l, &img, NOW) else {
            panic!()
        };
        let hs: SaslHandshakeResponse = response(ApiKey::SaslHandshake, 1, &r);
        assert_eq!(hs.error_code, 0);
        assert_eq!(hs.mechanisms.len(), 2);
        let (Action::Reply(r), Some(Event::Succeeded { user, .. })) =
            a.on_frame(&authenticate(b"\0alice\0pw", 2), &l, &img, NOW)
        else {
            panic!()
        };
        assert_eq!(user, "alice");
        let auth: SaslAuthenticateResponse = response(ApiKey::SaslAuthenticate, 2, &r);
        assert_eq!(auth.error_code, 0);
        assert!(a.is_done());
        assert_eq!(a.principal.as_deref(), Some("User:alice"));

        let mut a = Authenticator::default();
        a.on_frame(&handshake("PLAIN", 1), &l, &img, NOW);
        let (Action::Close { reply: Some(r), .. }, Some(Event::Failed { user, .. })) =
            a.on_frame(&authenticate(b"\0alice\0bad", 1), &l, &img, NOW)
        else {
            panic!()
        };
        assert_eq!(user.as_deref(), Some("alice"));
        let auth: SaslAuthenticateResponse = response(ApiKey::SaslAuthenticate, 1, &r);
        assert_eq!(
            auth.error_code,
            ResponseError::SaslAuthenticationFailed.code()
        );
        assert_eq!(
            auth.error_message.unwrap().as_str(),
            "Authentication failed: Invalid username or password"
        );
    }

    #[test]
    fn disabled_mechanism_and_early_requests_close() {
        let l = listener(&["SCRAM-SHA-512"]);
        let img = MetadataImage::default();
        let mut a = Authenticator::default();
        let (Action::Close { reply: Some(r), .. }, Some(Event::Failed { .. })) =
            a.on_frame(&handshake("PLAIN", 1), &l, &img, NOW)
        else {
            panic!()
        };
        let hs: SaslHandshakeResponse = response(ApiKey::SaslHandshake, 1, &r);
        assert_eq!(
            hs.error_code,
            ResponseError::UnsupportedSaslMechanism.code()
        );
        assert_eq!(
            hs.mechanisms,
            vec![StrBytes::from_static_str("SCRAM-SHA-512")]
        );
        // Metadata before authentication.
        let mut a = Authenticator::default();
        let md = request(
            ApiKey::Metadata,
            9,
            &kafka_protocol::messages::MetadataRequest::default(),
        );
        assert!(matches!(
            a.on_frame(&md, &l, &img, NOW).0,
            Action::Close { reply: None, .. }
        ));
        // SaslAuthenticate without a handshake; garbage.
        let mut a = Authenticator::default();
        assert!(matches!(
            a.on_frame(&authenticate(b"x", 1), &l, &img, NOW).0,
            Action::Close { .. }
        ));
        let mut a = Authenticator::default();
        assert!(matches!(
            a.on_frame(&Bytes::from_static(b"\xff\xff"), &l, &img, NOW)
                .0,
            Action::Close { .. }
        ));
    }

    #[test]
    fn scram_over_v0_raw_tokens() {
        let l = listener(&["SCRAM-SHA-256"]);
        let mut img = MetadataImage::default();
        let cred = ScramCredential::from_password(ScramMechanism::Sha256, "s3cret", b"salt", 4096);
        img.scram_credentials.insert(
            ("bob".into(), 1),
            cred.to_record("bob", ScramMechanism::Sha256),
        );
        let mut a = Authenticator::default();
        assert!(matches!(
            a.on_frame(&handshake("SCRAM-SHA-256", 0), &l, &img, NOW).0,
            Action::Reply(_)
        ));
        let bare = "n=bob,r=abc";
        let (Action::Reply(first), None) =
            a.on_frame(&Bytes::from(format!("n,,{bare}")), &l, &img, NOW)
        else {
            panic!()
        };
        let first = String::from_utf8(first[4..].to_vec()).unwrap();
        let (last, expected) =
            scram::client_final_message(ScramMechanism::Sha256, "s3cret", bare, &first).unwrap();
        let (Action::Reply(fin), Some(Event::Succeeded { .. })) =
            a.on_frame(&Bytes::from(last), &l, &img, NOW)
        else {
            panic!()
        };
        assert_eq!(&fin[4..], &expected[..]);
        assert_eq!(a.principal.as_deref(), Some("User:bob"));
        // An unknown user over v0: closed without an answer.
        let mut a = Authenticator::default();
        a.on_frame(&handshake("SCRAM-SHA-256", 0), &l, &img, NOW);
        assert!(matches!(
            a.on_frame(&Bytes::from_static(b"n,,n=eve,r=x"), &l, &img, NOW),
            (
                Action::Close { reply: None, .. },
                Some(Event::Failed { .. })
            )
        ));
    }

    fn with_reauth(mut l: Listener, mechanism: &str, ms: i64) -> Listener {
        l.reauth_ms.insert(mechanism.to_string(), ms);
        l
    }

    fn metadata() -> Bytes {
        request(
            ApiKey::Metadata,
            9,
            &kafka_protocol::messages::MetadataRequest::default(),
        )
    }

    /// Handshake v1 + SaslAuthenticate v2 with `token`, at `now`.
    fn login(
        a: &mut Authenticator,
        l: &Listener,
        m: &str,
        token: &[u8],
        now: i64,
    ) -> (SaslAuthenticateResponse, Option<Event>) {
        let img = MetadataImage::default();
        let (Action::Reply(_), None) = a.on_frame(&handshake(m, 1), l, &img, now) else {
            panic!("handshake refused")
        };
        let (action, event) = a.on_frame(&authenticate(token, 2), l, &img, now);
        let (Action::Reply(r) | Action::Close { reply: Some(r), .. }) = action else {
            panic!("no SaslAuthenticate answer: {action:?}")
        };
        (response(ApiKey::SaslAuthenticate, 2, &r), event)
    }

    #[test]
    fn session_lifetime_expiry_and_reauthentication() {
        let l = with_reauth(listener(&["PLAIN"]), "PLAIN", 1_000);
        let img = MetadataImage::default();
        let mut a = Authenticator::default();
        let (r, event) = login(&mut a, &l, "PLAIN", b"\0alice\0pw", NOW);
        assert_eq!((r.error_code, r.session_lifetime_ms), (0, 1_000));
        assert!(matches!(
            event,
            Some(Event::Succeeded {
                reauthentication: false,
                ..
            })
        ));
        assert_eq!(a.session_expires_ms, Some(NOW + 1_000));
        assert!(matches!(
            a.on_frame(&metadata(), &l, &img, NOW + 999).0,
            Action::Dispatch
        ));
        // Re-authentication before expiry renews the session.
        let (r, event) = login(&mut a, &l, "PLAIN", b"\0alice\0pw", NOW + 900);
        assert_eq!((r.error_code, r.session_lifetime_ms), (0, 1_000));
        assert!(matches!(
            event,
            Some(Event::Succeeded {
                reauthentication: true,
                ..
            })
        ));
        assert!(a.is_done());
        assert!(matches!(
            a.on_frame(&metadata(), &l, &img, NOW + 1_500).0,
            Action::Dispatch
        ));
        // A request after expiry closes the connection.
        let (action, event) = a.on_frame(&metadata(), &l, &img, NOW + 1_900);
        assert!(matches!(action, Action::Close { reply: None, .. }));
        assert_eq!(
            event,
            Some(Event::SessionExpired {
                principal: "User:alice".into()
            })
        );
        // Without a lifetime nothing expires and the answer says 0.
        let l = listener(&["PLAIN"]);
        let mut a = Authenticator::default();
        let (r, _) = login(&mut a, &l, "PLAIN", b"\0alice\0pw", NOW);
        assert_eq!(r.session_lifetime_ms, 0);
        assert!(matches!(
            a.on_frame(&metadata(), &l, &img, NOW + 10_000_000).0,
            Action::Dispatch
        ));
    }

    #[test]
    fn reauthentication_keeps_principal_and_mechanism() {
        let l = with_reauth(listener(&["PLAIN", "SCRAM-SHA-256"]), "PLAIN", 1_000);
        let mut a = Authenticator::default();
        login(&mut a, &l, "PLAIN", b"\0alice\0pw", NOW);
        let (r, event) = login(&mut a, &l, "PLAIN", b"\0bob\0pw2", NOW + 10);
        assert_eq!(r.error_code, ResponseError::SaslAuthenticationFailed.code());
        assert_eq!(
            r.error_message.unwrap().as_str(),
            "Cannot change principals during re-authentication from User.alice: User.bob"
        );
        assert!(matches!(
            event,
            Some(Event::Failed {
                reauthentication: true,
                ..
            })
        ));

        let mut a = Authenticator::default();
        login(&mut a, &l, "PLAIN", b"\0alice\0pw", NOW);
        let (r, event) = login(&mut a, &l, "SCRAM-SHA-256", b"n,,n=alice,r=x", NOW + 10);
        assert_eq!(r.error_code, ResponseError::SaslAuthenticationFailed.code());
        assert!(r
            .error_message
            .unwrap()
            .contains("not supported for re-authentication of mechanism 'PLAIN'"));
        assert!(matches!(
            event,
            Some(Event::Failed {
                reauthentication: true,
                ..
            })
        ));
    }

    #[test]
    fn a_v0_client_cannot_reauthenticate_and_is_closed_at_expiry() {
        let l = with_reauth(listener(&["PLAIN"]), "PLAIN", 1_000);
        let img = MetadataImage::default();
        let mut a = Authenticator::default();
        a.on_frame(&handshake("PLAIN", 1), &l, &img, NOW);
        let (Action::Reply(_), Some(Event::Succeeded { .. })) =
            a.on_frame(&authenticate(b"\0alice\0pw", 0), &l, &img, NOW)
        else {
            panic!()
        };
        // Its SaslHandshake goes to the handler (ILLEGAL_SASL_STATE) ...
        assert!(matches!(
            a.on_frame(&handshake("PLAIN", 1), &l, &img, NOW + 1).0,
            Action::Dispatch
        ));
        // ... and the session still ends.
        assert!(matches!(
            a.on_frame(&metadata(), &l, &img, NOW + 1_000),
            (Action::Close { .. }, Some(Event::SessionExpired { .. }))
        ));
    }

    #[test]
    fn an_oauthbearer_token_bounds_the_session() {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let exp_s = NOW / 1000 + 30;
        let jwt = format!(
            "{}.{}.",
            b64(r#"{"alg":"none"}"#),
            b64(&format!(r#"{{"sub":"carol","exp":{exp_s}}}"#))
        );
        let token = format!("n,,\x01auth=Bearer {jwt}\x01\x01");
        // No connections.max.reauth.ms: the token's exp alone.
        let l = listener(&["OAUTHBEARER"]);
        let mut a = Authenticator::default();
        let (r, _) = login(&mut a, &l, "OAUTHBEARER", token.as_bytes(), NOW);
        assert_eq!((r.error_code, r.session_lifetime_ms), (0, 30_000));
        // The smaller of the two.
        let l = with_reauth(listener(&["OAUTHBEARER"]), "OAUTHBEARER", 10_000);
        let mut a = Authenticator::default();
        let (r, _) = login(&mut a, &l, "OAUTHBEARER", token.as_bytes(), NOW);
        assert_eq!(r.session_lifetime_ms, 10_000);
    }

    #[test]
    fn reauthentication_needs_a_lifetime_and_a_second_between_starts() {
        let img = MetadataImage::default();
        // No lifetime: a second handshake is a request like any other.
        let l = listener(&["PLAIN"]);
        let mut a = Authenticator::default();
        login(&mut a, &l, "PLAIN", b"\0alice\0pw", NOW);
        assert!(matches!(
            a.on_frame(&handshake("PLAIN", 1), &l, &img, NOW + 5).0,
            Action::Dispatch
        ));
        // With one: the first starts at once, the next only a second later.
        let l = with_reauth(listener(&["PLAIN"]), "PLAIN", 60_000);
        let mut a = Authenticator::default();
        login(&mut a, &l, "PLAIN", b"\0alice\0pw", NOW);
        login(&mut a, &l, "PLAIN", b"\0alice\0pw", NOW + 5);
        assert!(matches!(
            a.on_frame(&handshake("PLAIN", 1), &l, &img, NOW + 500).0,
            Action::Dispatch
        ));
        let (r, event) = login(&mut a, &l, "PLAIN", b"\0alice\0pw", NOW + 1_005);
        assert_eq!(r.error_code, 0);
        assert!(matches!(
            event,
            Some(Event::Succeeded {
                reauthentication: true,
                ..
            })
        ));
    }
}
