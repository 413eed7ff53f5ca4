//! SASL authentication of a connection on a SASL listener, as Kafka's
//! `SaslServerAuthenticator` does it: ApiVersions and SaslHandshake first,
//! then the mechanism's tokens in SaslAuthenticate requests (handshake v1)
//! or as raw size-prefixed frames (handshake v0); any other request before
//! authentication closes the connection. Decisions only: the connection
//! (server.rs) does the I/O.

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

use crate::api::encode_response;
use crate::listeners::Listener;
use scram::{ScramCredential, ScramMechanism, ScramServer, ScramStep};

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
    Authenticated { user: String, response: Vec<u8> },
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

    /// Feeds one client token. SCRAM credentials come from the image.
    pub fn step(&mut self, token: &[u8], listener: &Listener, image: &MetadataImage) -> Outcome {
        match self {
            Exchange::Plain => match plain::authenticate(token, &listener.plain_users) {
                Ok(user) => Outcome::Authenticated {
                    user,
                    response: Vec::new(),
                },
                Err(e) => Outcome::Failed {
                    user: plain_user(token),
                    message: e.to_string(),
                },
            },
            // Refused at once (Kafka first sends an error challenge and
            // waits for the client's %x01; clients report the same failure).
            Exchange::OAuthBearer => match oauthbearer::authenticate(
                token,
                &listener.oauthbearer,
                tessera_log::range_log::now_ms(),
            ) {
                Ok(user) => Outcome::Authenticated {
                    user,
                    response: Vec::new(),
                },
                Err(e) => Outcome::Failed {
                    user: oauthbearer::claimed_user(token),
                    message: e.to_string(),
                },
            },
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
                    Ok(ScramStep::Success { user, response }) => {
                        Outcome::Authenticated { user, response }
                    }
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
pub enum State {
    /// Waiting for SaslHandshake (ApiVersions may come first).
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
    },
    Failed {
        user: Option<String>,
        mechanism: String,
        reason: String,
    },
}

/// The authentication of one connection on a SASL listener.
pub struct Authenticator {
    pub state: State,
    /// `User:<name>` once authenticated.
    pub principal: Option<String>,
}

impl Default for Authenticator {
    fn default() -> Self {
        Authenticator {
            state: State::Handshake,
            principal: None,
        }
    }
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

    /// Decides what to do with a frame that arrived before authentication
    /// completed; `event` reports a success or failure.
    pub fn on_frame(
        &mut self,
        frame: &Bytes,
        listener: &Listener,
        image: &MetadataImage,
    ) -> (Action, Option<Event>) {
        match std::mem::replace(&mut self.state, State::Done) {
            State::Done => (Action::Dispatch, None),
            State::RawTokens(mut exchange) => {
                let outcome = exchange.step(frame, listener, image);
                let mechanism = exchange.mechanism();
                match outcome {
                    Outcome::Continue(challenge) => {
                        self.state = State::RawTokens(exchange);
                        (Action::Reply(raw_frame(&challenge)), None)
                    }
                    Outcome::Authenticated { user, response } => {
                        self.principal = Some(format!("User:{user}"));
                        (
                            Action::Reply(raw_frame(&response)),
                            Some(Event::Succeeded { user, mechanism }),
                        )
                    }
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
                        }),
                    ),
                }
            }
            state => self.on_request(state, frame.clone(), listener, image),
        }
    }

    fn on_request(
        &mut self,
        state: State,
        mut frame: Bytes,
        listener: &Listener,
        image: &MetadataImage,
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
                match exchange.step(&request.auth_bytes, listener, image) {
                    Outcome::Continue(challenge) => {
                        self.state = State::Authenticate(exchange);
                        let r = SaslAuthenticateResponse::default()
                            .with_auth_bytes(Bytes::from(challenge));
                        (Action::Reply(encode(&r)), None)
                    }
                    Outcome::Authenticated { user, response } => {
                        self.principal = Some(format!("User:{user}"));
                        let r = SaslAuthenticateResponse::default()
                            .with_auth_bytes(Bytes::from(response));
                        (
                            Action::Reply(encode(&r)),
                            Some(Event::Succeeded { user, mechanism }),
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
                    }),
                )
            }
        }
    }
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

    fn listener(mechanisms: &[&str]) -> Listener {
        Listener {
            name: "SASL_PLAINTEXT".into(),
            protocol: crate::listeners::SecurityProtocol::SaslPlaintext,
            host: "127.0.0.1".into(),
            port: 1,
            advertised_host: "127.0.0.1".into(),
            advertised_port: 1,
            mechanisms: mechanisms.iter().map(|m| m.to_string()).collect(),
            plain_users: BTreeMap::from([("alice".to_string(), "pw".to_string())]),
            oauthbearer: Default::default(),
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
            a.on_frame(&api_versions, &l, &img).0,
            Action::Dispatch
        ));
        let (Action::Reply(r), None) = a.on_frame(&handshake("PLAIN", 1), &l, &img) else {
            panic!()
        };
        let hs: SaslHandshakeResponse = response(ApiKey::SaslHandshake, 1, &r);
        assert_eq!(hs.error_code, 0);
        assert_eq!(hs.mechanisms.len(), 2);
        let (Action::Reply(r), Some(Event::Succeeded { user, .. })) =
            a.on_frame(&authenticate(b"\0alice\0pw", 2), &l, &img)
        else {
            panic!()
        };
        assert_eq!(user, "alice");
        let auth: SaslAuthenticateResponse = response(ApiKey::SaslAuthenticate, 2, &r);
        assert_eq!(auth.error_code, 0);
        assert!(a.is_done());
        assert_eq!(a.principal.as_deref(), Some("User:alice"));

        let mut a = Authenticator::default();
        a.on_frame(&handshake("PLAIN", 1), &l, &img);
        let (Action::Close { reply: Some(r), .. }, Some(Event::Failed { user, .. })) =
            a.on_frame(&authenticate(b"\0alice\0bad", 1), &l, &img)
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
            a.on_frame(&handshake("PLAIN", 1), &l, &img)
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
            a.on_frame(&md, &l, &img).0,
            Action::Close { reply: None, .. }
        ));
        // SaslAuthenticate without a handshake; garbage.
        let mut a = Authenticator::default();
        assert!(matches!(
            a.on_frame(&authenticate(b"x", 1), &l, &img).0,
            Action::Close { .. }
        ));
        let mut a = Authenticator::default();
        assert!(matches!(
            a.on_frame(&Bytes::from_static(b"\xff\xff"), &l, &img).0,
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
            a.on_frame(&handshake("SCRAM-SHA-256", 0), &l, &img).0,
            Action::Reply(_)
        ));
        let bare = "n=bob,r=abc";
        let (Action::Reply(first), None) = a.on_frame(&Bytes::from(format!("n,,{bare}")), &l, &img)
        else {
            panic!()
        };
        let first = String::from_utf8(first[4..].to_vec()).unwrap();
        let (last, expected) =
            scram::client_final_message(ScramMechanism::Sha256, "s3cret", bare, &first).unwrap();
        let (Action::Reply(fin), Some(Event::Succeeded { .. })) =
            a.on_frame(&Bytes::from(last), &l, &img)
        else {
            panic!()
        };
        assert_eq!(&fin[4..], &expected[..]);
        assert_eq!(a.principal.as_deref(), Some("User:bob"));
        // An unknown user over v0: closed without an answer.
        let mut a = Authenticator::default();
        a.on_frame(&handshake("SCRAM-SHA-256", 0), &l, &img);
        assert!(matches!(
            a.on_frame(&Bytes::from_static(b"n,,n=eve,r=x"), &l, &img),
            (
                Action::Close { reply: None, .. },
                Some(Event::Failed { .. })
            )
        ));
    }
}
