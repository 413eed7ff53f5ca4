//! `tessera`: with no arguments, a single node (controller and broker) on
//! 127.0.0.1:9092 with its data under ./tessera-data.

use std::path::PathBuf;

use clap::Parser;
use tessera_gateway::BrokerConfig;

#[derive(Parser, Debug)]
#[command(
    name = "tessera",
    version,
    about = "A Kafka-compatible broker on ranges, segments and a metadata log"
)]
struct Cli {
    /// TOML config file with Kafka config keys (e.g. `"log.dirs" = "/var/lib/tessera"`).
    #[arg(long, env = "TESSERA_CONFIG")]
    config: Option<PathBuf>,
    /// Data directory (`log.dirs`).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Kafka listener (`listeners`), e.g. PLAINTEXT://127.0.0.1:9092.
    #[arg(long)]
    listeners: Option<String>,
    /// Admin HTTP listener for /metrics, /health, /ready (`admin.listener`).
    #[arg(long)]
    admin_listener: Option<String>,
    /// This node's id (`node.id`).
    #[arg(long)]
    node_id: Option<i32>,
    /// Any config key: `-o key=value`, repeatable; wins over file and environment.
    #[arg(short = 'o', long = "override", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let mut overrides = Vec::new();
    for o in &cli.overrides {
        let (k, v) = o
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("override {o:?} is not KEY=VALUE"))?;
        overrides.push((k.trim().to_string(), v.trim().to_string()));
    }
    if let Some(d) = &cli.data_dir {
        overrides.push(("log.dirs".into(), d.display().to_string()));
    }
    if let Some(l) = &cli.listeners {
        overrides.push(("listeners".into(), l.clone()));
    }
    if let Some(a) = &cli.admin_listener {
        overrides.push(("admin.listener".into(), a.clone()));
    }
    if let Some(n) = cli.node_id {
        overrides.push(("node.id".into(), n.to_string()));
    }
    let config = BrokerConfig::load(cli.config.as_deref(), std::env::vars(), &overrides)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let running = tessera_gateway::start(config).await?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        }
        running.shutdown().await;
        tracing::info!("stopped");
        Ok(())
    })
}
