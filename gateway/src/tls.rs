//! TLS for SSL and SASL_SSL listeners, with rustls: Kafka's PEM key names
//! (`ssl.keystore.type=PEM` with `ssl.keystore.location`, or the PEM text
//! in `ssl.keystore.certificate.chain` + `ssl.keystore.key`;
//! `ssl.truststore.location` / `ssl.truststore.certificates` for client
//! certificates), `ssl.client.auth=none|requested|required`, and the
//! principal of a client certificate (`User:` + its subject DN in RFC 2253
//! form, as Kafka's default principal builder gives it).
//!
//! Certificates rotate without a restart, Kafka's way: a per-broker
//! AlterConfigs of `ssl.keystore.location` / `ssl.truststore.location`
//! (and their `.type`), plain or as `listener.name.<listener>.ssl.*` for
//! one listener, re-reads the files (setting the same path again reloads
//! it) and new connections get the new certificates; connections already
//! open keep theirs. A set that does not load is refused and changes
//! nothing.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::ConfigError;

/// `ssl.client.auth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAuth {
    None,
    Requested,
    Required,
}

/// The TLS keys of the broker config, as given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSettings {
    pub keystore_type: String,
    pub keystore_location: String,
    pub key_password: String,
    pub keystore_certificate_chain: String,
    pub keystore_key: String,
    pub truststore_type: String,
    pub truststore_location: String,
    pub truststore_certificates: String,
    pub client_auth: String,
}

fn invalid(key: &str, value: impl Into<String>) -> ConfigError {
    ConfigError::InvalidValue {
        key: key.to_string(),
        value: value.into(),
    }
}

impl TlsSettings {
    pub fn from_map(get: impl Fn(&str) -> String) -> TlsSettings {
        TlsSettings {
            keystore_type: get("ssl.keystore.type"),
            keystore_location: get("ssl.keystore.location"),
            key_password: get("ssl.key.password"),
            keystore_certificate_chain: get("ssl.keystore.certificate.chain"),
            keystore_key: get("ssl.keystore.key"),
            truststore_type: get("ssl.truststore.type"),
            truststore_location: get("ssl.truststore.location"),
            truststore_certificates: get("ssl.truststore.certificates"),
            client_auth: get("ssl.client.auth"),
        }
    }

    pub fn client_auth(&self) -> Result<ClientAuth, ConfigError> {
        match self.client_auth.trim().to_ascii_lowercase().as_str() {
            "" | "none" => Ok(ClientAuth::None),
            "requested" => Ok(ClientAuth::Requested),
            "required" => Ok(ClientAuth::Required),
            other => Err(invalid("ssl.client.auth", other)),
        }
    }

    /// The server's certificate chain and key (PEM only).
    fn keystore(
        &self,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), ConfigError> {
        if !self.keystore_type.trim().eq_ignore_ascii_case("PEM") {
            return Err(invalid(
                "ssl.keystore.type",
                format!("{} (only PEM is supported)", self.keystore_type),
            ));
        }
        if !self.key_password.is_empty() {
            return Err(invalid(
                "ssl.key.password",
                "(encrypted private keys are not supported; give an unencrypted PKCS#8 or PKCS#1 key)",
            ));
        }
        let (pem, key_pem, key_name) = if !self.keystore_location.trim().is_empty() {
            let text = std::fs::read_to_string(self.keystore_location.trim()).map_err(|e| {
                invalid(
                    "ssl.keystore.location",
                    format!("{}: {e}", self.keystore_location),
                )
            })?;
            (text.clone(), text, "ssl.keystore.location")
        } else if !self.keystore_certificate_chain.trim().is_empty() {
            (
                self.keystore_certificate_chain.clone(),
                self.keystore_key.clone(),
                "ssl.keystore.key",
            )
        } else {
            return Err(invalid(
                "ssl.keystore.location",
                "(missing: a TLS listener needs ssl.keystore.location or ssl.keystore.certificate.chain and ssl.keystore.key)",
            ));
        };
        let certs = rustls_pemfile::certs(&mut pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid("ssl.keystore.certificate.chain", e.to_string()))?;
        if certs.is_empty() {
            return Err(invalid(
                "ssl.keystore.certificate.chain",
                "(no certificate)",
            ));
        }
        let key = rustls_pemfile::private_key(&mut key_pem.as_bytes())
            .map_err(|e| invalid(key_name, e.to_string()))?
            .ok_or_else(|| invalid(key_name, "(no private key)"))?;
        Ok((certs, key))
    }

    fn truststore(&self) -> Result<rustls::RootCertStore, ConfigError> {
        let pem = if !self.truststore_location.trim().is_empty() {
            if !self.truststore_type.trim().eq_ignore_ascii_case("PEM") {
                return Err(invalid(
                    "ssl.truststore.type",
                    format!("{} (only PEM is supported)", self.truststore_type),
                ));
            }
            std::fs::read_to_string(self.truststore_location.trim()).map_err(|e| {
                invalid(
                    "ssl.truststore.location",
                    format!("{}: {e}", self.truststore_location),
                )
            })?
        } else {
            self.truststore_certificates.clone()
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pemfile::certs(&mut pem.as_bytes()) {
            let cert = cert.map_err(|e| invalid("ssl.truststore.location", e.to_string()))?;
            roots
                .add(cert)
                .map_err(|e| invalid("ssl.truststore.location", e.to_string()))?;
        }
        Ok(roots)
    }

    /// The rustls server configuration of the TLS listeners.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, ConfigError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("ssl.enabled.protocols", e.to_string()))?;
        let (certs, key) = self.keystore()?;
        let builder = match self.client_auth()? {
            ClientAuth::None => builder.with_no_client_auth(),
            auth => {
                let roots = self.truststore()?;
                if roots.is_empty() {
                    return Err(invalid(
                        "ssl.truststore.location",
                        "(ssl.client.auth needs the CA certificates of the clients)",
                    ));
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                );
                let verifier = if auth == ClientAuth::Requested {
                    verifier.allow_unauthenticated()
                } else {
                    verifier
                };
                builder.with_client_cert_verifier(
                    verifier
                        .build()
                        .map_err(|e| invalid("ssl.truststore.location", e.to_string()))?,
                )
            }
        };
        let config = builder
            .with_single_cert(certs, key)
            .map_err(|e| invalid("ssl.keystore.key", e.to_string()))?;
        Ok(Arc::new(config))
    }
}

impl TlsSettings {
    /// The rustls client configuration of the broker's own connections to
    /// other brokers and controllers (Kafka's inter-broker SSL client): it
    /// trusts the truststore's CAs, verifies the peer's host name when
    /// `verify_hostname` (`ssl.endpoint.identification.algorithm=https`,
    /// Kafka's default), and presents the keystore's certificate, so a
    /// listener with `ssl.client.auth=required` knows the broker by it.
    pub fn client_config(
        &self,
        verify_hostname: bool,
    ) -> Result<Arc<rustls::ClientConfig>, ConfigError> {
        let roots = self.truststore()?;
        if roots.is_empty() {
            return Err(invalid(
                "ssl.truststore.location",
                "(a TLS inter-broker or controller listener needs the CA certificates of the brokers)",
            ));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .map_err(|e| invalid("ssl.truststore.location", e.to_string()))?;
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("ssl.enabled.protocols", e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(crate::migrate::security::ChainVerifier {
                inner,
                verify_hostname,
            }));
        let (certs, key) = self.keystore()?;
        let config = builder
            .with_client_auth_cert(certs, key)
            .map_err(|e| invalid("ssl.keystore.key", e.to_string()))?;
        Ok(Arc::new(config))
    }
}

/// The keys a per-broker AlterConfigs may change at runtime (Kafka's
/// `SslConfigs.RECONFIGURABLE_CONFIGS`, those that name files: PEM text
/// and passwords are not stored in the metadata log).
pub const RELOADABLE_KEYS: &[&str] = &[
    "ssl.keystore.type",
    "ssl.keystore.location",
    "ssl.truststore.type",
    "ssl.truststore.location",
];

/// Is `key` a reloadable TLS key, plain or `listener.name.<l>.`-prefixed?
pub fn is_reloadable(key: &str) -> bool {
    RELOADABLE_KEYS.contains(&unprefixed(key))
}

/// `key` without a `listener.name.<l>.` prefix.
pub fn unprefixed(key: &str) -> &str {
    key.strip_prefix("listener.name.")
        .and_then(|rest| rest.split_once('.'))
        .map_or(key, |(_, tail)| tail)
}

impl TlsSettings {
    /// The settings of `listener` with a broker's dynamic configs over
    /// the static ones: `listener.name.<listener>.<key>`, else `<key>`.
    pub fn with_dynamic(&self, dynamic: &BTreeMap<String, String>, listener: &str) -> TlsSettings {
        let mut out = self.clone();
        let prefix = format!("listener.name.{}.", listener.to_ascii_lowercase());
        let pick = |key: &str, field: &mut String| {
            if let Some(v) = dynamic
                .get(&format!("{prefix}{key}"))
                .or_else(|| dynamic.get(key))
            {
                *field = v.clone();
            }
        };
        pick("ssl.keystore.type", &mut out.keystore_type);
        pick("ssl.keystore.location", &mut out.keystore_location);
        pick("ssl.truststore.type", &mut out.truststore_type);
        pick("ssl.truststore.location", &mut out.truststore_location);
        out
    }
}

/// The server configs of the TLS listeners, replaced when certificates
/// rotate. Each connection takes the current one when it is accepted.
pub struct ListenerTls {
    static_settings: TlsSettings,
    current: RwLock<BTreeMap<String, Arc<rustls::ServerConfig>>>,
}

impl std::fmt::Debug for ListenerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerTls")
            .field("listeners", &self.current.read().unwrap().keys())
            .finish()
    }
}

impl ListenerTls {
    /// Loads the static settings for each of `listeners` (startup: an
    /// error stops the broker).
    pub fn new(settings: TlsSettings, listeners: &[&str]) -> Result<ListenerTls, ConfigError> {
        let config = settings.server_config()?;
        let current = listeners
            .iter()
            .map(|l| (l.to_string(), config.clone()))
            .collect();
        Ok(ListenerTls {
            static_settings: settings,
            current: RwLock::new(current),
        })
    }

    /// What a new connection on `listener` handshakes with.
    pub fn acceptor(&self, listener: &str) -> Option<tokio_rustls::TlsAcceptor> {
        let current = self.current.read().expect("tls lock");
        current
            .get(listener)
            .map(|c| tokio_rustls::TlsAcceptor::from(c.clone()))
    }

    /// Builds every TLS listener's config from the static settings and a
    /// broker's `dynamic` configs, reading the files again; nothing is
    /// replaced unless all load.
    pub fn prepare(
        &self,
        dynamic: &BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, Arc<rustls::ServerConfig>>, ConfigError> {
        let listeners: Vec<String> = self
            .current
            .read()
            .expect("tls lock")
            .keys()
            .cloned()
            .collect();
        listeners
            .into_iter()
            .map(|l| {
                let config = self
                    .static_settings
                    .with_dynamic(dynamic, &l)
                    .server_config()?;
                Ok((l, config))
            })
            .collect()
    }

    /// Replaces the configs with ones from [`prepare`](Self::prepare).
    pub fn install(&self, configs: BTreeMap<String, Arc<rustls::ServerConfig>>) {
        *self.current.write().expect("tls lock") = configs;
    }
}

/// Kafka's principal for a client certificate: `User:` and the subject DN
/// in RFC 2253 form (most specific RDN first, `CN=client,O=Org`).
pub fn principal_of(cert: &[u8]) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert).ok()?;
    let registry = x509_parser::objects::oid_registry();
    let mut rdns = Vec::new();
    for rdn in parsed.subject().iter() {
        let parts: Vec<String> = rdn
            .iter()
            .map(|attr| {
                let name = x509_parser::objects::oid2abbrev(attr.attr_type(), registry)
                    .map(str::to_string)
                    .unwrap_or_else(|_| attr.attr_type().to_id_string());
                let value = attr.as_str().unwrap_or("").to_string();
                format!("{name}={}", escape_rfc2253(&value))
            })
            .collect();
        rdns.push(parts.join("+"));
    }
    rdns.reverse();
    Some(format!("User:{}", rdns.join(",")))
}

fn escape_rfc2253(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for (i, c) in v.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (c == '#' || c == ' '))
            || (i + 1 == v.chars().count() && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Keys whose values are secrets (never reported by DescribeConfigs).
pub fn is_secret(key: &str) -> bool {
    key.ends_with(".sasl.jaas.config") || key == "ssl.keystore.key" || key == "ssl.key.password"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_auth_values() {
        let s = |v: &str| TlsSettings {
            client_auth: v.into(),
            ..Default::default()
        };
        assert_eq!(s("none").client_auth().unwrap(), ClientAuth::None);
        assert_eq!(s("REQUESTED").client_auth().unwrap(), ClientAuth::Requested);
        assert_eq!(s("required").client_auth().unwrap(), ClientAuth::Required);
        assert!(s("maybe").client_auth().is_err());
    }

    #[test]
    fn keystore_must_be_pem_and_present() {
        let s = TlsSettings {
            keystore_type: "JKS".into(),
            ..Default::default()
        };
        assert!(s.server_config().is_err());
        let s = TlsSettings {
            keystore_type: "PEM".into(),
            ..Default::default()
        };
        assert!(s.server_config().is_err());
        let s = TlsSettings {
            keystore_type: "PEM".into(),
            keystore_certificate_chain: "not pem".into(),
            keystore_key: "not pem".into(),
            ..Default::default()
        };
        assert!(s.server_config().is_err());
    }

    #[test]
    fn rfc2253_escapes() {
        assert_eq!(escape_rfc2253("a,b"), "a\\,b");
        assert_eq!(escape_rfc2253(" x "), "\\ x\\ ");
        assert_eq!(escape_rfc2253("plain"), "plain");
    }

    #[test]
    fn reloadable_keys_and_their_precedence() {
        assert!(is_reloadable("ssl.keystore.location"));
        assert!(is_reloadable(
            "listener.name.external.ssl.truststore.location"
        ));
        assert!(!is_reloadable("ssl.keystore.key"));
        assert!(!is_reloadable("ssl.client.auth"));
        assert!(!is_reloadable("listener.name.external.ssl.key.password"));
        let base = TlsSettings {
            keystore_location: "/static.pem".into(),
            truststore_location: "/ca.pem".into(),
            ..Default::default()
        };
        let dynamic: BTreeMap<String, String> = [
            ("ssl.keystore.location", "/broker.pem"),
            (
                "listener.name.external.ssl.keystore.location",
                "/external.pem",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let external = base.with_dynamic(&dynamic, "EXTERNAL");
        assert_eq!(external.keystore_location, "/external.pem");
        assert_eq!(external.truststore_location, "/ca.pem");
        assert_eq!(
            base.with_dynamic(&dynamic, "SSL").keystore_location,
            "/broker.pem"
        );
        assert_eq!(base.with_dynamic(&BTreeMap::new(), "SSL"), base);
    }
}
