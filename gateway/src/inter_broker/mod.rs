//! The broker as a client of other brokers and controllers (Kafka's
//! inter-broker `ChannelBuilder`s), and who is admitted as a broker.
//!
//! - `settings`: the keys (`security.inter.broker.protocol` /
//!   `inter.broker.listener.name`, `sasl.mechanism.inter.broker.protocol`,
//!   `sasl.mechanism.controller.protocol`, the listeners' JAAS client
//!   options, `ssl.*`).
//! - [`InterBrokerClient`]: opens a connection to a peer's listener and
//!   authenticates it as that listener asks — TLS with the broker's own
//!   certificate, then SASL with its credentials — for every broker-to-broker
//!   connection: replication streams and their one-shot calls (fence,
//!   repair read, producer snapshot) and the broker's Kafka requests
//!   (`peer.rs`: WriteTxnMarkers, a remote read of a sealed copy).
//! - `admission`: the decision that a connection is a broker's (the
//!   inter-broker listener, authenticated, CLUSTER_ACTION on the cluster).
//! - `quorum`: the same for the metadata quorum transport, both ways.

pub mod admission;
pub mod quorum;
pub mod settings;

use std::sync::Arc;

use tessera_replication::auth::{Connecting, Connector, PeerStream};
use tokio::io::AsyncWriteExt;
use tokio_rustls::rustls;

pub use settings::{ClientSettings, ControllerSecurity};

/// Connections to peers' listeners, authenticated per `settings`.
#[derive(Debug)]
pub struct InterBrokerClient {
    settings: ClientSettings,
}

impl InterBrokerClient {
    pub fn new(settings: ClientSettings) -> InterBrokerClient {
        InterBrokerClient { settings }
    }

    /// The settings, for a startup warning of a login that cannot work.
    pub fn settings(&self) -> &ClientSettings {
        &self.settings
    }
}

impl Connector for InterBrokerClient {
    fn connect<'a>(&'a self, addr: &'a str) -> Connecting<'a> {
        Box::pin(async move {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            let _ = tcp.set_nodelay(true);
            secure(&self.settings, tcp, addr).await
        })
    }
}

/// TLS and SASL on a fresh connection to `addr`, as `settings` ask.
pub(crate) async fn secure(
    settings: &ClientSettings,
    tcp: tokio::net::TcpStream,
    addr: &str,
) -> std::io::Result<PeerStream> {
    let fail =
        |what: String| std::io::Error::other(format!("{addr} ({}): {what}", settings.listener));
    let mut stream: PeerStream = match &settings.tls {
        Some(config) => {
            let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let name = rustls::pki_types::ServerName::try_from(host.to_string())
                .map_err(|e| fail(format!("server name {host:?}: {e}")))?;
            let tls = tokio_rustls::TlsConnector::from(Arc::clone(config))
                .connect(name, tcp)
                .await
                .map_err(|e| fail(format!("TLS handshake: {e}")))?;
            Box::new(tls)
        }
        None => Box::new(tcp),
    };
    match &settings.login {
        Ok(None) => {}
        Ok(Some(login)) => {
            if let Err(e) = crate::sasl::client::authenticate(&mut stream, login).await {
                let _ = stream.shutdown().await;
                return Err(fail(format!(
                    "SASL {} as {}: {e}",
                    login.mechanism.name(),
                    login.user
                )));
            }
        }
        Err(why) => return Err(fail(why.clone())),
    }
    Ok(stream)
}
