//! The connection a request arrived on, as the handlers see it (Kafka's
//! `RequestContext`): listener, principal, peer address and quota mute.
//! Set by the connection (`server.rs`) around each request as task-locals
//! and read by authorization, quotas and the group handlers; below `api` so
//! that none of those reach up into the dispatch layer for it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

tokio::task_local! {
    /// The peer of the connection whose request is being started (set by
    /// the connection around [`crate::api::start_frame`]).
    pub static PEER: std::net::SocketAddr;
}

/// The connection a request arrived on: its listener and, once a SASL
/// listener authenticated it, its principal (`User:<name>`).
#[derive(Clone, Debug)]
pub struct Connection {
    pub listener: Arc<crate::listeners::Listener>,
    pub principal: Option<Arc<str>>,
    /// The client's address (ACL host matching).
    pub peer: Option<std::net::SocketAddr>,
    /// The connection's quota mute (KIP-219), set by throttled responses.
    pub throttle: Arc<ConnectionThrottle>,
}

tokio::task_local! {
    /// Set by the connection around the whole handling of each request.
    pub static CONNECTION: Connection;
}

/// The listener of the request being handled (None outside a connection,
/// as in tests that call handlers directly).
pub fn current_listener() -> Option<Arc<crate::listeners::Listener>> {
    CONNECTION.try_with(|c| c.listener.clone()).ok()
}

/// Kafka's form of a client's address (`/127.0.0.1`), for group members.
pub fn client_host() -> String {
    PEER.try_with(|p| format!("/{}", p.ip()))
        .unwrap_or_else(|_| "/0.0.0.0".to_string())
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
