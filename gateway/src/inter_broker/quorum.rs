//! The metadata quorum transport secured as Kafka secures its controller
//! listener (`tessera_metadata::network_auth`'s [`TransportSecurity`]):
//! the TLS handshake (SSL, SASL_SSL), then, on SASL_*, Kafka's own SASL
//! exchange at the start of the connection (SaslHandshake and
//! SaslAuthenticate frames, served by the same authenticator as a SASL
//! listener: the controller listener's mechanisms, its PLAIN users, the
//! SCRAM credentials of the metadata image), and then the admission of the
//! principal (CLUSTER_ACTION on the cluster). The client side logs in with
//! `sasl.mechanism.controller.protocol` and the controller listener's JAAS
//! `username`/`password`, and the broker's own certificate.

use std::sync::Arc;

use bytes::Bytes;
use tessera_metadata::acl::{self, AclOperation, AuthorizerSettings, ResourceType, CLUSTER_NAME};
use tessera_metadata::network_auth::{Securing, TransportIo, TransportSecurity};
use tessera_metadata::MetadataImage;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::admission::{admit_quorum_peer, Peer};
use super::settings::ControllerSecurity;
use crate::listeners::Listener;
use crate::sasl::{Action, Authenticator, Event};

/// Kafka's principal of a connection nobody authenticated.
const ANONYMOUS: &str = "User:ANONYMOUS";

/// The quorum transport's security, from the broker config.
#[derive(Debug)]
pub struct QuorumSecurity {
    security: ControllerSecurity,
    authorizer: Option<AuthorizerSettings>,
    /// `sasl.server.max.receive.size`: the largest frame before
    /// authentication.
    max_receive: usize,
}

impl QuorumSecurity {
    pub fn new(
        security: ControllerSecurity,
        authorizer: Option<AuthorizerSettings>,
        max_receive: usize,
    ) -> QuorumSecurity {
        QuorumSecurity {
            security,
            authorizer,
            max_receive,
        }
    }

    async fn admit(
        &self,
        tcp: TcpStream,
        image: Arc<MetadataImage>,
    ) -> Result<Box<dyn TransportIo>, String> {
        let host = tcp
            .peer_addr()
            .map(|a| a.ip().to_string())
            .unwrap_or_default();
        let listener = &self.security.listener;
        let (mut stream, mut principal): (Box<dyn TransportIo>, Option<String>) =
            match &self.security.tls_server {
                Some(config) => {
                    let tls = tokio_rustls::TlsAcceptor::from(config.clone())
                        .accept(tcp)
                        .await
                        .map_err(|e| format!("TLS handshake: {e}"))?;
                    let principal = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|certs| certs.first())
                        .and_then(|cert| crate::tls::principal_of(cert));
                    (Box::new(tls), principal)
                }
                None => (Box::new(tcp), None),
            };
        if listener.protocol.is_sasl() {
            principal = Some(authenticate(&mut stream, listener, &image, self.max_receive).await?);
        }
        // SSL: the handshake was the authentication (`ssl.client.auth` says
        // whether it needed a certificate); without one, ANONYMOUS.
        let principal = principal.unwrap_or_else(|| ANONYMOUS.to_string());
        let cluster_action = self.authorizer.as_ref().is_none_or(|settings| {
            acl::authorize(
                image.acls.values(),
                settings,
                &principal,
                &host,
                AclOperation::ClusterAction,
                ResourceType::Cluster,
                CLUSTER_NAME,
            )
            .is_allowed()
        });
        admit_quorum_peer(Peer {
            on_inter_broker_listener: false,
            authenticated: true,
            cluster_action,
        })
        .map_err(|r| format!("{principal}: {r}"))?;
        tracing::debug!(%principal, "controller connection authenticated");
        Ok(stream)
    }
}

impl TransportSecurity for QuorumSecurity {
    fn connect<'a>(
        &'a self,
        tcp: TcpStream,
        addr: &'a str,
    ) -> Securing<'a, std::io::Result<Box<dyn TransportIo>>> {
        Box::pin(async move {
            let stream = super::secure(&self.security.client, tcp, addr).await?;
            Ok(Box::new(stream) as Box<dyn TransportIo>)
        })
    }

    fn accept<'a>(
        &'a self,
        tcp: TcpStream,
        image: Arc<MetadataImage>,
    ) -> Securing<'a, Result<Box<dyn TransportIo>, String>> {
        Box::pin(self.admit(tcp, image))
    }
}

/// Kafka's SASL exchange, server side, at the start of a connection: the
/// authenticated principal, or why not. Nothing but the exchange is
/// served before it completes.
async fn authenticate<S>(
    stream: &mut S,
    listener: &Listener,
    image: &MetadataImage,
    max_receive: usize,
) -> Result<String, String>
where
    S: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let mut auth = Authenticator::default();
    loop {
        let mut started = false;
        let frame: Bytes = crate::server::read_frame(
            stream,
            max_receive,
            "sasl.server.max.receive.size",
            &mut started,
        )
        .await?
        .ok_or("closed before authenticating")?;
        let (action, event) =
            auth.on_frame(&frame, listener, image, tessera_log::range_log::now_ms());
        if let Some(Event::Failed { user, reason, .. }) = &event {
            tracing::info!(user = user.as_deref().unwrap_or(""), %reason, "controller connection: failed authentication");
        }
        match action {
            Action::Reply(bytes) => {
                stream.write_all(&bytes).await.map_err(|e| e.to_string())?;
                if auth.is_done() {
                    return auth
                        .principal
                        .ok_or_else(|| "authenticated without a principal".to_string());
                }
            }
            Action::Close { reply, reason } => {
                if let Some(bytes) = reply {
                    let _ = stream.write_all(&bytes).await;
                }
                return Err(reason);
            }
            Action::Dispatch => return Err("a request before SASL authentication".into()),
        }
    }
}
