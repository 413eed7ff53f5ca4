//! A load driver in the shape of the OpenMessaging Benchmark's Kafka
//! workloads (issue 28): producers at a target rate over one topic, a
//! consumer group reading it back, produce latency (send to delivery
//! report) and end-to-end latency (send to receipt by a consumer) as
//! HdrHistogram percentiles. Not a test; `bench/latency.sh` drives it
//! against tessera and tansu.
//!
//! ```text
//! cargo run --release -p tessera-compat-tests --example latency -- \
//!     --bootstrap 127.0.0.1:9092 --topic t --rate 50000 --seconds 20
//! ```
//!
//! `--rate 0` produces flat out (the maximum sustainable rate is what the
//! consumers keep up with, reported as `consumed_per_s`). Each record's
//! first 8 bytes are its send time in microseconds since the epoch, so
//! end-to-end latency needs producers and consumers on one clock (one
//! host). Records sent during the warm-up are not counted. Prints one
//! JSON object.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;

struct Args {
    bootstrap: String,
    topic: String,
    size: usize,
    producers: usize,
    consumers: usize,
    /// Records per second over all producers; 0 = as fast as they can.
    rate: u64,
    seconds: u64,
    warmup: u64,
    linger_ms: u64,
    acks: String,
    compression: String,
    /// librdkafka's `queue.buffering.max.kbytes` per producer (its default
    /// when unset): many producers flat out would otherwise queue a GiB each.
    queue_kbytes: Option<u64>,
}

fn parse_args() -> Args {
    let mut a = Args {
        bootstrap: "127.0.0.1:9092".into(),
        topic: "latency".into(),
        size: 1024,
        producers: 2,
        consumers: 2,
        rate: 0,
        seconds: 20,
        warmup: 5,
        linger_ms: 5,
        acks: "all".into(),
        compression: "none".into(),
        queue_kbytes: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--bootstrap" => a.bootstrap = value(),
            "--topic" => a.topic = value(),
            "--size" => a.size = value().parse().expect("--size"),
            "--producers" => a.producers = value().parse().expect("--producers"),
            "--consumers" => a.consumers = value().parse().expect("--consumers"),
            "--rate" => a.rate = value().parse().expect("--rate"),
            "--seconds" => a.seconds = value().parse().expect("--seconds"),
            "--warmup" => a.warmup = value().parse().expect("--warmup"),
            "--linger-ms" => a.linger_ms = value().parse().expect("--linger-ms"),
            "--acks" => a.acks = value(),
            "--compression" => a.compression = value(),
            "--queue-kbytes" => a.queue_kbytes = Some(value().parse().expect("--queue-kbytes")),
            other => panic!("unknown flag {other} (see the module docs)"),
        }
    }
    assert!(a.size >= 8, "--size must hold the 8-byte send time");
    a
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as u64
}

fn histogram() -> Histogram<u64> {
    // Microseconds, up to 10 minutes, 3 significant figures.
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("histogram bounds")
}

/// The measured window of send times (µs since the epoch), set once the
/// consumers are assigned: records sent before it are the warm-up, after
/// it the drain.
struct Window {
    from: AtomicU64,
    until: AtomicU64,
}

impl Window {
    fn contains(&self, sent_us: u64) -> bool {
        sent_us >= self.from.load(Ordering::Relaxed) && sent_us < self.until.load(Ordering::Relaxed)
    }
}

/// Records the produce latency of every delivery sent in the window.
struct Deliveries {
    window: Arc<Window>,
    latency: Mutex<Histogram<u64>>,
    failed: AtomicU64,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    /// The record's send time, µs since the epoch.
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, sent_us: usize) {
        if result.is_err() {
            self.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let sent_us = sent_us as u64;
        if self.window.contains(sent_us) {
            let _ = self
                .latency
                .lock()
                .unwrap()
                .record(now_us().saturating_sub(sent_us).max(1));
        }
    }
}

fn percentiles(h: &Histogram<u64>) -> serde_like::Object {
    let ms = |us: u64| us as f64 / 1000.0;
    serde_like::Object(vec![
        ("count", h.len().to_string()),
        ("p50_ms", format!("{:.3}", ms(h.value_at_quantile(0.50)))),
        ("p99_ms", format!("{:.3}", ms(h.value_at_quantile(0.99)))),
        ("p999_ms", format!("{:.3}", ms(h.value_at_quantile(0.999)))),
        ("max_ms", format!("{:.3}", ms(h.max()))),
    ])
}

/// Just enough JSON for one flat report (no serde in this crate).
mod serde_like {
    pub struct Object(pub Vec<(&'static str, String)>);

    impl std::fmt::Display for Object {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{{")?;
            for (i, (k, v)) in self.0.iter().enumerate() {
                let quoted = v.parse::<f64>().is_err() && !v.starts_with('{');
                let sep = if i == 0 { "" } else { ", " };
                if quoted {
                    write!(f, "{sep}\"{k}\": \"{v}\"")?;
                } else {
                    write!(f, "{sep}\"{k}\": {v}")?;
                }
            }
            write!(f, "}}")
        }
    }
}

fn main() {
    let args = parse_args();
    let stop = Arc::new(AtomicBool::new(false));
    let window = Arc::new(Window {
        from: AtomicU64::new(u64::MAX),
        until: AtomicU64::new(u64::MAX),
    });
    let group = format!("latency-{}-{}", std::process::id(), now_us());

    // Consumers first: they join the group and are assigned every
    // partition before the first record is sent.
    let consumed = Arc::new(AtomicU64::new(0));
    let e2e = Arc::new(Mutex::new(histogram()));
    let mut consumers = Vec::new();
    let assigned = Arc::new(AtomicU64::new(0));
    for _ in 0..args.consumers {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &args.bootstrap)
            .set("group.id", &group)
            .set("auto.offset.reset", "latest")
            .set("enable.auto.commit", "true")
            .set("fetch.wait.max.ms", "100")
            .create()
            .expect("consumer");
        consumer.subscribe(&[&args.topic]).expect("subscribe");
        let (stop, consumed, e2e, assigned, window) = (
            stop.clone(),
            consumed.clone(),
            e2e.clone(),
            assigned.clone(),
            window.clone(),
        );
        consumers.push(std::thread::spawn(move || {
            let mut mine = histogram();
            let mut counted_assignment = false;
            while !stop.load(Ordering::Relaxed) {
                match consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(m)) => {
                        let now = now_us();
                        if let Some(p) = m.payload().filter(|p| p.len() >= 8) {
                            let sent = u64::from_be_bytes(p[..8].try_into().unwrap());
                            if window.contains(sent) {
                                consumed.fetch_add(1, Ordering::Relaxed);
                                let _ = mine.record(now.saturating_sub(sent).max(1));
                            }
                        }
                    }
                    Some(Err(e)) => eprintln!("consumer: {e}"),
                    None => {}
                }
                if !counted_assignment && consumer.assignment().is_ok_and(|a| a.count() > 0) {
                    counted_assignment = true;
                    assigned.fetch_add(1, Ordering::Relaxed);
                }
            }
            e2e.lock().unwrap().add(&mine).expect("same bounds");
            // Leaving the group could wait on a busy coordinator; the group
            // is this run's alone, so its session just expires.
            std::mem::forget(consumer);
        }));
    }
    let waited = Instant::now();
    while assigned.load(Ordering::Relaxed) == 0 && waited.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    // The rest of the group settles during the warm-up.
    let from = now_us() + args.warmup * 1_000_000;
    window.from.store(from, Ordering::Relaxed);
    window
        .until
        .store(from + args.seconds * 1_000_000, Ordering::Relaxed);

    let deliveries = Arc::new(Mutex::new(Vec::new()));
    let sent = Arc::new(AtomicU64::new(0));
    let mut producers = Vec::new();
    let per_producer = args.rate as f64 / args.producers as f64;
    let run_until = Instant::now() + Duration::from_secs(args.warmup + args.seconds);
    for _ in 0..args.producers {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &args.bootstrap)
            .set("acks", &args.acks)
            .set("linger.ms", args.linger_ms.to_string())
            .set("compression.type", &args.compression);
        if args.size > 900_000 {
            // librdkafka refuses records above its 1,000,000-byte default.
            config.set("message.max.bytes", (2 * args.size).to_string());
        }
        if let Some(kbytes) = args.queue_kbytes {
            config.set("queue.buffering.max.kbytes", kbytes.to_string());
        }
        let producer: ThreadedProducer<Deliveries> = config
            .create_with_context(Deliveries {
                window: window.clone(),
                latency: Mutex::new(histogram()),
                failed: AtomicU64::new(0),
            })
            .expect("producer");
        let (topic, size, sent, deliveries) = (
            args.topic.clone(),
            args.size,
            sent.clone(),
            deliveries.clone(),
        );
        producers.push(std::thread::spawn(move || {
            let mut payload = vec![b'x'; size];
            let began = Instant::now();
            let mut n: u64 = 0;
            while Instant::now() < run_until {
                if per_producer > 0.0 {
                    // Paced: send every record that is due, then sleep
                    // until the next one is.
                    let due = began + Duration::from_secs_f64(n as f64 / per_producer);
                    let now = Instant::now();
                    if due > now {
                        // Until the next record is due (a thousand slow
                        // producers must not wake a thousand times a second).
                        std::thread::sleep((due - now).min(Duration::from_millis(100)));
                        continue;
                    }
                }
                let at = now_us();
                payload[..8].copy_from_slice(&at.to_be_bytes());
                let record = BaseRecord::<(), [u8], usize>::with_opaque_to(&topic, at as usize)
                    .payload(&payload[..]);
                match producer.send(record) {
                    Ok(()) => n += 1,
                    Err(_) => std::thread::sleep(Duration::from_millis(1)), // queue full
                }
            }
            sent.fetch_add(n, Ordering::Relaxed);
            let _ = producer.flush(Duration::from_secs(60));
            let context = producer.context();
            let latency = context.latency.lock().unwrap().clone();
            deliveries
                .lock()
                .unwrap()
                .push((latency, context.failed.load(Ordering::Relaxed)));
            // Flushed (or given up on) above: no close that could wait again.
            std::mem::forget(producer);
        }));
    }
    for p in producers {
        p.join().expect("producer thread");
    }
    // Let the consumers read what was acknowledged last.
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    for c in consumers {
        c.join().expect("consumer thread");
    }

    let mut produce = histogram();
    let mut failed = 0;
    for (h, f) in deliveries.lock().unwrap().iter() {
        produce.add(h).expect("same bounds");
        failed += f;
    }
    let e2e = e2e.lock().unwrap();
    let measured = args.seconds as f64;
    let report = serde_like::Object(vec![
        ("target_per_s", args.rate.to_string()),
        (
            "produced_per_s",
            format!("{:.0}", produce.len() as f64 / measured),
        ),
        (
            "consumed_per_s",
            format!("{:.0}", e2e.len() as f64 / measured),
        ),
        ("sent", sent.load(Ordering::Relaxed).to_string()),
        ("failed", failed.to_string()),
        ("produce", percentiles(&produce).to_string()),
        ("end_to_end", percentiles(&e2e).to_string()),
    ]);
    println!("{report}");
}
