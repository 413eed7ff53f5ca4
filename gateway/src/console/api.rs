//! The console's JSON API (`/api/v1/...`): the pages' data, each answer
//! limited to what the caller's ACLs allow (the same authorizer as the
//! Kafka APIs). Log offsets and messages are asked of each partition's
//! leader over the broker's own Kafka client (`crate::peer`), this node
//! included, so any node answers for the whole cluster.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{BrokerId, ListOffsetsRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Record, RecordBatchDecoder};
use serde::Serialize;
use tessera_metadata::TopicImage;

use super::views;
use super::Reply;
use crate::authz::{Authz, Op, Resource};
use crate::broker::Broker;
use crate::dynamic_config::BrokerView;

/// How long the console waits for a leader's answer.
pub(super) const LEADER_TIMEOUT: Duration = Duration::from_secs(5);
const LIST_OFFSETS_VERSION: i16 = 7;
const FETCH_VERSION: i16 = 12;
/// Records a messages page shows at most.
const MAX_LIMIT: usize = 500;
/// Bytes of a key or value shown before it is truncated (the page asks
/// for one record in full on demand).
const PREVIEW_BYTES: usize = 4096;
/// Fetch rounds per messages page (each reads up to 1 MiB).
const FETCH_ROUNDS: usize = 8;

/// A broker's Kafka listener, where the console sends a request.
#[derive(Clone, Debug)]
pub(super) struct Node {
    pub id: i32,
    pub host: String,
    pub port: u16,
}

impl Node {
    /// Broker `id` as the image registers it.
    pub fn of(broker: &Broker, id: i32) -> Result<Node, Reply> {
        let image = broker.image();
        let b = image.brokers.get(&id).ok_or_else(|| {
            Reply::error(
                "503 Service Unavailable",
                &format!("broker {id} is not registered"),
            )
        })?;
        Ok(Node {
            id,
            host: b.registration.host.clone(),
            port: b.registration.port,
        })
    }

    /// This broker.
    pub fn this(broker: &Broker) -> Result<Node, Reply> {
        Node::of(broker, broker.config().node_id)
    }
}

/// Sends `request` at `version` to `node` over the broker's own Kafka
/// client (`crate::peer`); no answer is a 502 naming the node.
pub(super) async fn ask<R: kafka_protocol::protocol::Request>(
    broker: &Broker,
    node: &Node,
    version: i16,
    request: &R,
) -> Result<R::Response, Reply> {
    crate::peer::call(
        broker.inter_broker(),
        &node.host,
        node.port,
        version,
        request,
        LEADER_TIMEOUT,
    )
    .await
    .map_err(|e| Reply::error("502 Bad Gateway", &format!("broker {}: {e}", node.id)))
}

/// The query string, percent-decoded.
pub struct Query(BTreeMap<String, String>);

impl Query {
    pub fn parse(query: &str) -> Query {
        Query(
            query
                .split('&')
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    (percent_decode(k), percent_decode(v))
                })
                .collect(),
        )
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    fn number<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, Reply> {
        self.get(name)
            .filter(|v| !v.is_empty())
            .map(|v| {
                v.parse()
                    .map_err(|_| Reply::error("400 Bad Request", &format!("{name}: not a number")))
            })
            .transpose()
    }
}

/// `%XX` and `+` decoded; invalid escapes kept as they are.
pub fn percent_decode(s: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(hi), Some(lo)) => {
                    out.push(hi << 4 | lo);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Answers one API request of `authz`'s principal.
pub async fn handle(broker: &Arc<Broker>, authz: &Authz<'_>, path: &str, query: &Query) -> Reply {
    let segments: Vec<String> = path
        .trim_start_matches("/api/v1/")
        .split('/')
        .map(percent_decode)
        .collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    let result = match segments.as_slice() {
        ["cluster"] => Ok(cluster(broker)),
        ["topics"] => Ok(topics(broker, authz, query.get("search").unwrap_or(""))),
        ["topics", name] => topic(broker, authz, name).await,
        ["groups"] => Ok(super::groups::list(broker, authz).await),
        ["rates"] => Ok(rates(broker, authz)),
        [what @ ("acls" | "users" | "quotas")] => super::security::read(broker, authz, what),
        ["groups", group] => super::groups::describe(broker, authz, group).await,
        ["topics", name, "partitions", p, "messages"] => match p.parse::<i32>() {
            Ok(p) => messages(broker, authz, name, p, query).await,
            Err(_) => Err(Reply::error("400 Bad Request", "partition: not a number")),
        },
        _ => Err(Reply::error("404 Not Found", "no such console API")),
    };
    result.unwrap_or_else(|reply| reply)
}

fn cluster(broker: &Arc<Broker>) -> Reply {
    let image = broker.image();
    let rates = broker.reported_range_rates(&image);
    // The configured voters; a single node without a voter list is its
    // own quorum.
    let mut voters: std::collections::BTreeSet<i32> = broker
        .controller()
        .voters()
        .keys()
        .filter_map(|id| i32::try_from(*id).ok())
        .collect();
    if voters.is_empty() {
        voters.insert(broker.config().node_id);
    }
    Reply::json(&views::cluster(
        &image,
        broker.cluster_id(),
        broker.controller_id(),
        broker.config().node_id,
        &voters,
        &rates,
    ))
}

/// What the live page samples every few seconds: this node's counters
/// (the page turns them into rates) and the bytes in per second every
/// primary reports, by broker and by topic.
#[derive(Serialize)]
struct Rates {
    at_ms: i64,
    node_id: i32,
    produced_bytes: u64,
    fetched_bytes: u64,
    produced_batches: u64,
    open_connections: u64,
    broker_bytes_in_per_sec: BTreeMap<i32, u64>,
    topic_bytes_in_per_sec: BTreeMap<String, u64>,
}

fn rates(broker: &Arc<Broker>, authz: &Authz<'_>) -> Reply {
    use std::sync::atomic::Ordering::Relaxed;
    let image = broker.image();
    let rates = broker.reported_range_rates(&image);
    let metrics = broker.metrics();
    let topic_bytes_in_per_sec = views::topics(&image, &rates, "", |name| {
        authz.may(Op::Describe, Resource::Topic, name)
    })
    .into_iter()
    .map(|t| (t.name, t.bytes_in_per_sec))
    .collect();
    Reply::json(&Rates {
        at_ms: tessera_log::now_ms(),
        node_id: broker.config().node_id,
        produced_bytes: metrics.produced_bytes.load(Relaxed),
        fetched_bytes: metrics.fetched_bytes.load(Relaxed),
        produced_batches: metrics.produced_batches.load(Relaxed),
        open_connections: metrics
            .connections_opened
            .load(Relaxed)
            .saturating_sub(metrics.connections_closed.load(Relaxed)),
        broker_bytes_in_per_sec: tessera_planner::broker_loads(&image, &rates),
        topic_bytes_in_per_sec,
    })
}

fn topics(broker: &Arc<Broker>, authz: &Authz<'_>, search: &str) -> Reply {
    let image = broker.image();
    let rates = broker.reported_range_rates(&image);
    Reply::json(&views::topics(&image, &rates, search, |name| {
        authz.may(Op::Describe, Resource::Topic, name)
    }))
}

/// The topic, if the caller may `op` it: unknown and forbidden answer
/// alike to one who may not describe it (Kafka does not tell them apart
/// either).
pub(super) fn topic_for(
    broker: &Broker,
    authz: &Authz<'_>,
    name: &str,
    op: Op,
) -> Result<Arc<TopicImage>, Reply> {
    let image = broker.image();
    let topic = image
        .topic_by_name(name)
        .filter(|_| authz.may(Op::Describe, Resource::Topic, name))
        .ok_or_else(|| Reply::error("404 Not Found", &format!("unknown topic {name}")))?;
    if op != Op::Describe && !authz.allows(op, Resource::Topic, name) {
        return Err(Reply::error(
            "403 Forbidden",
            &format!("not allowed to {op} topic {name}"),
        ));
    }
    Ok(topic.clone())
}

#[derive(Serialize)]
struct ConfigRow {
    name: String,
    value: String,
    source: &'static str,
    doc: &'static str,
}

#[derive(Serialize)]
struct TopicPage {
    #[serde(flatten)]
    view: views::TopicView,
    /// Omitted without DESCRIBE_CONFIGS on the topic.
    configs: Option<Vec<ConfigRow>>,
}

async fn topic(broker: &Arc<Broker>, authz: &Authz<'_>, name: &str) -> Result<Reply, Reply> {
    let topic = topic_for(broker, authz, name, Op::Describe)?;
    let image = broker.image();
    let rates = broker.reported_range_rates(&image);
    let mut view = views::topic(&image, &topic, &rates);
    let offsets = log_offsets(broker, &image, &topic).await;
    for p in &mut view.partitions {
        if let Some((start, end)) = offsets.get(&p.partition) {
            p.log_start = Some(*start);
            p.log_end = Some(*end);
        }
    }
    let configs = authz
        .may(Op::DescribeConfigs, Resource::Topic, name)
        .then(|| {
            let defaults = BrokerView::new(broker.config(), &image);
            crate::topic_config::describe_topic_configs(&topic.configs, &defaults)
                .into_iter()
                .map(|c| ConfigRow {
                    name: c.name.into_owned(),
                    value: c.value,
                    source: source_name(c.source),
                    doc: c.doc,
                })
                .collect()
        });
    Ok(Reply::json(&TopicPage { view, configs }))
}

/// Kafka's names of config sources, as its tools print them.
fn source_name(source: i8) -> &'static str {
    use crate::topic_config::*;
    match source {
        SOURCE_TOPIC => "DYNAMIC_TOPIC_CONFIG",
        SOURCE_DYNAMIC_BROKER => "DYNAMIC_BROKER_CONFIG",
        SOURCE_DYNAMIC_DEFAULT_BROKER => "DYNAMIC_DEFAULT_BROKER_CONFIG",
        SOURCE_STATIC_BROKER => "STATIC_BROKER_CONFIG",
        _ => "DEFAULT_CONFIG",
    }
}

/// The leader of each partition of `topic`, as Metadata reports it.
pub(super) fn leaders(
    image: &tessera_metadata::MetadataImage,
    topic: &TopicImage,
) -> BTreeMap<i32, Vec<i32>> {
    let mut by_leader: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for p in crate::api::metadata::describe_topic(image, topic, i32::MIN).partitions {
        if p.leader_id.0 >= 0 {
            by_leader
                .entry(p.leader_id.0)
                .or_default()
                .push(p.partition_index);
        }
    }
    by_leader
}

/// One ListOffsets of `partitions` of `topic` at `timestamp` (-2 earliest,
/// -1 latest, else the first offset at or after it) to `leader`.
pub(super) async fn list_offsets(
    broker: &Broker,
    leader: i32,
    topic: &str,
    partitions: &[i32],
    timestamp: i64,
) -> BTreeMap<i32, i64> {
    let Ok(node) = Node::of(broker, leader) else {
        return BTreeMap::new();
    };
    let request = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(
                partitions
                    .iter()
                    .map(|p| {
                        ListOffsetsPartition::default()
                            .with_partition_index(*p)
                            .with_current_leader_epoch(-1)
                            .with_timestamp(timestamp)
                    })
                    .collect(),
            )]);
    let answer = ask(broker, &node, LIST_OFFSETS_VERSION, &request).await;
    match answer {
        Ok(response) => response
            .topics
            .into_iter()
            .flat_map(|t| t.partitions)
            .filter(|p| p.error_code == 0 && p.offset >= 0)
            .map(|p| (p.partition_index, p.offset))
            .collect(),
        Err(e) => {
            tracing::debug!(leader, topic, error = %e.body, "console: no offsets from the leader");
            BTreeMap::new()
        }
    }
}

/// Each partition's log start and end, asked of its leader.
async fn log_offsets(
    broker: &Arc<Broker>,
    image: &tessera_metadata::MetadataImage,
    topic: &TopicImage,
) -> BTreeMap<i32, (i64, i64)> {
    let mut asks = tokio::task::JoinSet::new();
    for (leader, partitions) in leaders(image, topic) {
        let (broker, name) = (broker.clone(), topic.name.clone());
        asks.spawn(async move {
            let start = list_offsets(&broker, leader, &name, &partitions, -2).await;
            let end = list_offsets(&broker, leader, &name, &partitions, -1).await;
            start
                .into_iter()
                .filter_map(|(p, s)| end.get(&p).map(|e| (p, (s, *e))))
                .collect::<Vec<_>>()
        });
    }
    let mut out = BTreeMap::new();
    while let Some(done) = asks.join_next().await {
        out.extend(done.unwrap_or_default());
    }
    out
}

/// A key, value or header value as the page shows it.
#[derive(Serialize, Debug, PartialEq)]
pub struct Shown {
    /// UTF-8 text, when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Hex, when it is not text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hex: Option<String>,
    pub size: usize,
    pub truncated: bool,
}

/// `bytes` shown up to `limit` bytes: as text if the shown part is UTF-8
/// (a cut inside a character moves back to its start), else as hex.
pub fn show(bytes: &[u8], limit: usize) -> Shown {
    let cut = bytes.len().min(limit);
    let truncated = cut < bytes.len();
    let text = match std::str::from_utf8(&bytes[..cut]) {
        Ok(t) => Some(t.to_string()),
        // Cut in the middle of a character: what comes before it is text.
        Err(e) if truncated && e.error_len().is_none() => {
            Some(String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned())
        }
        Err(_) => None,
    };
    let hex = text
        .is_none()
        .then(|| bytes[..cut].iter().map(|b| format!("{b:02x}")).collect());
    Shown {
        text,
        hex,
        size: bytes.len(),
        truncated,
    }
}

#[derive(Serialize, Debug)]
pub struct MessageRow {
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<Shown>,
    pub value: Option<Shown>,
    pub headers: Vec<(String, Option<Shown>)>,
}

#[derive(Serialize)]
struct MessagesPage {
    partition: i32,
    leader: i32,
    log_start: Option<i64>,
    log_end: Option<i64>,
    /// Where this page's read started.
    from: i64,
    /// Where the next page (oldest first) starts.
    next: Option<i64>,
    messages: Vec<MessageRow>,
}

fn row(r: &Record, limit: usize) -> MessageRow {
    let show_opt = |b: &Option<Bytes>| b.as_ref().map(|b| show(b, limit));
    MessageRow {
        offset: r.offset,
        timestamp: r.timestamp,
        key: show_opt(&r.key),
        value: show_opt(&r.value),
        headers: r
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), show_opt(v)))
            .collect(),
    }
}

/// Whether the key or the value contains `needle` (as text, lossily).
fn matches(r: &Record, needle: &str) -> bool {
    needle.is_empty()
        || [&r.key, &r.value]
            .into_iter()
            .flatten()
            .any(|b| String::from_utf8_lossy(b).contains(needle))
}

/// A page of one partition's messages: from `offset`, the first at or
/// after `timestamp`, the newest (`newest=true`: the last `limit` before
/// the end, newest first) or the oldest; `q` keeps those whose key or
/// value contains it; `full=true` shows keys and values whole.
async fn messages(
    broker: &Arc<Broker>,
    authz: &Authz<'_>,
    name: &str,
    partition: i32,
    query: &Query,
) -> Result<Reply, Reply> {
    let topic = topic_for(broker, authz, name, Op::Read)?;
    if !broker.config().console_messages_enable {
        return Err(Reply::error(
            "403 Forbidden",
            "message contents are hidden on this cluster (console.messages.enable=false)",
        ));
    }
    if partition < 0 || partition as u32 >= topic.partitions {
        return Err(Reply::error(
            "404 Not Found",
            &format!("{name} has no partition {partition}"),
        ));
    }
    let limit = query
        .number::<usize>("limit")?
        .unwrap_or(50)
        .clamp(1, MAX_LIMIT);
    let preview = if query.get("full") == Some("true") {
        usize::MAX
    } else {
        PREVIEW_BYTES
    };
    let needle = query.get("q").unwrap_or("");
    let newest = query.get("newest") == Some("true");
    let image = broker.image();
    let leader = leaders(&image, &topic)
        .into_iter()
        .find(|(_, ps)| ps.contains(&partition))
        .map(|(l, _)| l)
        .ok_or_else(|| {
            Reply::error(
                "503 Service Unavailable",
                &format!("{name}-{partition} has no live leader now"),
            )
        })?;
    let start = list_offsets(broker, leader, name, &[partition], -2)
        .await
        .get(&partition)
        .copied();
    let end = list_offsets(broker, leader, name, &[partition], -1)
        .await
        .get(&partition)
        .copied();
    let from = if let Some(offset) = query.number::<i64>("offset")? {
        offset
    } else if let Some(ts) = query.number::<i64>("timestamp")? {
        list_offsets(broker, leader, name, &[partition], ts)
            .await
            .get(&partition)
            .copied()
            .or(end)
            .unwrap_or(0)
    } else if newest {
        end.unwrap_or(0)
            .saturating_sub(limit as i64)
            .max(start.unwrap_or(0))
    } else {
        start.unwrap_or(0)
    };
    let (records, next) = read(broker, leader, name, partition, from, end, limit, needle).await?;
    let mut messages: Vec<MessageRow> = records.iter().map(|r| row(r, preview)).collect();
    if newest {
        messages.reverse();
    }
    Ok(Reply::json(&MessagesPage {
        partition,
        leader,
        log_start: start,
        log_end: end,
        from,
        next,
        messages,
    }))
}

/// Up to `limit` records of the partition from `from` that match `needle`,
/// fetched from `leader` as a consumer would (read_uncommitted, below the
/// high watermark); and the offset after the last one read.
#[allow(clippy::too_many_arguments)]
async fn read(
    broker: &Broker,
    leader: i32,
    topic: &str,
    partition: i32,
    from: i64,
    end: Option<i64>,
    limit: usize,
    needle: &str,
) -> Result<(Vec<Record>, Option<i64>), Reply> {
    let node = Node::of(broker, leader)?;
    let mut out = Vec::new();
    let mut offset = from;
    for _ in 0..FETCH_ROUNDS {
        if out.len() >= limit || end.is_some_and(|e| offset >= e) {
            break;
        }
        let request = crate::api::fetch::consumer_fetch(topic, partition, offset, 1 << 20);
        let response = ask(broker, &node, FETCH_VERSION, &request).await?;
        let Some(data) = response
            .responses
            .into_iter()
            .flat_map(|t| t.partitions)
            .find(|d| d.partition_index == partition)
        else {
            break;
        };
        if data.error_code != 0 {
            return Err(Reply::error(
                "502 Bad Gateway",
                &format!("broker {leader} answered error code {}", data.error_code),
            ));
        }
        let mut records = data.records.unwrap_or_default();
        if records.is_empty() {
            break;
        }
        let sets = RecordBatchDecoder::decode_all(&mut records).map_err(|e| {
            Reply::error(
                "502 Bad Gateway",
                &format!("stored batch does not decode: {e}"),
            )
        })?;
        let mut next = offset;
        for set in sets {
            for r in set.records {
                next = next.max(r.offset + 1);
                if r.offset >= offset && !r.control && out.len() < limit && matches(&r, needle) {
                    out.push(r);
                }
            }
        }
        if next <= offset {
            break;
        }
        offset = next;
    }
    let next = out.last().map_or(offset, |r| r.offset + 1);
    Ok((out, Some(next)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_shown_as_text_and_cut_at_a_character() {
        let s = show("héllo".as_bytes(), 100);
        assert_eq!(s.text.as_deref(), Some("héllo"));
        assert!(!s.truncated);
        // 'é' is two bytes: a cut after its first byte keeps "h".
        let s = show("héllo".as_bytes(), 2);
        assert_eq!(s.text.as_deref(), Some("h"));
        assert!(s.truncated);
        assert_eq!(s.size, 6);
    }

    #[test]
    fn binary_is_shown_as_hex() {
        let s = show(&[0xff, 0x00, 0x10], 100);
        assert_eq!(s.text, None);
        assert_eq!(s.hex.as_deref(), Some("ff0010"));
        assert!(!s.truncated);
    }

    #[test]
    fn queries_are_percent_decoded() {
        let q = Query::parse("search=a%2Fb+c&limit=5&bad=%zz&end=%4");
        assert_eq!(q.get("search"), Some("a/b c"));
        assert_eq!(q.number::<usize>("limit").ok().flatten(), Some(5));
        assert_eq!(q.get("bad"), Some("%zz"));
        assert_eq!(q.get("end"), Some("%4"));
        assert!(q.number::<usize>("search").is_err());
    }
}
