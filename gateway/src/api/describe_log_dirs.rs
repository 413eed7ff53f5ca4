//! DescribeLogDirs (v1-4): one log directory, the data directory, with
//! the partitions this broker holds logs for (it is the primary of their
//! range's active segment, or holds an ancestor range of theirs) and their
//! sizes.
//!
//! A range's log is shared by its partitions, but its per-partition index
//! records every stored batch's length, so a partition's size is the sum
//! of its own batches in every range of its lineage held here (frame
//! headers, 12 bytes per batch, and the index files are not counted).
//! Follower copies are not listed (they are segment replicas, not logs
//! this broker serves). offset_lag is 0 and is_future_key false: there is
//! no replica movement between log directories. Records below a log start
//! offset moved by DeleteRecords still count until retention deletes them.

use std::path::Path;
use std::sync::Arc;

use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::{DescribeLogDirsRequest, DescribeLogDirsResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use tessera_metadata::TopicImage;

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: DescribeLogDirsRequest,
) -> DescribeLogDirsResponse {
    // Kafka: DESCRIBE on the cluster.
    if let Err(e) = Authz::of(broker, ctx).cluster(Op::Describe) {
        return DescribeLogDirsResponse::default().with_error_code(e.code());
    }
    let image = broker.image();
    // `None` asks for every topic; otherwise the listed partitions (unknown
    // topics and partitions are left out, as Kafka leaves them out).
    let wanted: Vec<(Arc<TopicImage>, Vec<i32>)> = match &request.topics {
        None => image
            .topics
            .values()
            .map(|t| (t.clone(), (0..t.partitions as i32).collect()))
            .collect(),
        Some(topics) => topics
            .iter()
            .filter_map(|t| {
                let topic = image.topic_by_name(t.topic.0.as_str())?;
                Some((topic.clone(), t.partitions.clone()))
            })
            .collect(),
    };
    let mut topics = Vec::new();
    for (topic, partitions) in wanted {
        let mut described = Vec::new();
        for p in partitions {
            if p < 0 || p as u32 >= topic.partitions {
                continue;
            }
            let logs = broker.lineage(&image, &topic, p as u32);
            if logs.is_empty() {
                continue;
            }
            let size: u64 = logs
                .iter()
                .map(|log| log.partition_size(p as u32).unwrap_or(0))
                .sum();
            described.push(
                DescribeLogDirsPartition::default()
                    .with_partition_index(p)
                    .with_partition_size(size as i64)
                    .with_offset_lag(0)
                    .with_is_future_key(false),
            );
        }
        if !described.is_empty() {
            topics.push(
                DescribeLogDirsTopic::default()
                    .with_name(TopicName(StrBytes::from_string(topic.name.clone())))
                    .with_partitions(described),
            );
        }
    }
    let dir = std::fs::canonicalize(&broker.config().data_dir)
        .unwrap_or_else(|_| broker.config().data_dir.clone());
    let (total_bytes, usable_bytes) = volume_bytes(&dir);
    DescribeLogDirsResponse::default().with_results(vec![DescribeLogDirsResult::default()
        .with_log_dir(StrBytes::from_string(dir.display().to_string()))
        .with_topics(topics)
        .with_total_bytes(total_bytes)
        .with_usable_bytes(usable_bytes)])
}

/// The volume's total and usable bytes (v4+); -1 when unknown, as Kafka
/// reports an unknown volume.
fn volume_bytes(path: &Path) -> (i64, i64) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return (-1, -1);
    };
    // SAFETY: statvfs writes into the zeroed struct we own and reads the
    // NUL-terminated path, which lives across the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut st) } != 0 {
        return (-1, -1);
    }
    let frsize = st.f_frsize as u64;
    let total = (st.f_blocks as u64).saturating_mul(frsize);
    let usable = (st.f_bavail as u64).saturating_mul(frsize);
    (
        i64::try_from(total).unwrap_or(i64::MAX),
        i64::try_from(usable).unwrap_or(i64::MAX),
    )
}
