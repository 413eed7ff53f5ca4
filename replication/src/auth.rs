//! How a broker opens its connections to other brokers' Kafka listeners
//! (Kafka's inter-broker `ChannelBuilder` on the client side): a
//! [`Connector`] gives a connection that has already done what the
//! inter-broker listener asks — the TLS handshake with the broker's own
//! certificate, the SASL exchange with its credentials — before the
//! replication upgrade is sent on it. The broker implements it from its
//! `security.inter.broker.protocol` settings; [`Plaintext`] is the
//! unauthenticated connector (a PLAINTEXT listener, and tests).

use std::future::Future;
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};

/// A connection to a peer: TCP, or TLS over it.
pub trait PeerIo: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> PeerIo for T {}

/// An authenticated connection to another broker.
pub type PeerStream = Box<dyn PeerIo>;

/// A boxed future of a connect.
pub type Connecting<'a> = Pin<Box<dyn Future<Output = std::io::Result<PeerStream>> + Send + 'a>>;

/// Opens connections to other brokers as the inter-broker listener
/// authenticates them.
pub trait Connector: Send + Sync + 'static {
    /// Connects to `addr` (`host:port`) and authenticates; the connection
    /// is then ready for the replication upgrade or a Kafka request.
    fn connect<'a>(&'a self, addr: &'a str) -> Connecting<'a>;
}

/// A plain TCP connection, no authentication (a PLAINTEXT inter-broker
/// listener).
pub struct Plaintext;

impl Connector for Plaintext {
    fn connect<'a>(&'a self, addr: &'a str) -> Connecting<'a> {
        Box::pin(async move {
            let conn = tokio::net::TcpStream::connect(addr).await?;
            let _ = conn.set_nodelay(true);
            Ok(Box::new(conn) as PeerStream)
        })
    }
}
