//! How the migrator reaches a secured cluster: librdkafka's client keys
//! (`--source-config security.protocol=SASL_SSL`, `sasl.mechanism`,
//! `sasl.username`, `sasl.password`, `ssl.ca.location`, ...), so a user
//! copies them from the consumers they already run. TLS with rustls, SASL
//! PLAIN, SCRAM-SHA-256/512 and OAUTHBEARER (librdkafka's unsecured JWT:
//! `enable.sasl.oauthbearer.unsecure.jwt=true`, `sasl.oauthbearer.config`)
//! as a Kafka client does them: ApiVersions, then SaslHandshake v1, then
//! SaslAuthenticate.

use std::sync::Arc;

use tokio_rustls::rustls;

use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

use crate::error::MigrateError;
use crate::sasl::oauthbearer::UnsecuredLogin;
use crate::sasl::scram::ScramMechanism;

/// Kafka's `security.protocol`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    #[default]
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl Protocol {
    pub fn uses_tls(self) -> bool {
        matches!(self, Protocol::Ssl | Protocol::SaslSsl)
    }

    pub fn uses_sasl(self) -> bool {
        matches!(self, Protocol::SaslPlaintext | Protocol::SaslSsl)
    }
}

pub use crate::sasl::client::Mechanism;

/// What a connection to one cluster needs.
#[derive(Clone, Default)]
pub struct ClientSecurity {
    pub protocol: Protocol,
    /// The SASL mechanism, user and password (SASL protocols only; for
    /// OAUTHBEARER the principal and no password).
    pub sasl: Option<(Mechanism, String, String)>,
    /// OAUTHBEARER's token settings (a fresh token on every login).
    pub oauthbearer: Option<UnsecuredLogin>,
    /// The TLS client configuration (TLS protocols only).
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for ClientSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSecurity")
            .field("protocol", &self.protocol)
            .field("sasl", &self.sasl.as_ref().map(|(m, u, _)| (m.name(), u)))
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// The client keys `parse` accepts (librdkafka's names; `sasl.mechanisms`
/// is librdkafka's alias of `sasl.mechanism`).
pub const KEYS: &[&str] = &[
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.endpoint.identification.algorithm",
    "sasl.oauthbearer.config",
    "enable.sasl.oauthbearer.unsecure.jwt",
    "sasl.oauthbearer.method",
];

impl ClientSecurity {
    /// From `key=value` pairs (`which`: "--source-config" or
    /// "--target-config", for the error messages).
    pub fn parse(which: &str, pairs: &[String]) -> Result<ClientSecurity, MigrateError> {
        let bad = |m: String| MigrateError::Argument(format!("{which}: {m}"));
        let mut get = std::collections::HashMap::new();
        for pair in pairs {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| bad(format!("{pair:?} is not KEY=VALUE")))?;
            let k = k.trim();
            if !KEYS.contains(&k) {
                return Err(bad(format!(
                    "unknown key {k:?} (known: {})",
                    KEYS.join(", ")
                )));
            }
            let k = if k == "sasl.mechanisms" {
                "sasl.mechanism"
            } else {
                k
            };
            get.insert(k.to_string(), v.to_string());
        }
        let value = |k: &str| get.get(k).map(String::as_str).unwrap_or("");
        let protocol = match value("security.protocol").to_ascii_uppercase().as_str() {
            "" | "PLAINTEXT" => Protocol::Plaintext,
            "SSL" => Protocol::Ssl,
            "SASL_PLAINTEXT" => Protocol::SaslPlaintext,
            "SASL_SSL" => Protocol::SaslSsl,
            other => return Err(bad(format!("security.protocol {other:?}"))),
        };
        let mut oauthbearer = None;
        let sasl = if protocol.uses_sasl() {
            let mechanism = match value("sasl.mechanism").to_ascii_uppercase().as_str() {
                "GSSAPI" => return Err(bad("sasl.mechanism GSSAPI is not supported".into())),
                "" | "PLAIN" => Mechanism::Plain,
                "OAUTHBEARER" => Mechanism::OAuthBearer,
                other => Mechanism::Scram(ScramMechanism::from_name(other).ok_or_else(|| {
                    bad(format!(
                        "sasl.mechanism {other:?} (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER)"
                    ))
                })?),
            };
            if mechanism == Mechanism::OAuthBearer {
                oauthbearer = Some(oauthbearer_login(&value).map_err(bad)?);
            }
            let user = match &oauthbearer {
                Some(login) => login.principal.as_str(),
                None => value("sasl.username"),
            };
            if user.is_empty() {
                return Err(bad(format!(
                    "{} needs sasl.username",
                    protocol_name(protocol)
                )));
            }
            Some((
                mechanism,
                user.to_string(),
                value("sasl.password").to_string(),
            ))
        } else {
            None
        };
        let tls = if protocol.uses_tls() {
            Some(
                tls_config(
                    value("ssl.ca.location"),
                    value("ssl.certificate.location"),
                    value("ssl.key.location"),
                    match value("ssl.endpoint.identification.algorithm")
                        .to_ascii_lowercase()
                        .as_str()
                    {
                        "" | "https" => true,
                        "none" => false,
                        other => {
                            return Err(bad(format!(
                                "ssl.endpoint.identification.algorithm {other:?} (https or none)"
                            )))
                        }
                    },
                )
                .map_err(bad)?,
            )
        } else {
            None
        };
        Ok(ClientSecurity {
            protocol,
            sasl,
            oauthbearer,
            tls,
        })
    }
}

/// librdkafka's unsecured-token settings; OIDC (`sasl.oauthbearer.method=oidc`)
/// and a token from a callback are not available here.
fn oauthbearer_login<'a>(value: &dyn Fn(&str) -> &'a str) -> Result<UnsecuredLogin, String> {
    let method = value("sasl.oauthbearer.method");
    if !method.is_empty() && !method.eq_ignore_ascii_case("default") {
        return Err(format!(
            "sasl.oauthbearer.method {method:?} is not supported (only unsecured tokens)"
        ));
    }
    if value("enable.sasl.oauthbearer.unsecure.jwt") != "true" {
        return Err(
            "OAUTHBEARER needs enable.sasl.oauthbearer.unsecure.jwt=true and sasl.oauthbearer.config=principal=<name> [scope=..]"
                .into(),
        );
    }
    UnsecuredLogin::parse(value("sasl.oauthbearer.config"))
        .map_err(|e| format!("sasl.oauthbearer.config: {e}"))
}

fn protocol_name(p: Protocol) -> &'static str {
    match p {
        Protocol::Plaintext => "PLAINTEXT",
        Protocol::Ssl => "SSL",
        Protocol::SaslPlaintext => "SASL_PLAINTEXT",
        Protocol::SaslSsl => "SASL_SSL",
    }
}

fn read_pem(key: &str, path: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{key} {path}: {e}"))
}

/// The rustls client configuration: trust `ca` (PEM; required, there is no
/// system store here), present `cert`/`key` when both are given.
fn tls_config(
    ca: &str,
    cert: &str,
    key: &str,
    verify_hostname: bool,
) -> Result<Arc<rustls::ClientConfig>, String> {
    if ca.is_empty() {
        return Err("SSL needs ssl.ca.location (a PEM file of the CA certificates)".into());
    }
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut read_pem("ssl.ca.location", ca)?.as_slice()) {
        let c = c.map_err(|e| format!("ssl.ca.location {ca}: {e}"))?;
        roots
            .add(c)
            .map_err(|e| format!("ssl.ca.location {ca}: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("ssl.ca.location {ca}: no certificate"));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .map_err(|e| format!("ssl.ca.location {ca}: {e}"))?;
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ChainVerifier {
            inner: verifier,
            verify_hostname,
        }));
    let config = match (cert.is_empty(), key.is_empty()) {
        (true, true) => builder.with_no_client_auth(),
        (false, false) => {
            let chain =
                rustls_pemfile::certs(&mut read_pem("ssl.certificate.location", cert)?.as_slice())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("ssl.certificate.location {cert}: {e}"))?;
            let private =
                rustls_pemfile::private_key(&mut read_pem("ssl.key.location", key)?.as_slice())
                    .map_err(|e| format!("ssl.key.location {key}: {e}"))?
                    .ok_or_else(|| format!("ssl.key.location {key}: no private key"))?;
            builder
                .with_client_auth_cert(chain, private)
                .map_err(|e| format!("ssl.certificate.location: {e}"))?
        }
        _ => return Err("ssl.certificate.location and ssl.key.location go together".into()),
    };
    Ok(Arc::new(config))
}

/// The WebPKI chain check, with the host name check optional
/// (`ssl.endpoint.identification.algorithm=none`, as Kafka clients allow).
#[derive(Debug)]
pub(crate) struct ChainVerifier {
    pub(crate) inner: Arc<rustls::client::WebPkiServerVerifier>,
    pub(crate) verify_hostname: bool,
}

impl ServerCertVerifier for ChainVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.verify_hostname => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[&str]) -> Result<ClientSecurity, MigrateError> {
        let pairs: Vec<String> = pairs.iter().map(|s| s.to_string()).collect();
        ClientSecurity::parse("--source-config", &pairs)
    }

    #[test]
    fn plaintext_by_default() {
        let s = parse(&[]).unwrap();
        assert_eq!(s.protocol, Protocol::Plaintext);
        assert!(s.sasl.is_none() && s.tls.is_none());
    }

    #[test]
    fn sasl_plaintext_with_scram() {
        let s = parse(&[
            "security.protocol=sasl_plaintext",
            "sasl.mechanisms=SCRAM-SHA-512",
            "sasl.username=bob",
            "sasl.password=a=b",
        ])
        .unwrap();
        assert_eq!(s.protocol, Protocol::SaslPlaintext);
        let (m, u, p) = s.sasl.unwrap();
        assert_eq!(m, Mechanism::Scram(ScramMechanism::Sha512));
        assert_eq!((u.as_str(), p.as_str()), ("bob", "a=b"));
        // PLAIN is the default mechanism once a user is named.
        let s = parse(&["security.protocol=SASL_PLAINTEXT", "sasl.username=u"]).unwrap();
        assert_eq!(s.sasl.unwrap().0, Mechanism::Plain);
    }

    #[test]
    fn refusals_name_the_problem() {
        let err = |pairs: &[&str]| parse(pairs).unwrap_err().to_string();
        assert!(err(&["bootstrap.servers=x"]).contains("unknown key"));
        assert!(err(&["security.protocol"]).contains("KEY=VALUE"));
        assert!(err(&["security.protocol=TLS"]).contains("security.protocol"));
        assert!(err(&["security.protocol=SASL_PLAINTEXT"]).contains("sasl.username"));
        assert!(err(&[
            "security.protocol=SASL_PLAINTEXT",
            "sasl.username=u",
            "sasl.mechanism=GSSAPI"
        ])
        .contains("GSSAPI"));
        assert!(err(&["security.protocol=SSL"]).contains("ssl.ca.location"));
        assert!(
            err(&["security.protocol=SSL", "ssl.ca.location=/nonexistent"])
                .contains("/nonexistent")
        );
    }

    #[test]
    fn oauthbearer_with_an_unsecured_token() {
        let s = parse(&[
            "security.protocol=SASL_PLAINTEXT",
            "sasl.mechanism=OAUTHBEARER",
            "enable.sasl.oauthbearer.unsecure.jwt=true",
            "sasl.oauthbearer.config=principal=alice scope=tessera",
        ])
        .unwrap();
        let (m, u, _) = s.sasl.clone().unwrap();
        assert_eq!((m, u.as_str()), (Mechanism::OAuthBearer, "alice"));
        assert_eq!(s.oauthbearer.unwrap().principal, "alice");
        let refused = |pairs: &[&str]| match parse(pairs) {
            Err(MigrateError::Argument(m)) => m,
            other => panic!("{other:?}"),
        };
        let base = [
            "security.protocol=SASL_PLAINTEXT",
            "sasl.mechanism=OAUTHBEARER",
        ];
        assert!(refused(&base).contains("enable.sasl.oauthbearer.unsecure.jwt"));
        let oidc = [&base[..], &["sasl.oauthbearer.method=oidc"]].concat();
        assert!(refused(&oidc).contains("oidc"));
        let no_principal = [
            &base[..],
            &[
                "enable.sasl.oauthbearer.unsecure.jwt=true",
                "sasl.oauthbearer.config=scope=a",
            ],
        ]
        .concat();
        assert!(refused(&no_principal).contains("principal"));
    }
}
