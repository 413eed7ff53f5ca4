//! Brokers' heartbeats as a controller voter hears them (Kafka's
//! BrokerHeartbeat, over the controller transport; brokers send them to
//! every voter, so a newly elected leader already knows who is alive).
//! Kept in memory only: a restarted voter knows nobody's last heartbeat and
//! gives every broker a full session before fencing it.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use parking_lot::Mutex;

/// The last heartbeat heard from each broker.
#[derive(Default, Debug)]
pub struct Heartbeats {
    last: Mutex<HashMap<i32, Instant>>,
    /// Brokers in controlled shutdown (their last heartbeat asked to be
    /// fenced); a plain heartbeat (a restart) takes a broker out again.
    stopping: Mutex<HashSet<i32>>,
}

impl Heartbeats {
    pub fn record(&self, broker_id: i32, want_shutdown: bool) {
        self.last.lock().insert(broker_id, Instant::now());
        let mut stopping = self.stopping.lock();
        if want_shutdown {
            stopping.insert(broker_id);
        } else {
            stopping.remove(&broker_id);
        }
    }

    /// True when the broker's last heartbeat asked to shut down.
    pub fn wants_shutdown(&self, broker_id: i32) -> bool {
        self.stopping.lock().contains(&broker_id)
    }

    pub fn last_seen(&self, broker_id: i32) -> Option<Instant> {
        self.last.lock().get(&broker_id).copied()
    }

    /// Forgets everything (this node stopped leading: what it heard then
    /// says nothing about the next time it leads).
    pub fn clear(&self) {
        self.last.lock().clear();
        self.stopping.lock().clear();
    }
}
