//! Tessera's Kafka front end: listener, framing, version negotiation, one
//! handler per Kafka API, partition -> range routing, and the binary.

pub mod admin;
pub mod admin_auth;
pub mod alter_config;
pub mod api;
pub mod authz;
pub mod broker;
pub mod config;
pub mod connection_limits;
pub mod console;
pub mod dynamic_config;
pub mod error;
pub mod inter_broker;
pub mod leader_epochs;
pub mod listeners;
pub mod metrics;
pub mod migrate;
pub mod peer;
pub mod producer_ids;
pub mod quotas;
pub mod range_policy;
pub mod request_context;
pub mod sasl;
pub mod server;
pub mod tls;
pub mod topic_config;
pub mod users;
pub mod wire;

// The crates the gateway is built on, under the module names the gateway
// has always used for them.
pub use tessera_group_coordinator as groups;
pub use tessera_server_common::{coordinator, internal_topics};
pub use tessera_txn_coordinator as txn;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

pub use broker::Broker;
pub use config::BrokerConfig;

/// A running broker: its listeners' bound addresses and a way to stop it.
pub struct Running {
    pub broker: Arc<Broker>,
    /// The inter-broker listener's bound address (the only one by default;
    /// a controller-only node's controller address).
    pub kafka_addr: std::net::SocketAddr,
    /// Every Kafka listener: its name and bound address (none on a
    /// controller-only node).
    pub listener_addrs: Vec<(String, std::net::SocketAddr)>,
    pub admin_addr: std::net::SocketAddr,
    shutdown: watch::Sender<bool>,
    servers: Vec<tokio::task::JoinHandle<Vec<tokio::task::JoinHandle<()>>>>,
}

/// Starts the broker and its listeners.
pub async fn start(config: BrokerConfig) -> anyhow::Result<Running> {
    let mut config = config;
    if !config.ignored_keys.is_empty() {
        tracing::warn!(
            keys = %config.ignored_keys.join(", "),
            "Kafka config keys that have no effect in tessera are ignored"
        );
    }
    let mut bound = Vec::new();
    for l in &mut config.listeners {
        let addr = config::resolve_listener(l)?;
        let socket = TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("listener {} on {addr}: {e}", l.name))?;
        let local = socket.local_addr()?;
        if l.port == 0 {
            l.port = local.port();
        }
        if l.advertised_port == 0 {
            l.advertised_port = local.port();
        }
        bound.push((socket, local));
    }
    let admin_listener = TcpListener::bind(config.admin_listener).await?;
    let admin_addr = admin_listener.local_addr()?;
    // The inter-broker listener's bound address (a controller-only node has
    // no Kafka listener: its controller address, where raft binds).
    let inter = config.inter_broker_listener;
    let kafka_addr = match bound.get(inter) {
        Some((_, addr)) => *addr,
        None => config.listener,
    };
    if let Some(l) = config.listeners.get(inter) {
        config.listener = kafka_addr;
        config.advertised_port = l.advertised_port;
    }
    let specs: Vec<Arc<listeners::Listener>> =
        config.listeners.iter().cloned().map(Arc::new).collect();
    let broker = Broker::start(config).await?;
    // Certificates rotated by AlterConfigs before a restart are kept.
    if let Some(tls) = &broker.config().tls {
        let image = broker.image();
        if let Some(dynamic) = image
            .broker_configs
            .get(&Some(broker.config().node_id))
            .filter(|d| d.keys().any(|k| tls::is_reloadable(k)))
        {
            match tls.prepare(dynamic) {
                Ok(configs) => tls.install(configs),
                Err(e) => {
                    tracing::warn!(error = %e, "the TLS files set by AlterConfigs do not load; serving the static ones")
                }
            }
        }
    }
    // The admin port's TLS: the keys of the first TLS Kafka listener.
    let admin_tls = if broker.config().admin_listener_ssl_enable {
        let name = specs
            .iter()
            .find(|l| {
                matches!(
                    l.protocol,
                    listeners::SecurityProtocol::Ssl | listeners::SecurityProtocol::SaslSsl
                )
            })
            .map(|l| l.name.clone())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "admin.listener.ssl.enable=true needs an SSL or SASL_SSL listener, whose keys the admin port uses"
                )
            })?;
        Some(name)
    } else {
        None
    };
    tokio::spawn(admin::serve(admin_listener, broker.clone(), admin_tls));
    tokio::spawn(crate::broker::ranges::run_range_policy(broker.clone()));
    let (shutdown, shutdown_rx) = watch::channel(false);
    let mut servers = Vec::new();
    let limits = connection_limits::ConnectionLimits::new(
        broker.config().max_connections,
        broker.config().max_connections_per_ip,
        broker.config().max_connections_per_ip_overrides.clone(),
    );
    let inter_broker_name = broker
        .config()
        .listeners
        .get(inter)
        .map(|l| l.name.clone())
        .unwrap_or_default();
    let mut listener_addrs = Vec::new();
    for ((socket, local), spec) in bound.into_iter().zip(specs) {
        tracing::info!(listener = %spec.name, protocol = spec.protocol.name(), addr = %local, "listening");
        listener_addrs.push((spec.name.clone(), local));
        let tls = if spec.protocol.is_tls() {
            Some(
                broker
                    .config()
                    .tls
                    .clone()
                    .expect("TLS listeners have a TLS config"),
            )
        } else {
            None
        };
        let inter_broker = spec.name == inter_broker_name;
        servers.push(tokio::spawn(server::serve(
            socket,
            spec,
            tls,
            broker.clone(),
            limits.clone(),
            inter_broker,
            shutdown_rx.clone(),
        )));
    }
    if broker.config().controller_only {
        tracing::info!(controller_addr = %kafka_addr, %admin_addr, data_dir = %broker.config().data_dir.display(), "tessera controller is running");
    } else {
        tracing::info!(%kafka_addr, %admin_addr, data_dir = %broker.config().data_dir.display(), "tessera is serving");
    }
    Ok(Running {
        broker,
        kafka_addr,
        listener_addrs,
        admin_addr,
        shutdown,
        servers,
    })
}

impl Running {
    /// Graceful shutdown: move the leadership of replicated ranges to
    /// other replicas (controlled shutdown), stop accepting, let in-flight
    /// requests finish, flush the logs, stop the controller.
    pub async fn shutdown(self) {
        self.broker.controlled_shutdown().await;
        let _ = self.shutdown.send(true);
        let mut connections = Vec::new();
        for server in self.servers {
            if let Ok(mut c) = server.await {
                connections.append(&mut c);
            }
        }
        let drain = async {
            for c in connections {
                let _ = c.await;
            }
        };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), drain).await;
        self.broker.shutdown().await;
    }
}
