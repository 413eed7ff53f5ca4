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
    /// Config file with Kafka config keys: TOML (`"log.dirs" = "/var/lib/tessera"`),
    /// or a Kafka `server.properties` when the name ends in `.properties`.
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
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Serve (the default when no subcommand is given).
    Serve,
    /// Run a local cluster for trying things out and for tests: N nodes
    /// as child processes of this one, on consecutive ports (Kafka 9092..,
    /// admin 9644.., controller 19092..) with their data under
    /// ./tessera-cluster/node-<id>. The first 1, 3 or 5 nodes (the largest
    /// that fits, at most 5) are controllers and brokers; the rest are
    /// broker-only nodes following the metadata log. Ctrl-C (or SIGTERM)
    /// stops them all. `-o key=value` overrides go to every node.
    Cluster {
        /// Number of nodes, 1 to 9: `--nodes 4` is 3 controller+broker
        /// nodes and one broker-only node.
        #[arg(long, default_value_t = 3)]
        nodes: u16,
        /// Kafka port of node 1; node i listens on base + i - 1.
        #[arg(long, default_value_t = 9092)]
        base_port: u16,
        /// Admin HTTP port of node 1.
        #[arg(long, default_value_t = 9644)]
        admin_base_port: u16,
        /// Controller (metadata quorum) port of node 1.
        #[arg(long, default_value_t = 19092)]
        controller_base_port: u16,
        /// Parent of the nodes' data directories.
        #[arg(long, default_value = "./tessera-cluster")]
        dir: PathBuf,
        /// `broker.rack` of the nodes, comma-separated, given out in turn
        /// (node i gets the ((i - 1) mod n)-th), e.g. `--racks a,b,c`.
        #[arg(long, value_delimiter = ',')]
        racks: Vec<String>,
        /// How many of the nodes are controller voters (the first ones; the
        /// rest are broker-only). Default: 1 for up to 2 nodes, 3 for 3-4,
        /// 5 for more. Odd, and at most `--nodes`.
        #[arg(long)]
        voters: Option<u16>,
    },
    /// SASL/SCRAM users of a node that is not running (its data directory
    /// and metadata log): `tessera users add NAME --password PW`.
    Users {
        #[command(subcommand)]
        action: UsersAction,
    },
    /// Copy topics (every record at its offset) and consumer groups'
    /// committed offsets from a Kafka cluster into tessera, then verify.
    /// See docs/MIGRATION.md. `tessera migrate cutover` ends a continuous run.
    Migrate {
        #[command(flatten)]
        args: tessera_gateway::migrate::MigrateArgs,
        #[command(subcommand)]
        action: Option<MigrateAction>,
    },
    /// List, split and merge ranges of a running broker (through its admin port).
    Ranges {
        /// The broker's admin listener.
        #[arg(long, default_value = "127.0.0.1:9644")]
        admin: String,
        /// A user of the broker (a PLAIN user of a listener, or a SCRAM
        /// user) for HTTP Basic authentication: needed on a broker with a
        /// SASL or SSL listener.
        #[arg(long, env = "TESSERA_ADMIN_USER")]
        user: Option<String>,
        /// That user's password.
        #[arg(long, env = "TESSERA_ADMIN_PASSWORD", hide_env_values = true)]
        password: Option<String>,
        #[command(subcommand)]
        action: RangesAction,
    },
}

#[derive(clap::Subcommand, Debug)]
enum UsersAction {
    /// Add or replace a user's SCRAM credentials (salted; the password is
    /// not stored).
    Add {
        name: String,
        #[arg(long)]
        password: String,
        /// SCRAM-SHA-256 or SCRAM-SHA-512, repeatable; default both.
        #[arg(long = "mechanism")]
        mechanisms: Vec<String>,
        /// PBKDF2 iterations (4096..=16384).
        #[arg(long, default_value_t = tessera_gateway::users::DEFAULT_ITERATIONS)]
        iterations: u32,
    },
}

#[derive(clap::Subcommand, Debug)]
enum RangesAction {
    /// Every range: topic, partitions [lo, hi), active or sealed, lineage.
    List,
    /// Split an active range into two at a partition boundary (default: the middle).
    Split {
        range: u64,
        #[arg(long)]
        at: Option<u32>,
    },
    /// Merge two adjacent active ranges of one topic.
    Merge { left: u64, right: u64 },
    /// Bytes in per broker and per range as the primaries report them, and
    /// the leader moves the balance made (ask the active controller).
    Balance,
}

#[derive(clap::Subcommand, Debug)]
enum MigrateAction {
    /// Ask a continuous `tessera migrate` to cut over: it copies up to the
    /// source's end at that moment, copies the group offsets a last time,
    /// verifies and exits (0 when every partition matches).
    Cutover {
        /// The cutover file the running migrator watches.
        #[arg(long, default_value = "tessera-migrate.cutover")]
        cutover_file: PathBuf,
    },
}

/// `tessera migrate`: exits 0 once the copy is verified.
fn migrate_command(
    args: &tessera_gateway::migrate::MigrateArgs,
    action: &Option<MigrateAction>,
) -> ! {
    if let Some(MigrateAction::Cutover { cutover_file }) = action {
        match std::fs::write(cutover_file, b"cutover\n") {
            Ok(()) => {
                println!(
                    "cutover asked ({}); the migrator finishes, verifies and exits",
                    cutover_file.display()
                );
                std::process::exit(0)
            }
            Err(e) => {
                eprintln!("error: writing {}: {e}", cutover_file.display());
                std::process::exit(1)
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(tessera_gateway::migrate::run(args)) {
        Ok(report) => std::process::exit(tessera_gateway::migrate::print_report(&report)),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1)
        }
    }
}

/// One request to the admin port; returns the status line and the body.
/// HTTP Basic credentials for the admin port.
struct AdminLogin<'a> {
    user: Option<&'a str>,
    password: Option<&'a str>,
}

impl AdminLogin<'_> {
    fn header(&self) -> String {
        use base64::Engine;
        match self.user {
            None => String::new(),
            Some(user) => {
                let token = base64::engine::general_purpose::STANDARD
                    .encode(format!("{user}:{}", self.password.unwrap_or("")));
                format!("Authorization: Basic {token}\r\n")
            }
        }
    }
}

fn admin_request(
    admin: &str,
    login: &AdminLogin<'_>,
    method: &str,
    target: &str,
) -> anyhow::Result<(String, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(admin)?;
    let auth = login.header();
    write!(stream, "{method} {target} HTTP/1.1\r\nHost: {admin}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    Ok((
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    ))
}

fn ranges_command(
    admin: &str,
    login: &AdminLogin<'_>,
    action: &RangesAction,
) -> anyhow::Result<()> {
    let (status, body) = match action {
        RangesAction::List => admin_request(admin, login, "GET", "/ranges")?,
        RangesAction::Balance => admin_request(admin, login, "GET", "/balance")?,
        RangesAction::Split { range, at } => {
            let at = at.map(|a| format!("&at={a}")).unwrap_or_default();
            admin_request(
                admin,
                login,
                "POST",
                &format!("/ranges/split?range={range}{at}"),
            )?
        }
        RangesAction::Merge { left, right } => admin_request(
            admin,
            login,
            "POST",
            &format!("/ranges/merge?left={left}&right={right}"),
        )?,
    };
    if !status.contains(" 200 ") {
        anyhow::bail!("{status}: {body}");
    }
    if let RangesAction::List = action {
        let ranges: Vec<tessera_gateway::broker::ranges::RangeInfo> = serde_json::from_str(&body)?;
        println!(
            "{:>6}  {:<30} {:>8} {:>8}  {:<7} {:>7} {:>5} {:>8} {:>14} {:>12}  parents",
            "range",
            "topic",
            "lo",
            "hi",
            "state",
            "primary",
            "epoch",
            "segments",
            "bytes",
            "bytes/s"
        );
        for r in ranges {
            let state = if r.active { "active" } else { "sealed" };
            let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
            println!(
                "{:>6}  {:<30} {:>8} {:>8}  {:<7} {:>7} {:>5} {:>8} {:>14} {:>12}  {:?}",
                r.id,
                r.topic,
                r.lo,
                r.hi,
                state,
                opt(r.primary.map(|p| p.to_string())),
                r.leader_epoch,
                r.segments,
                r.bytes_appended,
                opt(r.bytes_in_per_sec.map(|b| b.to_string())),
                r.parents
            );
        }
    } else if let RangesAction::Balance = action {
        let view: tessera_gateway::broker::load::BalanceView = serde_json::from_str(&body)?;
        println!("{:>7} {:>8} {:>14}", "broker", "leads", "bytes in/s");
        for (broker, leads) in &view.leaders {
            let bytes = view
                .broker_bytes_in_per_sec
                .get(broker)
                .copied()
                .unwrap_or(0);
            println!("{broker:>7} {leads:>8} {bytes:>14}");
        }
        if view.decisions.is_empty() {
            println!("no leader moves made by this node's balance");
        }
        for d in &view.decisions {
            println!(
                "{}  range {} segment {}: {} -> {}  ({} B/s)  {}",
                d.at_ms, d.range, d.segment, d.from, d.to, d.bytes_per_sec, d.reason
            );
        }
    } else {
        println!("{body}");
    }
    Ok(())
}

/// First ports of a local cluster; node `i` (from 1) adds `i - 1`.
struct ClusterPorts {
    kafka: u16,
    admin: u16,
    controller: u16,
}

/// How many of a local cluster's `nodes` are controller quorum voters: the
/// largest of 1, 3 and 5 that fits (more voters than 5 only slow writes).
fn controller_voters_for(nodes: u16) -> u16 {
    match nodes {
        0..=2 => 1,
        3 | 4 => 3,
        _ => 5,
    }
}

/// `tessera cluster`: starts `nodes` child processes of this binary, the first
/// `controller_voters_for(nodes)` controllers and brokers of one quorum, the
/// rest broker-only, and stops them all on Ctrl-C or
/// SIGTERM (forwarded as SIGTERM, so each shuts down gracefully).
fn run_cluster(
    nodes: u16,
    voters: Option<u16>,
    ports: ClusterPorts,
    dir: &std::path::Path,
    racks: &[String],
    overrides: &[String],
) -> anyhow::Result<()> {
    if !(1..=9).contains(&nodes) {
        anyhow::bail!("--nodes must be 1 to 9, not {nodes}");
    }
    let voter_count = voters.unwrap_or_else(|| controller_voters_for(nodes));
    if voter_count == 0 || voter_count > nodes || voter_count.is_multiple_of(2) {
        anyhow::bail!("--voters must be odd and at most --nodes ({nodes}), not {voter_count}");
    }
    let exe = std::env::current_exe()?;
    let voters: Vec<String> = (0..voter_count)
        .map(|i| format!("{}@127.0.0.1:{}", i + 1, ports.controller + i))
        .collect();
    let voters = voters.join(",");
    let mut children = Vec::new();
    for i in 0..nodes {
        let id = i + 1;
        let data = dir.join(format!("node-{id}"));
        std::fs::create_dir_all(&data)?;
        let mut cmd = std::process::Command::new(&exe);
        cmd.arg("--data-dir")
            .arg(&data)
            .arg("--node-id")
            .arg(id.to_string())
            .arg("--listeners")
            .arg(format!("PLAINTEXT://127.0.0.1:{}", ports.kafka + i))
            .arg("--admin-listener")
            .arg(format!("127.0.0.1:{}", ports.admin + i))
            .arg("-o")
            .arg(format!("controller.quorum.voters={voters}"));
        if i >= voter_count {
            cmd.arg("-o")
                .arg("process.roles=broker")
                .arg("-o")
                .arg(format!(
                    "metadata.listener=127.0.0.1:{}",
                    ports.controller + i
                ));
        }
        if !racks.is_empty() {
            let rack = &racks[(i as usize) % racks.len()];
            cmd.arg("-o").arg(format!("broker.rack={rack}"));
        }
        for o in overrides {
            cmd.arg("-o").arg(o);
        }
        // A node outlives no parent: if this process dies (even by SIGKILL)
        // the kernel sends the node SIGTERM.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        children.push((id, cmd.spawn()?));
    }
    let bootstrap: Vec<String> = (0..nodes)
        .map(|i| format!("127.0.0.1:{}", ports.kafka + i))
        .collect();
    eprintln!(
        "tessera cluster: {nodes} node(s) ({voter_count} controller+broker, {} broker-only), bootstrap servers {}, admin ports {}..{}, data under {}; Ctrl-C stops all",
        nodes - voter_count,
        bootstrap.join(","),
        ports.admin,
        ports.admin + nodes - 1,
        dir.display()
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = term.recv() => {},
            _ = tokio::signal::ctrl_c() => {},
        }
        anyhow::Ok(())
    })?;
    eprintln!("tessera cluster: stopping");
    for (_, child) in &children {
        // SIGTERM: each node shuts down gracefully (Ctrl-C in a terminal
        // reached them already; a second signal is harmless).
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    }
    let mut failed = false;
    for (id, mut child) in children {
        let status = child.wait()?;
        if !status.success() {
            eprintln!("tessera cluster: node {id} exited with {status}");
            failed = status.code().is_some();
        }
    }
    if failed {
        std::process::exit(1);
    }
    Ok(())
}

/// The log's timestamp, followed by `node=N` when the node id is given on
/// the command line: the nodes of `tessera cluster` share one output, and a
/// fault is read from which node said what.
struct NodeTimer(Option<i32>);

impl tracing_subscriber::fmt::time::FormatTime for NodeTimer {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        tracing_subscriber::fmt::time::SystemTime.format_time(w)?;
        match self.0 {
            Some(node) => write!(w, " node={node}"),
            None => Ok(()),
        }
    }
}

/// glibc's malloc gives freed heap memory back to the kernel once more
/// than twice the largest freed block lies free at the heap's top, and
/// serves blocks above its (moving) threshold with fresh mmaps: a fetch's
/// read buffers (megabytes per partition) were then faulted in and zeroed
/// by the kernel on every fetch, half of a consuming broker's CPU. Keeping
/// up to `TRIM_THRESHOLD` of freed memory for reuse halves it (broker CPU
/// per 1 GB consumed 0.46 s -> 0.24 s, rate 1.43M -> 2.10M records/s,
/// medians of 5 alternating runs; peak RSS +35 MiB; docs/BENCHMARKS.md).
/// `GLIBC_TUNABLES=glibc.malloc...` set by an operator wins.
fn keep_freed_memory_for_reuse() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const MMAP_THRESHOLD: libc::c_int = 32 << 20; // glibc's largest
        const TRIM_THRESHOLD: libc::c_int = 128 << 20;
        let tuned = std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc."));
        if !tuned {
            // SAFETY: mallopt only changes malloc's parameters; called
            // before any other thread exists.
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
                libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
            }
        }
    }
}

fn main() -> anyhow::Result<()> {
    keep_freed_memory_for_reuse();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn")),
        )
        .with_timer(NodeTimer(cli.node_id))
        .with_writer(std::io::stderr)
        .init();
    if let Some(Command::Cluster {
        nodes,
        base_port,
        admin_base_port,
        controller_base_port,
        dir,
        racks,
        voters,
    }) = &cli.command
    {
        let ports = ClusterPorts {
            kafka: *base_port,
            admin: *admin_base_port,
            controller: *controller_base_port,
        };
        return run_cluster(*nodes, *voters, ports, dir, racks, &cli.overrides);
    }
    if let Some(Command::Migrate { args, action }) = &cli.command {
        migrate_command(args, action);
    }
    if let Some(Command::Ranges {
        admin,
        user,
        password,
        action,
    }) = &cli.command
    {
        let login = AdminLogin {
            user: user.as_deref(),
            password: password.as_deref(),
        };
        if let Err(e) = ranges_command(admin, &login, action) {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
        return Ok(());
    }
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
    if let Some(Command::Users {
        action:
            UsersAction::Add {
                name,
                password,
                mechanisms,
                iterations,
            },
    }) = &cli.command
    {
        use tessera_gateway::sasl::scram::ScramMechanism;
        let mechanisms = if mechanisms.is_empty() {
            ScramMechanism::ALL.to_vec()
        } else {
            mechanisms
                .iter()
                .map(|m| {
                    ScramMechanism::from_name(&m.to_ascii_uppercase())
                        .ok_or_else(|| anyhow::anyhow!("unknown SCRAM mechanism {m}"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?
        };
        runtime.block_on(tessera_gateway::users::add(
            &config,
            name,
            password,
            &mechanisms,
            *iterations,
        ))?;
        let names: Vec<&str> = mechanisms.iter().map(|m| m.name()).collect();
        println!("user {name}: {} credentials written", names.join(", "));
        return Ok(());
    }
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
