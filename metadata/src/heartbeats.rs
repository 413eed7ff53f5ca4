//! Brokers' heartbeats as a controller voter hears them (Kafka's
//! BrokerHeartbeat, over the controller transport; brokers send them to
//! every voter, so a newly elected leader already knows who is alive).
//! Kept in memory only: a restarted voter knows nobody's last heartbeat and
//! gives every broker a full session before fencing it.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use parking_lot::Mutex;

/// A broker's load report: per range it leads, the range id and the bytes
/// appended per second.
pub type RangeLoads = Vec<(u64, u64)>;

/// The last heartbeat heard from each broker.
#[derive(Default, Debug)]
pub struct Heartbeats {
    last: Mutex<HashMap<i32, Instant>>,
    /// Brokers in controlled shutdown (their last heartbeat asked to be
    /// fenced); a plain heartbeat (a restart) takes a broker out again.
    stopping: Mutex<HashSet<i32>>,
    /// Each broker's last load report: when, and the bytes per second
    /// appended to each range it leads.
    loads: Mutex<HashMap<i32, (Instant, RangeLoads)>>,
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

    pub fn record_load(&self, broker_id: i32, ranges: Vec<(u64, u64)>) {
        self.loads
            .lock()
            .insert(broker_id, (Instant::now(), ranges));
    }

    /// The range loads each broker reported within `max_age`: broker ->
    /// (range, bytes appended per second).
    pub fn loads(&self, max_age: std::time::Duration) -> HashMap<i32, Vec<(u64, u64)>> {
        self.loads
            .lock()
            .iter()
            .filter(|(_, (at, _))| at.elapsed() < max_age)
            .map(|(b, (_, ranges))| (*b, ranges.clone()))
            .collect()
    }

    /// Forgets everything (this node stopped leading: what it heard then
    /// says nothing about the next time it leads).
    pub fn clear(&self) {
        self.last.lock().clear();
        self.stopping.lock().clear();
        self.loads.lock().clear();
    }
}
