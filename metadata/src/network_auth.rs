//! Authentication of the metadata quorum transport's connections (Kafka's
//! controller listener, `controller.listener.names`): when that listener
//! is SSL or SASL_*, every connection is secured at its start, before its
//! first transport frame — the TLS handshake, then Kafka's SASL exchange
//! (SaslHandshake and SaslAuthenticate requests, as on any Kafka SASL
//! listener) — and the server admits the peer only if its principal may
//! do CLUSTER_ACTION on the cluster (a super user, or an ACL). A peer
//! that is not admitted is disconnected before anything it sends is read
//! as a vote, an append, a snapshot, a forwarded write, a heartbeat or a
//! learner's join. PLAINTEXT (no [`TransportSecurity`]) stays open, as in
//! Kafka.
//!
//! The mechanisms (TLS, SASL, the authorizer) live with the broker; this
//! crate only calls them at the start of each connection.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::image::MetadataImage;

/// A secured connection: TLS over TCP, or TCP after SASL.
pub trait TransportIo: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> TransportIo for T {}

/// A boxed future of the securing of one connection.
pub type Securing<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Secures the transport's connections at both ends.
pub trait TransportSecurity: Send + Sync + std::fmt::Debug + 'static {
    /// Client side: authenticates a fresh connection to `addr` (TLS
    /// handshake, SASL exchange) before its first request.
    fn connect<'a>(
        &'a self,
        tcp: TcpStream,
        addr: &'a str,
    ) -> Securing<'a, std::io::Result<Box<dyn TransportIo>>>;

    /// Server side: authenticates an accepted connection and decides
    /// whether its principal is admitted (`image`: the SCRAM credentials
    /// and ACLs this node knows). `Err`: why not; the connection closes.
    fn accept<'a>(
        &'a self,
        tcp: TcpStream,
        image: Arc<MetadataImage>,
    ) -> Securing<'a, Result<Box<dyn TransportIo>, String>>;
}

/// One transport connection: plain TCP (PLAINTEXT), or secured.
pub(crate) enum Conn {
    Tcp(TcpStream),
    Secured(Box<dyn TransportIo>),
}

impl Conn {
    /// Whether an idle pooled connection still looks open. Plain TCP is
    /// probed (closed, reset or unexpected bytes: no); a secured one is
    /// taken as open (a TLS peer may have sent session tickets that only
    /// its next read consumes) and a failed reuse is retried by the caller.
    pub(crate) fn looks_open(&self) -> bool {
        match self {
            Conn::Tcp(conn) => {
                let mut probe = [0u8; 1];
                matches!(conn.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            }
            Conn::Secured(_) => true,
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Secured(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Secured(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_flush(cx),
            Conn::Secured(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Secured(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
