//! What a migration has done so far, per partition: shown as a progress bar
//! on a terminal (indicatif; hidden otherwise) and served as Prometheus
//! metrics on the migrator's admin port (`--admin-listener`).

use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One partition's copy.
pub struct PartitionProgress {
    pub topic: String,
    pub partition: i32,
    /// Where this run's copy started.
    pub start: AtomicI64,
    /// The next offset to copy (the target's log end).
    pub next: AtomicI64,
    /// The source's high watermark as last seen.
    pub source_end: AtomicI64,
    /// Records and bytes this run wrote.
    pub records: AtomicU64,
    pub bytes: AtomicU64,
    /// Set once cutover is asked for (continuous mode).
    pub cutover: Arc<AtomicBool>,
}

impl PartitionProgress {
    /// Offsets the target is behind the source.
    pub fn lag(&self) -> i64 {
        (self.source_end.load(Ordering::Relaxed) - self.next.load(Ordering::Relaxed)).max(0)
    }
}

/// A per-partition metric: name, type, help, value.
type Metric = (
    &'static str,
    &'static str,
    &'static str,
    fn(&PartitionProgress) -> i64,
);

/// Everything a run reports.
#[derive(Default)]
pub struct Progress {
    pub partitions: Vec<Arc<PartitionProgress>>,
    pub cutover: Arc<AtomicBool>,
    pub group_offsets_committed: AtomicU64,
    pub verified_partitions: AtomicU64,
    pub mismatched_partitions: AtomicU64,
}

impl Progress {
    pub fn add(
        &mut self,
        topic: &str,
        partition: i32,
        start: i64,
        source_end: i64,
    ) -> Arc<PartitionProgress> {
        let p = Arc::new(PartitionProgress {
            topic: topic.to_string(),
            partition,
            start: AtomicI64::new(start),
            next: AtomicI64::new(start),
            source_end: AtomicI64::new(source_end),
            records: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            cutover: self.cutover.clone(),
        });
        self.partitions.push(p.clone());
        p
    }

    pub fn bytes(&self) -> u64 {
        self.partitions
            .iter()
            .map(|p| p.bytes.load(Ordering::Relaxed))
            .sum()
    }

    pub fn records(&self) -> u64 {
        self.partitions
            .iter()
            .map(|p| p.records.load(Ordering::Relaxed))
            .sum()
    }

    pub fn max_lag(&self) -> i64 {
        self.partitions.iter().map(|p| p.lag()).max().unwrap_or(0)
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let per_partition: [Metric; 4] = [
            (
                "tessera_migrate_records_total",
                "counter",
                "Records copied to the target by this run.",
                |p| p.records.load(Ordering::Relaxed) as i64,
            ),
            (
                "tessera_migrate_bytes_total",
                "counter",
                "Record batch bytes copied to the target by this run.",
                |p| p.bytes.load(Ordering::Relaxed) as i64,
            ),
            (
                "tessera_migrate_next_offset",
                "gauge",
                "The next offset to copy (the target's log end).",
                |p| p.next.load(Ordering::Relaxed),
            ),
            (
                "tessera_migrate_lag_offsets",
                "gauge",
                "Offsets the target is behind the source's high watermark.",
                PartitionProgress::lag,
            ),
        ];
        for (name, kind, help, value) in per_partition {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for p in &self.partitions {
                let _ = writeln!(
                    out,
                    "{name}{{topic=\"{}\",partition=\"{}\"}} {}",
                    p.topic,
                    p.partition,
                    value(p)
                );
            }
        }
        for (name, help, value) in [
            (
                "tessera_migrate_group_offsets_committed_total",
                "Group offsets committed on the target.",
                &self.group_offsets_committed,
            ),
            (
                "tessera_migrate_verified_partitions",
                "Partitions whose count and checksum matched.",
                &self.verified_partitions,
            ),
            (
                "tessera_migrate_mismatched_partitions",
                "Partitions whose verification failed.",
                &self.mismatched_partitions,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}",
                value.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP tessera_migrate_cutover Whether cutover was asked for.\n# TYPE tessera_migrate_cutover gauge\ntessera_migrate_cutover {}",
            u8::from(self.cutover.load(Ordering::Relaxed))
        );
        out
    }
}

/// Serves `GET /metrics` for the migrator.
pub async fn serve_metrics(listener: TcpListener, progress: Arc<Progress>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let progress = progress.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            let n = stream.read(&mut buf).await.unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]);
            let (status, body) = if head.starts_with("GET /metrics") {
                ("200 OK", progress.render())
            } else if head.starts_with("GET /health") {
                ("200 OK", "ok\n".to_string())
            } else {
                ("404 Not Found", "not found\n".to_string())
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}

/// Draws the progress bar until `done` is set (hidden unless stderr is a terminal).
pub async fn draw(progress: Arc<Progress>, done: Arc<AtomicBool>) {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} offsets {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let started = Instant::now();
    while !done.load(Ordering::Relaxed) {
        let (mut pos, mut len) = (0u64, 0u64);
        for p in &progress.partitions {
            let start = p.start.load(Ordering::Relaxed);
            pos += (p.next.load(Ordering::Relaxed) - start).max(0) as u64;
            len += (p.source_end.load(Ordering::Relaxed) - start).max(0) as u64;
        }
        bar.set_length(len.max(pos));
        bar.set_position(pos);
        let mb = progress.bytes() as f64 / 1e6;
        let secs = started.elapsed().as_secs_f64().max(0.001);
        bar.set_message(format!(
            "{} records, {mb:.1} MB ({:.1} MB/s), max lag {}{}",
            progress.records(),
            mb / secs,
            progress.max_lag(),
            if progress.cutover.load(Ordering::Relaxed) {
                ", cutting over"
            } else {
                ""
            }
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bar.finish_and_clear();
}
