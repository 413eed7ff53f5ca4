//! Server-side partition assignors of the KIP-848 consumer group protocol,
//! as Kafka's group coordinator defines them (pure functions, no I/O).
//!
//! * `uniform` (Kafka's default, `UniformAssignor`): balanced first, then
//!   sticky. Every member's partition count differs from every other's by at
//!   most one where subscriptions allow it, and as many partitions as that
//!   permits stay with the member that has them in the current target
//!   assignment. Homogeneous groups (every member subscribed to the same
//!   topics) use quotas (`UniformHomogeneousAssignmentBuilder`); heterogeneous
//!   ones keep sticky partitions, hand the rest to the least loaded eligible
//!   member and then move partitions until no move improves the balance
//!   (`UniformHeterogeneousAssignmentBuilder`).
//! * `range` (`RangeAssignor`): per topic, the members subscribed to it, in
//!   order (static members first by instance id, then by member id), get
//!   contiguous ranges; the first `partitions % members` of them one extra.
//!   Topics with equal partition counts and subscribers are co-partitioned:
//!   a member gets the same partition numbers of each.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use uuid::Uuid;

/// A topic id (Kafka's topic UUID).
pub type TopicId = Uuid;

/// Partitions by topic. Ordered, so assignments compare and print stably.
pub type Assignment = BTreeMap<TopicId, BTreeSet<i32>>;

/// The server-side assignors this broker offers (`group.consumer.assignors`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Assignor {
    Uniform,
    Range,
}

impl Assignor {
    pub const ALL: [Assignor; 2] = [Assignor::Uniform, Assignor::Range];

    pub fn name(self) -> &'static str {
        match self {
            Assignor::Uniform => "uniform",
            Assignor::Range => "range",
        }
    }

    pub fn from_name(name: &str) -> Option<Assignor> {
        Assignor::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Computes the target assignment of every member. Topics a member
    /// subscribes to that `partitions` does not list are ignored (Kafka only
    /// hands the assignor topics that exist).
    pub fn assign(
        self,
        members: &[MemberSpec<'_>],
        partitions: &BTreeMap<TopicId, u32>,
    ) -> BTreeMap<String, Assignment> {
        match self {
            Assignor::Uniform => uniform(members, partitions),
            Assignor::Range => range(members, partitions),
        }
    }
}

/// What an assignor knows about one member.
#[derive(Clone, Debug)]
pub struct MemberSpec<'a> {
    pub member_id: &'a str,
    pub instance_id: Option<&'a str>,
    /// Ids of the (existing) topics the member subscribes to.
    pub subscribed: BTreeSet<TopicId>,
    /// The member's current target assignment (what stickiness preserves).
    pub current: &'a Assignment,
}

fn count(a: &Assignment) -> usize {
    a.values().map(BTreeSet::len).sum()
}

fn add(a: &mut Assignment, topic: TopicId, partition: i32) {
    a.entry(topic).or_default().insert(partition);
}

fn remove(a: &mut Assignment, topic: TopicId, partition: i32) {
    if let Some(ps) = a.get_mut(&topic) {
        ps.remove(&partition);
        if ps.is_empty() {
            a.remove(&topic);
        }
    }
}

/// Partitions of the subscribed, existing topics, in (topic, partition) order.
fn all_partitions(
    topics: &BTreeSet<TopicId>,
    partitions: &BTreeMap<TopicId, u32>,
) -> Vec<(TopicId, i32)> {
    let mut out = Vec::new();
    for t in topics {
        if let Some(&n) = partitions.get(t) {
            out.extend((0..n as i32).map(|p| (*t, p)));
        }
    }
    out
}

/// Members' subscriptions restricted to topics that exist.
fn existing_subscriptions(
    members: &[MemberSpec<'_>],
    partitions: &BTreeMap<TopicId, u32>,
) -> Vec<BTreeSet<TopicId>> {
    members
        .iter()
        .map(|m| {
            m.subscribed
                .iter()
                .filter(|t| partitions.contains_key(t))
                .copied()
                .collect()
        })
        .collect()
}

fn uniform(
    members: &[MemberSpec<'_>],
    partitions: &BTreeMap<TopicId, u32>,
) -> BTreeMap<String, Assignment> {
    if members.is_empty() {
        return BTreeMap::new();
    }
    let subs = existing_subscriptions(members, partitions);
    if subs.iter().all(|s| *s == subs[0]) {
        uniform_homogeneous(members, &subs[0], partitions)
    } else {
        uniform_heterogeneous(members, &subs, partitions)
    }
}

/// Is `(topic, partition)` a partition this assignment may keep?
fn valid(
    topics: &BTreeSet<TopicId>,
    partitions: &BTreeMap<TopicId, u32>,
    t: TopicId,
    p: i32,
) -> bool {
    topics.contains(&t) && p >= 0 && partitions.get(&t).is_some_and(|&n| (p as u32) < n)
}

fn uniform_homogeneous(
    members: &[MemberSpec<'_>],
    topics: &BTreeSet<TopicId>,
    partitions: &BTreeMap<TopicId, u32>,
) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = members
        .iter()
        .map(|m| (m.member_id.to_string(), Assignment::new()))
        .collect();
    let all = all_partitions(topics, partitions);
    if all.is_empty() {
        return out;
    }
    let n = members.len();
    let min_quota = all.len() / n;
    let mut extra = all.len() % n;

    // What each member may keep: its current partitions of subscribed,
    // existing topics, each partition at most once across members.
    let mut claimed: BTreeSet<(TopicId, i32)> = BTreeSet::new();
    let mut keepable: Vec<Vec<(TopicId, i32)>> = Vec::with_capacity(n);
    for m in members {
        let mut mine = Vec::new();
        for (t, ps) in m.current {
            for &p in ps {
                if valid(topics, partitions, *t, p) && claimed.insert((*t, p)) {
                    mine.push((*t, p));
                }
            }
        }
        keepable.push(mine);
    }

    // The members that get one partition over the minimum are those that
    // already hold more than the minimum (most first), so that balancing
    // moves as little as possible; ties by member id.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| {
        keepable[b]
            .len()
            .cmp(&keepable[a].len())
            .then_with(|| members[a].member_id.cmp(members[b].member_id))
    });
    let mut quota = vec![min_quota; n];
    for &i in &order {
        if extra == 0 {
            break;
        }
        quota[i] += 1;
        extra -= 1;
    }

    let mut retained: BTreeSet<(TopicId, i32)> = BTreeSet::new();
    for (i, m) in members.iter().enumerate() {
        let target = out.get_mut(m.member_id).expect("member listed");
        for &(t, p) in keepable[i].iter().take(quota[i]) {
            add(target, t, p);
            retained.insert((t, p));
        }
    }
    let mut unassigned = all.into_iter().filter(|tp| !retained.contains(tp));
    for &i in &order_by_id(members) {
        let target = out.get_mut(members[i].member_id).expect("member listed");
        while count(target) < quota[i] {
            match unassigned.next() {
                Some((t, p)) => add(target, t, p),
                None => break,
            }
        }
    }
    debug_assert!(unassigned.next().is_none(), "quotas cover every partition");
    out
}

fn order_by_id(members: &[MemberSpec<'_>]) -> Vec<usize> {
    let mut v: Vec<usize> = (0..members.len()).collect();
    v.sort_by(|&a, &b| members[a].member_id.cmp(members[b].member_id));
    v
}

fn uniform_heterogeneous(
    members: &[MemberSpec<'_>],
    subs: &[BTreeSet<TopicId>],
    partitions: &BTreeMap<TopicId, u32>,
) -> BTreeMap<String, Assignment> {
    let n = members.len();
    // Members per topic, ordered by member id.
    let by_id = order_by_id(members);
    let mut subscribers: BTreeMap<TopicId, Vec<usize>> = BTreeMap::new();
    for &i in &by_id {
        for t in &subs[i] {
            subscribers.entry(*t).or_default().push(i);
        }
    }
    let mut target: Vec<Assignment> = vec![Assignment::new(); n];
    let mut owner: HashMap<(TopicId, i32), usize> = HashMap::new();
    let mut counts = vec![0usize; n];

    // 1. Sticky: keep current partitions of topics still subscribed.
    for i in 0..n {
        for (t, ps) in members[i].current {
            for &p in ps {
                if valid(&subs[i], partitions, *t, p) && !owner.contains_key(&(*t, p)) {
                    owner.insert((*t, p), i);
                    add(&mut target[i], *t, p);
                    counts[i] += 1;
                }
            }
        }
    }

    // 2. The rest, to the least loaded subscriber. Partitions of topics
    // with the most partitions per subscriber first, then the topics with
    // fewer subscribers, then by partition (Kafka's order).
    let mut unassigned: Vec<(TopicId, i32)> = Vec::new();
    for t in subscribers.keys() {
        for p in 0..partitions[t] as i32 {
            if !owner.contains_key(&(*t, p)) {
                unassigned.push((*t, p));
            }
        }
    }
    unassigned.sort_by(|a, b| {
        let ratio = |t: &TopicId| partitions[t] as f64 / subscribers[t].len() as f64;
        ratio(&b.0)
            .partial_cmp(&ratio(&a.0))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| subscribers[&a.0].len().cmp(&subscribers[&b.0].len()))
            .then_with(|| a.1.cmp(&b.1))
            .then_with(|| a.0.cmp(&b.0))
    });
    for (t, p) in unassigned {
        let i = *subscribers[&t]
            .iter()
            .min_by_key(|&&i| (counts[i], members[i].member_id))
            .expect("a topic in `subscribers` has one");
        owner.insert((t, p), i);
        add(&mut target[i], t, p);
        counts[i] += 1;
    }

    // 3. Balance: move a partition from its owner to another subscriber of
    // its topic with at least two fewer partitions, until none can move.
    // Each move lowers the sum of squared counts, so this ends.
    loop {
        let mut moved = false;
        let mut receivers: Vec<usize> = (0..n).collect();
        receivers.sort_by_key(|&i| (counts[i], members[i].member_id));
        'find: for &m in &receivers {
            // The partition to take: from the most loaded owner it can
            // take from, lowest (topic, partition) for determinism.
            let mut best: Option<((TopicId, i32), usize)> = None;
            for t in &subs[m] {
                for p in 0..partitions[t] as i32 {
                    let o = owner[&(*t, p)];
                    if o != m
                        && counts[m] + 1 < counts[o]
                        && best.is_none_or(|(_, bo)| counts[o] > counts[bo])
                    {
                        best = Some(((*t, p), o));
                    }
                }
            }
            if let Some(((t, p), o)) = best {
                remove(&mut target[o], t, p);
                counts[o] -= 1;
                add(&mut target[m], t, p);
                counts[m] += 1;
                owner.insert((t, p), m);
                moved = true;
                break 'find;
            }
        }
        if !moved {
            break;
        }
    }

    members
        .iter()
        .zip(target)
        .map(|(m, a)| (m.member_id.to_string(), a))
        .collect()
}

/// Kafka's range order: static members first by instance id, then dynamic
/// members by member id.
fn range_order(members: &[MemberSpec<'_>]) -> Vec<usize> {
    let mut v: Vec<usize> = (0..members.len()).collect();
    v.sort_by(|&a, &b| {
        let (ma, mb) = (&members[a], &members[b]);
        match (ma.instance_id, mb.instance_id) {
            (Some(x), Some(y)) => x.cmp(y).then_with(|| ma.member_id.cmp(mb.member_id)),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => ma.member_id.cmp(mb.member_id),
        }
    });
    v
}

fn range(
    members: &[MemberSpec<'_>],
    partitions: &BTreeMap<TopicId, u32>,
) -> BTreeMap<String, Assignment> {
    let subs = existing_subscriptions(members, partitions);
    let mut out: BTreeMap<String, Assignment> = members
        .iter()
        .map(|m| (m.member_id.to_string(), Assignment::new()))
        .collect();
    let order = range_order(members);
    let topics: BTreeSet<TopicId> = subs.iter().flatten().copied().collect();
    for t in topics {
        let subscribed: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&i| subs[i].contains(&t))
            .collect();
        let n = partitions[&t] as usize;
        let k = subscribed.len();
        let (quota, extra) = (n / k, n % k);
        let mut next = 0usize;
        for (pos, &i) in subscribed.iter().enumerate() {
            let len = quota + usize::from(pos < extra);
            let target = out.get_mut(members[i].member_id).expect("member listed");
            for p in next..next + len {
                add(target, t, p as i32);
            }
            next += len;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn topic(n: u8) -> TopicId {
        Uuid::from_bytes([n; 16])
    }

    fn parts(a: &Assignment) -> Vec<(u8, i32)> {
        a.iter()
            .flat_map(|(t, ps)| ps.iter().map(move |p| (t.as_bytes()[0], *p)))
            .collect()
    }

    struct Owned {
        id: String,
        instance: Option<String>,
        subscribed: BTreeSet<TopicId>,
        current: Assignment,
    }

    fn owned(id: &str, topics: &[u8], current: &[(u8, i32)]) -> Owned {
        let mut a = Assignment::new();
        for &(t, p) in current {
            add(&mut a, topic(t), p);
        }
        Owned {
            id: id.to_string(),
            instance: None,
            subscribed: topics.iter().map(|&t| topic(t)).collect(),
            current: a,
        }
    }

    fn specs(v: &[Owned]) -> Vec<MemberSpec<'_>> {
        v.iter()
            .map(|o| MemberSpec {
                member_id: &o.id,
                instance_id: o.instance.as_deref(),
                subscribed: o.subscribed.clone(),
                current: &o.current,
            })
            .collect()
    }

    fn counts(topics: &[(u8, u32)]) -> BTreeMap<TopicId, u32> {
        topics.iter().map(|&(t, n)| (topic(t), n)).collect()
    }

    #[test]
    fn names_round_trip() {
        for a in Assignor::ALL {
            assert_eq!(Assignor::from_name(a.name()), Some(a));
        }
        assert_eq!(Assignor::from_name("sticky"), None);
        assert_eq!(Assignor::from_name(""), None);
    }

    #[test]
    fn uniform_fresh_group_is_balanced_and_complete() {
        let m = vec![
            owned("a", &[1], &[]),
            owned("b", &[1], &[]),
            owned("c", &[1], &[]),
        ];
        let out = Assignor::Uniform.assign(&specs(&m), &counts(&[(1, 12)]));
        let sizes: Vec<usize> = out.values().map(count).collect();
        assert_eq!(sizes, vec![4, 4, 4]);
        let all: BTreeSet<_> = out.values().flat_map(parts).collect();
        assert_eq!(all.len(), 12);
    }

    #[test]
    fn uniform_is_sticky_when_a_member_joins() {
        let m = vec![
            owned("a", &[1], &[(1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (1, 5)]),
            owned(
                "b",
                &[1],
                &[(1, 6), (1, 7), (1, 8), (1, 9), (1, 10), (1, 11)],
            ),
            owned("c", &[1], &[]),
        ];
        let out = Assignor::Uniform.assign(&specs(&m), &counts(&[(1, 12)]));
        // a and b each give up two partitions, nothing else moves.
        assert_eq!(parts(&out["a"]), vec![(1, 0), (1, 1), (1, 2), (1, 3)]);
        assert_eq!(parts(&out["b"]), vec![(1, 6), (1, 7), (1, 8), (1, 9)]);
        assert_eq!(parts(&out["c"]), vec![(1, 4), (1, 5), (1, 10), (1, 11)]);
    }

    #[test]
    fn uniform_gives_the_extra_partition_to_members_that_hold_it() {
        // 7 partitions, 3 members: quotas 3,2,2. The member holding 3
        // keeps them, even though its id sorts last.
        let m = vec![
            owned("a", &[1], &[(1, 0), (1, 1)]),
            owned("b", &[1], &[(1, 2), (1, 3)]),
            owned("z", &[1], &[(1, 4), (1, 5), (1, 6)]),
        ];
        let out = Assignor::Uniform.assign(&specs(&m), &counts(&[(1, 7)]));
        for o in &m {
            assert_eq!(out[&o.id], o.current, "{} moved", o.id);
        }
    }

    #[test]
    fn uniform_drops_unsubscribed_and_missing_topics() {
        let m = vec![
            owned("a", &[1], &[(1, 0), (2, 0), (1, 9)]),
            owned("b", &[1], &[(1, 1)]),
        ];
        // Topic 1 has 2 partitions (partition 9 is not one), topic 2 is not
        // subscribed.
        let out = Assignor::Uniform.assign(&specs(&m), &counts(&[(1, 2), (2, 1)]));
        assert_eq!(parts(&out["a"]), vec![(1, 0)]);
        assert_eq!(parts(&out["b"]), vec![(1, 1)]);
    }

    #[test]
    fn uniform_subscription_to_missing_topic_assigns_nothing() {
        let m = vec![owned("a", &[7], &[])];
        let out = Assignor::Uniform.assign(&specs(&m), &counts(&[(1, 3)]));
        assert!(out["a"].is_empty());
        assert!(Assignor::Uniform.assign(&[], &counts(&[(1, 3)])).is_empty());
    }

    #[test]
    fn uniform_heterogeneous_respects_subscriptions_and_balances() {
        // a: topics 1 and 2; b: topic 1; c: topic 2.
        let m = vec![
            owned("a", &[1, 2], &[]),
            owned("b", &[1], &[]),
            owned("c", &[2], &[]),
        ];
        let out = Assignor::Uniform.assign(&specs(&m), &counts(&[(1, 3), (2, 3)]));
        for (t, _) in parts(&out["b"]) {
            assert_eq!(t, 1);
        }
        for (t, _) in parts(&out["c"]) {
            assert_eq!(t, 2);
        }
        let sizes: Vec<usize> = out.values().map(count).collect();
        assert_eq!(sizes, vec![2, 2, 2]);
    }

    #[test]
    fn uniform_heterogeneous_moves_to_balance_but_keeps_what_it_can() {
        // a holds all 4 partitions of topic 1; b joins topic 1 and also
        // subscribes to topic 2 (2 partitions). Balanced is 3/3, reachable by
        // moving one partition of topic 1 to b.
        let m = vec![
            owned("a", &[1], &[(1, 0), (1, 1), (1, 2), (1, 3)]),
            owned("b", &[1, 2], &[]),
        ];
        let out = Assignor::Uniform.assign(&specs(&m), &counts(&[(1, 4), (2, 2)]));
        assert_eq!(count(&out["a"]), 3);
        assert_eq!(count(&out["b"]), 3);
        assert!(!out["a"].contains_key(&topic(2)));
    }

    #[test]
    fn range_is_contiguous_by_member_id_and_co_partitioned() {
        let m = vec![owned("m1", &[1, 2], &[]), owned("m0", &[1, 2], &[])];
        let out = Assignor::Range.assign(&specs(&m), &counts(&[(1, 3), (2, 3)]));
        // Kafka's example: M0 gets T1P0, T1P1, T2P0, T2P1; M1 gets T1P2, T2P2.
        assert_eq!(parts(&out["m0"]), vec![(1, 0), (1, 1), (2, 0), (2, 1)]);
        assert_eq!(parts(&out["m1"]), vec![(1, 2), (2, 2)]);
    }

    #[test]
    fn range_puts_static_members_first() {
        let mut m = vec![owned("a", &[1], &[]), owned("z", &[1], &[])];
        m[1].instance = Some("i0".into());
        let out = Assignor::Range.assign(&specs(&m), &counts(&[(1, 4)]));
        assert_eq!(parts(&out["z"]), vec![(1, 0), (1, 1)]);
        assert_eq!(parts(&out["a"]), vec![(1, 2), (1, 3)]);
    }

    #[test]
    fn range_heterogeneous_is_per_topic_subscribers() {
        let m = vec![
            owned("a", &[1], &[]),
            owned("b", &[1, 2], &[]),
            owned("c", &[2], &[]),
        ];
        let out = Assignor::Range.assign(&specs(&m), &counts(&[(1, 5), (2, 2)]));
        assert_eq!(parts(&out["a"]), vec![(1, 0), (1, 1), (1, 2)]);
        assert_eq!(parts(&out["b"]), vec![(1, 3), (1, 4), (2, 0)]);
        assert_eq!(parts(&out["c"]), vec![(2, 1)]);
    }

    #[test]
    fn range_with_more_members_than_partitions() {
        let m = vec![
            owned("a", &[1], &[]),
            owned("b", &[1], &[]),
            owned("c", &[1], &[]),
        ];
        let out = Assignor::Range.assign(&specs(&m), &counts(&[(1, 2)]));
        assert_eq!(parts(&out["a"]), vec![(1, 0)]);
        assert_eq!(parts(&out["b"]), vec![(1, 1)]);
        assert!(out["c"].is_empty());
    }

    /// Topics as `(id byte, partitions)`; members as (subscribed topic id
    /// bytes, current `(topic, partition)`s).
    type ArbGroup = (Vec<(u8, u32)>, Vec<(Vec<u8>, Vec<(u8, i32)>)>);

    fn arb_group() -> impl Strategy<Value = ArbGroup> {
        let topics = prop::collection::vec(0u32..12, 1..4).prop_map(|ns| {
            ns.into_iter()
                .enumerate()
                .map(|(i, n)| (i as u8 + 1, n))
                .collect::<Vec<_>>()
        });
        let members = prop::collection::vec(
            (
                prop::collection::vec(1u8..5, 0..4),
                prop::collection::vec((1u8..5, 0i32..14), 0..10),
            ),
            1..7,
        );
        (topics, members)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Every assignor: each partition of a subscribed topic goes to
        /// exactly one member subscribed to it, and to no one else.
        #[test]
        fn assignments_are_complete_and_exclusive((topics, raw) in arb_group()) {
            let m: Vec<Owned> = raw.iter().enumerate()
                .map(|(i, (subs, cur))| owned(&format!("m{i}"), subs, cur))
                .collect();
            let counts = counts(&topics);
            for a in Assignor::ALL {
                let out = a.assign(&specs(&m), &counts);
                prop_assert_eq!(out.len(), m.len());
                let mut seen = BTreeSet::new();
                for o in &m {
                    for (t, p) in parts(&out[&o.id]) {
                        prop_assert!(o.subscribed.contains(&topic(t)));
                        prop_assert!(p >= 0 && (p as u32) < counts[&topic(t)]);
                        prop_assert!(seen.insert((t, p)), "{:?} twice", (t, p));
                    }
                }
                let wanted: usize = counts.iter()
                    .filter(|(t, _)| m.iter().any(|o| o.subscribed.contains(t)))
                    .map(|(_, n)| *n as usize).sum();
                prop_assert_eq!(seen.len(), wanted);
            }
        }

        /// Uniform on a homogeneous group: sizes differ by at most one, and
        /// every member keeps min(what it validly held, its quota floor).
        #[test]
        fn uniform_homogeneous_balanced_and_sticky((topics, raw) in arb_group()) {
            let subs: Vec<u8> = raw[0].0.clone();
            let m: Vec<Owned> = raw.iter().enumerate()
                .map(|(i, (_, cur))| owned(&format!("m{i}"), &subs, cur))
                .collect();
            let counts = counts(&topics);
            let out = Assignor::Uniform.assign(&specs(&m), &counts);
            let sizes: Vec<usize> = out.values().map(count).collect();
            let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            prop_assert!(hi - lo <= 1, "sizes {:?}", sizes);
            // Stickiness: a member keeps at least min(valid held, floor quota)
            // of its held partitions (first claim wins for duplicates).
            let total: usize = sizes.iter().sum();
            let floor = total / m.len();
            let mut claimed = BTreeSet::new();
            for o in &m {
                let valid_held = parts(&o.current).into_iter()
                    .filter(|&(t, p)| valid(&o.subscribed, &counts, topic(t), p) && claimed.insert((t, p)))
                    .collect::<BTreeSet<_>>();
                let kept = parts(&out[&o.id]).into_iter().filter(|tp| valid_held.contains(tp)).count();
                prop_assert!(kept >= valid_held.len().min(floor));
            }
        }

        /// Uniform on any group: no partition can move to a subscriber with
        /// two fewer partitions (the balance Kafka's heterogeneous builder
        /// reaches).
        #[test]
        fn uniform_heterogeneous_cannot_improve((topics, raw) in arb_group()) {
            let m: Vec<Owned> = raw.iter().enumerate()
                .map(|(i, (subs, cur))| owned(&format!("m{i}"), subs, cur))
                .collect();
            let counts = counts(&topics);
            let out = Assignor::Uniform.assign(&specs(&m), &counts);
            let size: BTreeMap<&str, usize> = out.iter().map(|(k, v)| (k.as_str(), count(v))).collect();
            for o in &m {
                for other in &m {
                    for (t, _) in parts(&out[&other.id]) {
                        if o.subscribed.contains(&topic(t)) {
                            prop_assert!(size[o.id.as_str()] + 1 >= size[other.id.as_str()],
                                "{} ({}) could take from {} ({})", o.id, size[o.id.as_str()], other.id, size[other.id.as_str()]);
                        }
                    }
                }
            }
        }
    }
}
