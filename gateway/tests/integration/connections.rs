//! What one connection may hold, against an in-process broker over raw
//! sockets: `connections.max.idle.ms` closes an idle connection and one
//! trickling a request byte by byte (slowloris) while a busy client on the
//! same broker is served throughout; `max.connections.per.ip` (with its
//! per-address overrides) closes the connection over the limit at once; `sasl.server.max.receive.size` caps
//! what a client may send before it authenticates.

use crate::common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{test_config, WireClient};
use kafka_protocol::messages::ApiVersionsRequest;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

async fn api_versions_ok(client: &mut WireClient) {
    let r = client.call(3, &ApiVersionsRequest::default()).await;
    assert_eq!(r.error_code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_connections_are_closed_and_others_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(dir.path(), &[("connections.max.idle.ms", "700")]);
    let running = tessera_gateway::start(config).await.unwrap();
    let addr = running.kafka_addr;

    // Idle: connects and sends nothing.
    let mut idle = WireClient::connect(addr).await;
    // Slowloris: announces a 1 MB request and sends one byte every 100 ms,
    // never finishing it in time.
    let slow = tokio::spawn(async move {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&(1_000_000i32).to_be_bytes()).await.unwrap();
        for sent in 0..200u32 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if s.write_all(&[0]).await.is_err() {
                return Some(sent);
            }
        }
        None
    });
    // A busy client: a request every 100 ms for 3 s, each answered.
    let mut busy = WireClient::connect(addr).await;
    for _ in 0..30 {
        api_versions_ok(&mut busy).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(idle.is_closed().await, "the idle connection was closed");
    let sent = slow.await.unwrap();
    assert!(
        sent.is_some(),
        "the trickling connection was closed before it finished its frame"
    );
    api_versions_ok(&mut busy).await;
    let metrics = &running.broker.metrics();
    assert!(metrics.connections_idle_closed.load(Ordering::Relaxed) >= 2);
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_per_ip_limit_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    // One per address, but three for loopback (Kafka's override form).
    let config = test_config(
        dir.path(),
        &[
            ("max.connections.per.ip", "1"),
            ("max.connections.per.ip.overrides", "127.0.0.1:3,10.1.1.1:0"),
        ],
    );
    let running = tessera_gateway::start(config).await.unwrap();
    let addr = running.kafka_addr;
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut c = WireClient::connect(addr).await;
        api_versions_ok(&mut c).await;
        held.push(c);
    }
    let mut over = WireClient::connect(addr).await;
    assert!(over.is_closed().await, "the fourth connection is closed");
    assert_eq!(
        running
            .broker
            .metrics()
            .connections_rejected
            .load(Ordering::Relaxed),
        1
    );
    // The three still work; once one closes, a new one is let in.
    for c in &mut held {
        api_versions_ok(c).await;
    }
    drop(held.pop());
    // The slot frees when the broker sees the close: retry briefly.
    let mut again = None;
    for _ in 0..50 {
        let mut c = WireClient::connect(addr).await;
        let id = c.send(3, &ApiVersionsRequest::default()).await;
        if !c.is_closed_within(Duration::from_millis(200)).await {
            let r = c.receive::<ApiVersionsRequest>(3, id).await;
            assert_eq!(r.error_code, 0);
            again = Some(c);
            break;
        }
    }
    assert!(
        again.is_some(),
        "a connection was admitted after one closed"
    );
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_frame_before_sasl_authentication_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let jaas = "org.apache.kafka.common.security.plain.PlainLoginModule required user_a=\"p\";";
    let config = common::sasl_plain_config(dir.path(), jaas, &[]);
    let running = tessera_gateway::start(config).await.unwrap();
    let sasl = common::listener_addr(&running, "SASL_PLAINTEXT");
    // 600 KB announced before authenticating: over Kafka's 512 KB default.
    let mut s = TcpStream::connect(sasl).await.unwrap();
    s.write_all(&(600 * 1024i32).to_be_bytes()).await.unwrap();
    let mut c = WireClient::from_stream(s);
    assert!(c.is_closed().await);
    let rejected = &running.broker.metrics().rejected_frames;
    assert_eq!(rejected.load(Ordering::Relaxed), 1);
    // The broker serves the next client.
    let mut plain = WireClient::connect(running.kafka_addr).await;
    api_versions_ok(&mut plain).await;
    running.shutdown().await;
}
