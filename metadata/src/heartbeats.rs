//! Brokers' heartbeats as the active controller hears them (Kafka's
//! BrokerHeartbeat, over the controller transport). Kept in memory only:
//! a new leader knows nobody's last heartbeat and gives every broker a full
//! session before fencing it.

use std::collections::HashMap;
use std::time::Instant;

use parking_lot::Mutex;

/// The last heartbeat heard from each broker.
#[derive(Default, Debug)]
pub struct Heartbeats {
    last: Mutex<HashMap<i32, Instant>>,
}

impl Heartbeats {
    pub fn record(&self, broker_id: i32) {
        self.last.lock().insert(broker_id, Instant::now());
    }

    pub fn last_seen(&self, broker_id: i32) -> Option<Instant> {
        self.last.lock().get(&broker_id).copied()
    }

    /// Forgets everything (this node stopped leading: what it heard then
    /// says nothing about the next time it leads).
    pub fn clear(&self) {
        self.last.lock().clear();
    }
}
