//! Replica placement for a new segment: rendezvous (highest-random-weight)
//! hashing over live, unfenced brokers, weighted by load, spread across racks.
//!
//! Rendezvous hashing gives each (segment, broker) pair a score; the highest
//! scores win. Adding a broker only moves the segments it now wins, so a
//! broker that joins takes new segments at once without reshuffling others.

use thiserror::Error;

/// A broker that may hold a replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerCandidate {
    pub broker_id: i32,
    pub rack: Option<String>,
    pub fenced: bool,
    /// Active segments it already serves; higher load lowers its score.
    pub load: u64,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum PlacementError {
    #[error("replication factor {wanted} is larger than the {available} live broker(s)")]
    NotEnoughBrokers { wanted: usize, available: usize },
    #[error("replication factor must be at least 1")]
    InvalidReplicationFactor,
}

/// 64-bit FNV-1a followed by a splitmix finaliser: stable across builds and platforms.
fn hash(key: &str, broker_id: i32) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in key.bytes().chain(broker_id.to_be_bytes()) {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58476d1ce4e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d049bb133111eb);
    h ^ (h >> 31)
}

/// Weighted rendezvous score: `-1 / ln(u)` scaled down by load (Resendez's
/// weighted HRW), so lightly loaded brokers win proportionally more often.
fn score(key: &str, broker: &BrokerCandidate) -> f64 {
    let u = (hash(key, broker.broker_id) as f64 + 1.0) / (u64::MAX as f64 + 2.0);
    let weight = 1.0 / (1.0 + broker.load as f64);
    -weight / u.ln()
}

/// Picks `replication_factor` brokers for the segment named `segment_key`;
/// the first is the primary. Racks are spread first: a second replica goes to
/// a new rack while one is left.
pub fn place_replicas(
    segment_key: &str,
    brokers: &[BrokerCandidate],
    replication_factor: usize,
) -> Result<Vec<i32>, PlacementError> {
    place_replicas_led_by(segment_key, brokers, None, replication_factor)
}

/// [`place_replicas`] with the primary chosen by the caller (a live
/// candidate; ignored otherwise): it comes first and its rack counts as
/// used, the followers are placed around it.
pub fn place_replicas_led_by(
    segment_key: &str,
    brokers: &[BrokerCandidate],
    primary: Option<i32>,
    replication_factor: usize,
) -> Result<Vec<i32>, PlacementError> {
    if replication_factor == 0 {
        return Err(PlacementError::InvalidReplicationFactor);
    }
    let mut live: Vec<&BrokerCandidate> = brokers.iter().filter(|b| !b.fenced).collect();
    if live.len() < replication_factor {
        return Err(PlacementError::NotEnoughBrokers {
            wanted: replication_factor,
            available: live.len(),
        });
    }
    live.sort_by(|a, b| {
        score(segment_key, b)
            .total_cmp(&score(segment_key, a))
            .then(a.broker_id.cmp(&b.broker_id))
    });
    if let Some(at) = primary.and_then(|p| live.iter().position(|b| b.broker_id == p)) {
        let led_by = live.remove(at);
        live.insert(0, led_by);
    }
    let mut chosen: Vec<&BrokerCandidate> = Vec::with_capacity(replication_factor);
    let mut used_racks: Vec<&Option<String>> = Vec::new();
    // First pass: best-scoring broker of each unused rack; second: fill by score.
    for b in &live {
        if chosen.len() == replication_factor {
            break;
        }
        if b.rack.is_some() && used_racks.contains(&&b.rack) {
            continue;
        }
        used_racks.push(&b.rack);
        chosen.push(b);
    }
    for b in &live {
        if chosen.len() == replication_factor {
            break;
        }
        if !chosen.iter().any(|c| c.broker_id == b.broker_id) {
            chosen.push(b);
        }
    }
    Ok(chosen.iter().map(|b| b.broker_id).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn broker(id: i32, rack: Option<&str>) -> BrokerCandidate {
        BrokerCandidate {
            broker_id: id,
            rack: rack.map(str::to_string),
            fenced: false,
            load: 0,
        }
    }

    #[test]
    fn a_chosen_primary_leads_and_the_followers_spread_from_its_rack() {
        let b = vec![
            broker(1, Some("a")),
            broker(2, Some("a")),
            broker(3, Some("b")),
            broker(4, Some("c")),
        ];
        for key in ["t/1/0", "t/2/0", "x/9/3"] {
            let placed = place_replicas_led_by(key, &b, Some(2), 3).unwrap();
            assert_eq!(placed[0], 2, "{key}");
            let mut rest = placed[1..].to_vec();
            rest.sort();
            assert_eq!(rest, vec![3, 4], "{key}: one per other rack");
        }
        // A fenced or unknown primary is not forced in.
        let mut fenced = b.clone();
        fenced[1].fenced = true;
        let placed = place_replicas_led_by("t/1/0", &fenced, Some(2), 2).unwrap();
        assert!(!placed.contains(&2));
        assert_eq!(
            place_replicas_led_by("t/1/0", &b, Some(99), 2).unwrap(),
            place_replicas("t/1/0", &b, 2).unwrap()
        );
    }

    #[test]
    fn single_broker_rf1() {
        assert_eq!(
            place_replicas("t/1/0", &[broker(1, None)], 1).unwrap(),
            vec![1]
        );
    }

    #[test]
    fn refuses_more_replicas_than_live_brokers() {
        let mut b = vec![broker(1, None), broker(2, None)];
        b[1].fenced = true;
        assert_eq!(
            place_replicas("k", &b, 2),
            Err(PlacementError::NotEnoughBrokers {
                wanted: 2,
                available: 1
            })
        );
        assert_eq!(
            place_replicas("k", &b, 0),
            Err(PlacementError::InvalidReplicationFactor)
        );
    }

    #[test]
    fn spreads_across_racks() {
        let b = vec![
            broker(1, Some("a")),
            broker(2, Some("a")),
            broker(3, Some("b")),
            broker(4, Some("b")),
        ];
        for i in 0..50 {
            let r = place_replicas(&format!("seg-{i}"), &b, 2).unwrap();
            let racks: Vec<_> = r
                .iter()
                .map(|id| b.iter().find(|x| x.broker_id == *id).unwrap().rack.clone())
                .collect();
            assert_ne!(racks[0], racks[1]);
        }
    }

    #[test]
    fn load_shifts_placement() {
        let mut b = vec![broker(1, None), broker(2, None)];
        b[0].load = 1000;
        let wins = (0..200)
            .filter(|i| place_replicas(&format!("s{i}"), &b, 1).unwrap()[0] == 2)
            .count();
        assert!(
            wins > 180,
            "lightly loaded broker should win most, won {wins}"
        );
    }

    proptest! {
        #[test]
        fn distinct_live_and_deterministic(key in "[a-z0-9/]{1,12}", n in 1usize..8, rf in 1usize..4) {
            let b: Vec<_> = (0..n as i32).map(|i| broker(i, if i % 2 == 0 { Some("r0") } else { Some("r1") })).collect();
            match place_replicas(&key, &b, rf) {
                Ok(r) => {
                    prop_assert_eq!(r.len(), rf);
                    let mut d = r.clone(); d.sort(); d.dedup();
                    prop_assert_eq!(d.len(), rf);
                    prop_assert_eq!(place_replicas(&key, &b, rf).unwrap(), r);
                }
                Err(_) => prop_assert!(rf > n),
            }
        }

        #[test]
        fn adding_a_broker_only_moves_what_it_wins(key in "[a-z0-9]{1,12}") {
            let b: Vec<_> = (0..4).map(|i| broker(i, None)).collect();
            let before = place_replicas(&key, &b, 1).unwrap()[0];
            let mut more = b.clone();
            more.push(broker(9, None));
            let after = place_replicas(&key, &more, 1).unwrap()[0];
            prop_assert!(after == before || after == 9);
        }
    }
}
