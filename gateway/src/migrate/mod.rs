//! `tessera migrate`: copies topics and consumer groups' committed offsets
//! from any Kafka-wire cluster into tessera, every record at its original
//! offset (see docs/MIGRATION.md for the cutover steps).
//!
//! A run: select topics and groups by regex; check every selected topic on
//! the target before writing anything (partition counts, and for data
//! already there: that it ends no later than the source and that its first
//! and last batches hold the source's records); create the missing topics
//! with the source's partition counts and configs; copy each partition from
//! the target's own log end (so a restarted run resumes where the last one
//! stopped, and the target refuses any batch below its end: nothing is
//! written twice) to the source's end, or in continuous mode until cutover;
//! commit the groups' offsets; verify every partition (record count and
//! checksum over the same span on both sides); exit 0 only if all match.

pub mod client;
pub mod groups;
pub mod legacy;
pub mod partition;
pub mod plan;
pub mod progress;
pub mod security;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::{CreateTopicsRequest, DescribeConfigsRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::Semaphore;

use self::client::{ClusterView, Conn};
use self::partition::Until;
use self::plan::{GroupOffsets, Span, Verdict};
use self::progress::Progress;
use self::security::ClientSecurity;
use crate::error::MigrateError;

/// `tessera migrate` options.
#[derive(clap::Args, Debug, Clone)]
pub struct MigrateArgs {
    /// Bootstrap servers of the source cluster (`host:port,...`).
    #[arg(long)]
    pub source: Option<String>,
    /// Bootstrap servers of the target tessera (started with
    /// `migration.append.enable=true`).
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub target: String,
    /// How to reach the source, in librdkafka's client keys, repeatable:
    /// `security.protocol` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL),
    /// `sasl.mechanism` (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512),
    /// `sasl.username`, `sasl.password`, `ssl.ca.location`,
    /// `ssl.certificate.location`, `ssl.key.location`,
    /// `ssl.endpoint.identification.algorithm` (https or none).
    #[arg(long = "source-config", value_name = "KEY=VALUE")]
    pub source_config: Vec<String>,
    /// How to reach the target (keys as `--source-config`).
    #[arg(long = "target-config", value_name = "KEY=VALUE")]
    pub target_config: Vec<String>,
    /// Topics to copy: a regular expression matching whole names
    /// (internal topics are never copied).
    #[arg(long, default_value = ".*")]
    pub topics: String,
    /// Consumer groups whose committed offsets to copy (whole-name regex;
    /// "" copies none).
    #[arg(long, default_value = ".*")]
    pub groups: String,
    /// Tail the source until cutover (`tessera migrate cutover`, i.e. the
    /// cutover file appears), keeping group offsets in step.
    #[arg(long)]
    pub continuous: bool,
    /// Only verify (counts and checksums per partition); write nothing.
    #[arg(long)]
    pub verify_only: bool,
    /// The file whose existence asks a continuous run to cut over.
    #[arg(long, default_value = "tessera-migrate.cutover")]
    pub cutover_file: PathBuf,
    /// Serve the migrator's Prometheus metrics (`GET /metrics`) here.
    #[arg(long)]
    pub admin_listener: Option<String>,
    /// Replication factor of the topics created on the target (-1: the
    /// target's default.replication.factor).
    #[arg(long, default_value_t = -1)]
    pub replication_factor: i16,
    /// Partitions copied at once.
    #[arg(long, default_value_t = 16)]
    pub parallelism: usize,
    /// Continuous mode: how often group offsets are copied again.
    #[arg(long, default_value_t = 1000)]
    pub group_sync_ms: u64,
}

/// What a run did.
#[derive(Debug, Default)]
pub struct Report {
    pub topics: Vec<String>,
    pub partitions: usize,
    pub records: u64,
    pub bytes: u64,
    pub elapsed: Duration,
    pub groups: Vec<String>,
    pub group_offsets: u64,
    pub verdicts: Vec<Verdict>,
}

/// One partition to copy.
struct Job {
    topic: String,
    partition: i32,
    source: Span,
    next: i64,
}

/// Runs a migration as the options say.
pub async fn run(args: &MigrateArgs) -> Result<Report, MigrateError> {
    let started = Instant::now();
    let source_servers = args
        .source
        .as_deref()
        .ok_or_else(|| MigrateError::Argument("--source is required".into()))?;
    let topic_re = plan::whole_match(&args.topics)
        .map_err(|e| MigrateError::Argument(format!("--topics: {e}")))?;
    let group_re = (!args.groups.is_empty())
        .then(|| plan::whole_match(&args.groups))
        .transpose()
        .map_err(|e| MigrateError::Argument(format!("--groups: {e}")))?;

    let source_security = Arc::new(ClientSecurity::parse(
        "--source-config",
        &args.source_config,
    )?);
    let target_security = Arc::new(ClientSecurity::parse(
        "--target-config",
        &args.target_config,
    )?);
    let mut source = client::bootstrap(source_servers, source_security).await?;
    let source_view = client::cluster_view(&mut source, None).await?;
    let topics = plan::select_topics(source_view.topics.keys(), &topic_re);
    let mut target = client::bootstrap(&args.target, target_security).await?;
    let target_view = client::cluster_view(&mut target, Some(&topics)).await?;

    // Every check before any write.
    let mut jobs = Vec::new();
    let mut to_create = Vec::new();
    for topic in &topics {
        let count = source_view.topics[topic].len();
        match target_view.topics.get(topic) {
            Some(t) if t.len() != count => {
                return Err(MigrateError::TargetConflict {
                    topic: topic.clone(),
                    reason: format!("it has {} partitions, the source {count}", t.len()),
                })
            }
            Some(_) => {}
            None if args.verify_only => {
                return Err(MigrateError::TargetConflict {
                    topic: topic.clone(),
                    reason: "it does not exist on the target".into(),
                })
            }
            None => to_create.push(topic.clone()),
        }
        for partition in 0..count as i32 {
            let mut s = source_view.connect_leader(topic, partition).await?;
            let span = partition::span(&mut s, topic, partition).await?;
            let next = if target_view.topics.contains_key(topic) {
                let mut t = target_view.connect_leader(topic, partition).await?;
                let target_span = partition::span(&mut t, topic, partition).await?;
                let next = plan::resume_point(span, target_span.end).map_err(|reason| {
                    MigrateError::TargetConflict {
                        topic: topic.clone(),
                        reason: format!("partition {partition}: {reason}"),
                    }
                })?;
                if !args.verify_only {
                    check_same_data(&mut s, &mut t, topic, partition, span, target_span).await?;
                }
                next
            } else {
                span.start
            };
            jobs.push(Job {
                topic: topic.clone(),
                partition,
                source: span,
                next,
            });
        }
    }

    let mut progress = Progress::default();
    let handles: Vec<_> = jobs
        .iter()
        .map(|j| progress.add(&j.topic, j.partition, j.next, j.source.end))
        .collect();
    let progress = Arc::new(progress);
    if let Some(addr) = &args.admin_listener {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| MigrateError::Argument(format!("--admin-listener {addr}: {e}")))?;
        tokio::spawn(progress::serve_metrics(listener, progress.clone()));
    }
    let drawn = Arc::new(AtomicBool::new(false));
    tokio::spawn(progress::draw(progress.clone(), drawn.clone()));

    let mut group_ids = match &group_re {
        Some(re) => groups::list(&source_view, re).await?,
        None => Vec::new(),
    };
    let topic_counts: HashMap<String, usize> = topics
        .iter()
        .map(|t| (t.clone(), source_view.topics[t].len()))
        .collect();

    let mut ends: HashMap<(String, i32), i64> = jobs
        .iter()
        .map(|j| ((j.topic.clone(), j.partition), j.source.end))
        .collect();
    let mut group_offsets = 0u64;
    if !args.verify_only {
        for topic in &to_create {
            create_topic(
                &mut source,
                &mut target,
                topic,
                topic_counts[topic],
                args.replication_factor,
            )
            .await?;
        }
        let target_view = refreshed(&mut target, &topics).await?;
        // Copy the partitions, at most `parallelism` at once.
        let permits = Arc::new(Semaphore::new(args.parallelism.max(1)));
        let mut tasks = Vec::new();
        for (job, handle) in jobs.iter().zip(&handles) {
            let until = if args.continuous {
                Until::Cutover
            } else {
                Until::Offset(job.source.end)
            };
            let permits = permits.clone();
            let handle = handle.clone();
            let source_addr = source_view.leader(&job.topic, job.partition)?;
            let target_addr = target_view.leader(&job.topic, job.partition)?;
            let (source_security, target_security) =
                (source_view.security.clone(), target_view.security.clone());
            let (topic, partition, next) = (job.topic.clone(), job.partition, job.next);
            tasks.push(tokio::spawn(async move {
                let _permit = permits.acquire_owned().await;
                let s = Conn::connect_with(&source_addr, source_security).await?;
                let t = Conn::connect_with(&target_addr, target_security).await?;
                partition::copy(s, t, &topic, partition, next, until, handle).await
            }));
        }
        // Continuous mode: keep group offsets in step until cutover.
        let mut copied: HashMap<String, GroupOffsets> = HashMap::new();
        if args.continuous {
            while !progress.cutover.load(Ordering::Relaxed) {
                // Groups created on the source since the start come along.
                if let Some(re) = &group_re {
                    group_ids = groups::list(&source_view, re).await?;
                }
                group_offsets += sync_groups(
                    &mut source,
                    &mut target,
                    &group_ids,
                    &topic_counts,
                    &mut copied,
                    true,
                )
                .await?;
                progress
                    .group_offsets_committed
                    .store(group_offsets, Ordering::Relaxed);
                let deadline = Instant::now() + Duration::from_millis(args.group_sync_ms);
                while Instant::now() < deadline {
                    if args.cutover_file.exists() {
                        tracing::info!(
                            "cutover asked: copying up to the source's end, then verifying"
                        );
                        progress.cutover.store(true, Ordering::Relaxed);
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        for (task, job) in tasks.into_iter().zip(&jobs) {
            let end = task
                .await
                .map_err(|e| MigrateError::Argument(format!("copy task: {e}")))??;
            ends.insert((job.topic.clone(), job.partition), end.max(job.next));
        }
        if let (true, Some(re)) = (args.continuous, &group_re) {
            group_ids = groups::list(&source_view, re).await?;
        }
        group_offsets += sync_groups(
            &mut source,
            &mut target,
            &group_ids,
            &topic_counts,
            &mut copied,
            false,
        )
        .await?;
        progress
            .group_offsets_committed
            .store(group_offsets, Ordering::Relaxed);
    }

    // Verification over the span both sides should hold.
    let target_view = refreshed(&mut target, &topics).await?;
    let mut verdicts = Vec::new();
    for job in &jobs {
        let mut s = source_view
            .connect_leader(&job.topic, job.partition)
            .await?;
        let mut t = target_view
            .connect_leader(&job.topic, job.partition)
            .await?;
        let source_span = partition::span(&mut s, &job.topic, job.partition).await?;
        let target_span = partition::span(&mut t, &job.topic, job.partition).await?;
        let end = if args.verify_only {
            source_span.end
        } else {
            ends[&(job.topic.clone(), job.partition)]
        };
        let span = Span {
            start: source_span.start.max(target_span.start),
            end,
        };
        let source_digest = partition::digest(&mut s, &job.topic, job.partition, span).await?;
        let (target_digest, mut mismatch) =
            match partition::digest(&mut t, &job.topic, job.partition, span).await {
                Ok(d) => (d, plan::judge(end, target_span.end, source_digest, d)),
                Err(e) => (Default::default(), Some(e.to_string())),
            };
        // A compacted source cleaned after the copy: the target may keep
        // records the source has since removed, and only those.
        let mut superseded = 0;
        if mismatch.is_some()
            && target_span.end == end
            && is_compacted(&topic_configs(&mut s, &job.topic).await?)
        {
            let on_source = partition::summaries(&mut s, &job.topic, job.partition, span).await?;
            let on_target = partition::summaries(&mut t, &job.topic, job.partition, span).await?;
            match plan::judge_superseded(&on_source, &on_target) {
                Ok(kept) => {
                    superseded = kept;
                    mismatch = None;
                }
                Err(why) => {
                    mismatch = Some(format!(
                        "{} (record by record: {why})",
                        mismatch.unwrap_or_default()
                    ))
                }
            }
        }
        let counter = if mismatch.is_some() {
            &progress.mismatched_partitions
        } else {
            &progress.verified_partitions
        };
        counter.fetch_add(1, Ordering::Relaxed);
        verdicts.push(Verdict {
            topic: job.topic.clone(),
            partition: job.partition,
            span,
            source: source_digest,
            target: target_digest,
            mismatch,
            superseded,
        });
    }
    drawn.store(true, Ordering::Relaxed);
    if args.continuous {
        let _ = std::fs::remove_file(&args.cutover_file);
    }
    Ok(Report {
        topics,
        partitions: jobs.len(),
        records: progress.records(),
        bytes: progress.bytes(),
        elapsed: started.elapsed(),
        groups: group_ids,
        group_offsets,
        verdicts,
    })
}

/// The target's metadata for `topics`, waiting until every partition has
/// a leader (a topic just created may not have one yet).
async fn refreshed(target: &mut Conn, topics: &[String]) -> Result<ClusterView, MigrateError> {
    let mut view = client::cluster_view(target, Some(topics)).await?;
    for _ in 0..100 {
        let ready = topics.iter().all(|t| {
            view.topics
                .get(t)
                .is_some_and(|ps| ps.iter().all(|l| view.brokers.contains_key(l)))
        });
        if ready {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        view = client::cluster_view(target, Some(topics)).await?;
    }
    Ok(view)
}

/// A target partition that already holds data must hold the source's: its
/// first and last batches' records must match the source's at the same
/// offsets (the full comparison is the verification at the end).
async fn check_same_data(
    source: &mut Conn,
    target: &mut Conn,
    topic: &str,
    partition: i32,
    source_span: Span,
    target_span: Span,
) -> Result<(), MigrateError> {
    let lo = source_span.start.max(target_span.start);
    if target_span.end <= lo {
        return Ok(());
    }
    for at in [lo, target_span.end - 1] {
        let first_batch = |records: bytes::Bytes| -> Result<Option<plan::SourceBatch>, String> {
            Ok(plan::source_batches(&records)?.into_iter().next())
        };
        let (s, _) =
            partition::fetch(source, topic, partition, at, partition::DATA_WAIT_MS).await?;
        let (t, _) =
            partition::fetch(target, topic, partition, at, partition::DATA_WAIT_MS).await?;
        // Over the offsets both first batches cover (an up-converted legacy
        // source groups its records in batches of its own).
        let compare = |s: Option<plan::SourceBatch>, t: Option<plan::SourceBatch>| {
            let end = [&s, &t]
                .iter()
                .filter_map(|b| b.as_ref().map(|b| b.header.last_offset() + 1))
                .min()
                .unwrap_or(at)
                .min(target_span.end);
            let span = Span { start: at, end };
            let digest = |b: Option<plan::SourceBatch>| -> Result<plan::Digest, String> {
                let mut d = plan::Digest::default();
                if let Some(b) = b {
                    d.add_batch(&b.bytes, span)?;
                }
                Ok(d)
            };
            (digest(s), digest(t))
        };
        let (s, t) = match (first_batch(s), first_batch(t)) {
            (Ok(s), Ok(t)) => compare(s, t),
            (s, t) => (s.map(|_| Default::default()), t.map(|_| Default::default())),
        };
        if s.is_err() || t.is_err() || s != t {
            return Err(MigrateError::TargetConflict {
                topic: topic.to_string(),
                reason: format!(
                    "partition {partition} already holds data that differs from the source's \
                     at offset {at}; delete the topic on the target or choose another target"
                ),
            });
        }
    }
    Ok(())
}

/// Creates `topic` on the target with the source's partition count and
/// the configs the source sets on it. Configs the target refuses are
/// dropped with a warning (found one by one with validate_only).
async fn create_topic(
    source: &mut Conn,
    target: &mut Conn,
    topic: &str,
    partitions: usize,
    replication_factor: i16,
) -> Result<(), MigrateError> {
    let configs = topic_configs(source, topic).await?;
    let request = |configs: &[(String, String)], validate_only: bool| {
        CreateTopicsRequest::default()
            .with_timeout_ms(30_000)
            .with_validate_only(validate_only)
            .with_topics(vec![CreatableTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_num_partitions(partitions as i32)
                .with_replication_factor(replication_factor)
                .with_configs(
                    configs
                        .iter()
                        .map(|(k, v)| {
                            CreatableTopicConfig::default()
                                .with_name(StrBytes::from_string(k.clone()))
                                .with_value(Some(StrBytes::from_string(v.clone())))
                        })
                        .collect(),
                )])
    };
    let mut accepted = Vec::new();
    for config in &configs {
        let response = target
            .call(&request(std::slice::from_ref(config), true))
            .await?;
        match response.topics.first().map(|t| t.error_code) {
            Some(0) => accepted.push(config.clone()),
            _ => {
                tracing::warn!(topic, key = %config.0, value = %config.1, "the target refuses this topic config; the topic is created without it")
            }
        }
    }
    let response = target.call(&request(&accepted, false)).await?;
    for t in &response.topics {
        if t.error_code != 0 {
            return Err(target.broker_error(
                &format!("CreateTopics {topic}"),
                t.error_code,
                t.error_message.as_ref(),
            ));
        }
    }
    Ok(())
}

/// Whether `cleanup.policy` among `configs` includes `compact`.
fn is_compacted(configs: &[(String, String)]) -> bool {
    configs
        .iter()
        .any(|(k, v)| k == "cleanup.policy" && v.split(',').any(|p| p.trim() == "compact"))
}

/// The configs the source sets on `topic` (DescribeConfigs, source
/// DYNAMIC_TOPIC_CONFIG).
async fn topic_configs(
    source: &mut Conn,
    topic: &str,
) -> Result<Vec<(String, String)>, MigrateError> {
    const TOPIC: i8 = 2;
    const DYNAMIC_TOPIC_CONFIG: i8 = 1;
    const SHORT_CONFIG_LIST: usize = 20;
    let request =
        DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(TOPIC)
            .with_resource_name(StrBytes::from_string(topic.to_string()))
            .with_configuration_keys(None)]);
    let response = source.call(&request).await?;
    let mut out = Vec::new();
    for r in &response.results {
        if r.error_code != 0 {
            return Err(source.broker_error(
                &format!("DescribeConfigs {topic}"),
                r.error_code,
                r.error_message.as_ref(),
            ));
        }
        // Kafka lists every topic key (30+) and marks those set on the topic
        // DYNAMIC_TOPIC_CONFIG; a broker that lists only the keys set on
        // the topic (tansu marks them DEFAULT_CONFIG) is taken at its word.
        let lists_only_set_keys = r.configs.len() < SHORT_CONFIG_LIST
            && r.configs
                .iter()
                .all(|c| c.config_source != DYNAMIC_TOPIC_CONFIG);
        for c in &r.configs {
            if (c.config_source == DYNAMIC_TOPIC_CONFIG || lists_only_set_keys) && !c.is_sensitive {
                if let Some(v) = &c.value {
                    out.push((c.name.to_string(), v.to_string()));
                }
            }
        }
    }
    Ok(out)
}

/// Copies the groups' committed offsets that changed since the last copy.
/// While tailing (`tolerant`), a group whose target commit is refused (its
/// consumers already moved to the target) is left alone. Returns how many
/// offsets were committed.
async fn sync_groups(
    source: &mut Conn,
    target: &mut Conn,
    group_ids: &[String],
    topics: &HashMap<String, usize>,
    copied: &mut HashMap<String, GroupOffsets>,
    tolerant: bool,
) -> Result<u64, MigrateError> {
    let mut committed = 0;
    for group in group_ids {
        let mut from = groups::coordinator(source, group).await?;
        let offsets = groups::fetch_offsets(&mut from, group, topics).await?;
        let last = copied.entry(group.clone()).or_default();
        let changed = plan::changed_offsets(&offsets, last);
        if changed.is_empty() {
            continue;
        }
        let mut to = groups::coordinator(target, group).await?;
        match groups::commit(&mut to, group, &changed).await {
            Ok(()) => {
                committed += changed.len() as u64;
                last.extend(changed);
            }
            Err(e) if tolerant => {
                tracing::warn!(group, error = %e, "group offsets not copied this round")
            }
            Err(e) => return Err(e),
        }
    }
    Ok(committed)
}

/// Prints the report (one line per mismatching partition) and returns the
/// exit status.
pub fn print_report(report: &Report) -> i32 {
    let mb = report.bytes as f64 / 1e6;
    let secs = report.elapsed.as_secs_f64().max(0.001);
    println!(
        "copied {} records, {mb:.1} MB in {secs:.1} s ({:.1} MB/s) over {} partition(s) of {} topic(s); {} offset(s) of {} group(s) committed",
        report.records,
        mb / secs,
        report.partitions,
        report.topics.len(),
        report.group_offsets,
        report.groups.len(),
    );
    let bad: Vec<&Verdict> = report
        .verdicts
        .iter()
        .filter(|v| v.mismatch.is_some())
        .collect();
    for v in &bad {
        println!(
            "MISMATCH {}-{} offsets [{}, {}): {}",
            v.topic,
            v.partition,
            v.span.start,
            v.span.end,
            v.mismatch.as_deref().unwrap_or_default()
        );
    }
    let records: u64 = report.verdicts.iter().map(|v| v.source.records).sum();
    let superseded: usize = report.verdicts.iter().map(|v| v.superseded).sum();
    if bad.is_empty() && superseded > 0 {
        println!(
            "verified {} partition(s): {records} records match record by record; the target also keeps \
             {superseded} superseded record(s) the source's cleaner removed after the copy \
             (its own cleaner removes them)",
            report.verdicts.len()
        );
        0
    } else if bad.is_empty() {
        println!(
            "verified {} partition(s): {records} records, counts and checksums match",
            report.verdicts.len()
        );
        0
    } else {
        eprintln!("{}", MigrateError::VerificationFailed(bad.len()));
        1
    }
}
