//! Tessera's Kafka front end: listener, framing, version negotiation, one
//! handler per Kafka API, partition -> range routing, and the binary.

pub mod admin;
pub mod alter_config;
pub mod api;
pub mod append;
pub mod broker;
pub mod config;
pub mod coordinator;
pub mod dynamic_config;
pub mod error;
pub mod groups;
pub mod internal_topics;
pub mod leader_epochs;
pub mod metrics;
pub mod migrate;
pub mod peer;
pub mod producer_ids;
pub mod range_policy;
pub mod ranges;
pub mod server;
pub mod topic_config;
pub mod txn;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

pub use broker::Broker;
pub use config::BrokerConfig;

/// A running broker: its listeners' bound addresses and a way to stop it.
pub struct Running {
    pub broker: Arc<Broker>,
    pub kafka_addr: std::net::SocketAddr,
    pub admin_addr: std::net::SocketAddr,
    shutdown: watch::Sender<bool>,
    server: tokio::task::JoinHandle<Vec<tokio::task::JoinHandle<()>>>,
}

/// Starts the broker and both listeners.
pub async fn start(config: BrokerConfig) -> anyhow::Result<Running> {
    let kafka_listener = TcpListener::bind(config.listener).await?;
    let admin_listener = TcpListener::bind(config.admin_listener).await?;
    let kafka_addr = kafka_listener.local_addr()?;
    let admin_addr = admin_listener.local_addr()?;
    let mut config = config;
    if config.advertised_port == 0 {
        config.advertised_port = kafka_addr.port();
    }
    let broker = Broker::start(config).await?;
    tokio::spawn(admin::serve(admin_listener, broker.clone()));
    tokio::spawn(ranges::run_range_policy(broker.clone()));
    let (shutdown, shutdown_rx) = watch::channel(false);
    let server = tokio::spawn(server::serve(kafka_listener, broker.clone(), shutdown_rx));
    tracing::info!(%kafka_addr, %admin_addr, data_dir = %broker.config.data_dir.display(), "tessera is serving");
    Ok(Running {
        broker,
        kafka_addr,
        admin_addr,
        shutdown,
        server,
    })
}

impl Running {
    /// Graceful shutdown: move the leadership of replicated ranges to
    /// other replicas (controlled shutdown), stop accepting, let in-flight
    /// requests finish, flush the logs, stop the controller.
    pub async fn shutdown(self) {
        self.broker.controlled_shutdown().await;
        let _ = self.shutdown.send(true);
        if let Ok(connections) = self.server.await {
            let drain = async {
                for c in connections {
                    let _ = c.await;
                }
            };
            let _ = tokio::time::timeout(std::time::Duration::from_secs(10), drain).await;
        }
        self.broker.shutdown().await;
    }
}
