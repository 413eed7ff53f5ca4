//! `max.connections` and `max.connections.per.ip`, as Kafka's acceptor
//! applies them: at `max.connections` the acceptor stops taking connections
//! until one closes (they wait in the kernel's accept queue); a client
//! address already at `max.connections.per.ip` has its new connection
//! closed at once. The inter-broker listener does not wait for
//! `max.connections` (brokers must reach each other), but counts against
//! `max.connections.per.ip` as every listener does.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub struct ConnectionLimits {
    total: Arc<Semaphore>,
    per_ip_max: usize,
    /// `max.connections.per.ip.overrides`.
    per_ip_overrides: BTreeMap<IpAddr, usize>,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
}

/// One admitted connection's share of the limits, given back on drop.
pub struct Slot {
    limits: Arc<ConnectionLimits>,
    ip: IpAddr,
    _permit: Option<OwnedSemaphorePermit>,
}

impl ConnectionLimits {
    pub fn new(
        max_connections: usize,
        max_connections_per_ip: usize,
        per_ip_overrides: BTreeMap<IpAddr, usize>,
    ) -> Arc<ConnectionLimits> {
        Arc::new(ConnectionLimits {
            total: Arc::new(Semaphore::new(
                max_connections.clamp(1, Semaphore::MAX_PERMITS),
            )),
            per_ip_max: max_connections_per_ip.max(1),
            per_ip_overrides,
            per_ip: Mutex::new(HashMap::new()),
        })
    }

    /// Waits until the broker is below `max.connections`.
    pub async fn wait_for_capacity(&self) -> OwnedSemaphorePermit {
        self.total
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    /// Admits a connection from `ip` (with a permit of
    /// [`wait_for_capacity`](Self::wait_for_capacity), except on the
    /// inter-broker listener), unless the address is at
    /// `max.connections.per.ip`.
    pub fn admit(
        self: &Arc<Self>,
        ip: IpAddr,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Option<Slot> {
        let mut per_ip = self.per_ip.lock().expect("connection counts lock");
        let limit = self.limit_for(ip);
        let count = per_ip.entry(ip).or_insert(0);
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(Slot {
            limits: self.clone(),
            ip,
            _permit: permit,
        })
    }

    /// `max.connections.per.ip` for `ip` (its override, if any; an
    /// override of 0 refuses the address).
    pub fn limit_for(&self, ip: IpAddr) -> usize {
        self.per_ip_overrides
            .get(&ip)
            .copied()
            .unwrap_or(self.per_ip_max)
    }

    /// Open connections from `ip`.
    pub fn connections_from(&self, ip: IpAddr) -> usize {
        let per_ip = self.per_ip.lock().expect("connection counts lock");
        per_ip.get(&ip).copied().unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut per_ip = self.limits.per_ip.lock().expect("connection counts lock");
        if let Some(count) = per_ip.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                per_ip.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn per_ip_limit_refuses_and_frees_on_close() {
        let c: IpAddr = [10, 0, 0, 3].into();
        let d: IpAddr = [10, 0, 0, 4].into();
        let limits = ConnectionLimits::new(10, 2, BTreeMap::from([(c, 3), (d, 0)]));
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        // Overrides: three from c, none from d.
        let _c: Vec<Slot> = (0..3)
            .map(|_| {
                let permit = limits.total.clone().try_acquire_owned().unwrap();
                limits.admit(c, Some(permit)).unwrap()
            })
            .collect();
        assert!(limits.admit(c, None).is_none());
        assert!(limits.admit(d, None).is_none());
        let first = limits
            .admit(a, Some(limits.wait_for_capacity().await))
            .unwrap();
        let _second = limits
            .admit(a, Some(limits.wait_for_capacity().await))
            .unwrap();
        assert!(limits
            .admit(a, Some(limits.wait_for_capacity().await))
            .is_none());
        // Another address is not affected.
        let _other = limits
            .admit(b, Some(limits.wait_for_capacity().await))
            .unwrap();
        drop(first);
        assert_eq!(limits.connections_from(a), 1);
        assert!(limits
            .admit(a, Some(limits.wait_for_capacity().await))
            .is_some());
    }

    #[tokio::test]
    async fn total_limit_waits_for_a_close() {
        let limits = ConnectionLimits::new(1, 5, BTreeMap::new());
        let ip: IpAddr = [10, 0, 0, 1].into();
        let held = limits
            .admit(ip, Some(limits.wait_for_capacity().await))
            .unwrap();
        let waiting = {
            let limits = limits.clone();
            tokio::spawn(async move { limits.wait_for_capacity().await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(held);
        let permit = waiting.await.unwrap();
        let _admitted = limits.admit(ip, Some(permit)).unwrap();
        assert_eq!(limits.connections_from(ip), 1);
    }
}
