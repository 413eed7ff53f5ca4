//! A request as its handler sees it (Kafka's `RequestContext`): the
//! request header and the connection it arrived on (listener, principal,
//! peer address, quota mute). The dispatch layer builds one per request and
//! passes it to the handler, which hands it on to authorization
//! (`authz.rs`), quotas and the group handlers; below `api` so that none of
//! those reach up into the dispatch layer for it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::RequestHeader;
use parking_lot::Mutex;

use crate::listeners::Listener;

/// The connection a request arrived on: its listener and, once a SASL
/// listener authenticated it, its principal (`User:<name>`).
#[derive(Clone, Debug)]
pub struct Connection {
    pub listener: Arc<Listener>,
    pub principal: Option<Arc<str>>,
    /// The client's address (ACL host matching).
    pub peer: Option<std::net::SocketAddr>,
    /// The connection's quota mute (KIP-219), set by throttled responses.
    pub throttle: Arc<ConnectionThrottle>,
}

/// One request: its header and the connection it came on. A request the
/// broker makes of itself (a coordinator replaying its partition through
/// the Fetch path) has no connection: it is trusted, on no listener.
#[derive(Clone, Debug)]
pub struct RequestContext {
    pub header: RequestHeader,
    pub connection: Option<Connection>,
}

impl RequestContext {
    pub fn new(header: RequestHeader, connection: Option<Connection>) -> Self {
        RequestContext { header, connection }
    }

    /// A request the broker makes of itself.
    pub fn internal(header: RequestHeader) -> Self {
        RequestContext {
            header,
            connection: None,
        }
    }

    /// The request's version.
    pub fn version(&self) -> i16 {
        self.header.request_api_version
    }

    /// The listener the request arrived on.
    pub fn listener(&self) -> Option<&Arc<Listener>> {
        self.connection.as_ref().map(|c| &c.listener)
    }

    /// The authenticated principal, if the listener authenticates.
    pub fn principal(&self) -> Option<&Arc<str>> {
        self.connection.as_ref().and_then(|c| c.principal.as_ref())
    }

    /// Kafka's form of the client's address (`/127.0.0.1`), for group
    /// members.
    pub fn client_host(&self) -> String {
        match self.connection.as_ref().and_then(|c| c.peer) {
            Some(p) => format!("/{}", p.ip()),
            None => "/0.0.0.0".to_string(),
        }
    }

    /// The client id of the request header ("" when null).
    pub fn client_id(&self) -> String {
        self.header
            .client_id
            .as_ref()
            .map(|c| c.to_string())
            .unwrap_or_default()
    }

    /// The connection's quota mute (none for an internal request).
    pub fn throttle(&self) -> Option<Arc<ConnectionThrottle>> {
        self.connection.as_ref().map(|c| c.throttle.clone())
    }

    /// Mutes the connection for `ms` from now (KIP-219; no-op for an
    /// internal request).
    pub fn mute_for(&self, ms: u64) {
        if let Some(c) = &self.connection {
            c.throttle.mute_for(ms);
        }
    }
}

/// A connection's mute (KIP-219): until when the connection reads no
/// further request.
#[derive(Debug, Default)]
pub struct ConnectionThrottle {
    until: Mutex<Option<Instant>>,
}

impl ConnectionThrottle {
    /// Mutes the connection for `ms` from now (a longer mute already set
    /// stays).
    pub fn mute_for(&self, ms: u64) {
        if ms == 0 {
            return;
        }
        let until = Instant::now() + Duration::from_millis(ms);
        let mut current = self.until.lock();
        if current.is_none_or(|c| c < until) {
            *current = Some(until);
        }
    }

    /// The end of the mute, if the connection is muted now.
    pub fn muted_until(&self) -> Option<Instant> {
        let mut current = self.until.lock();
        match *current {
            Some(t) if t > Instant::now() => Some(t),
            _ => {
                *current = None;
                None
            }
        }
    }
}
