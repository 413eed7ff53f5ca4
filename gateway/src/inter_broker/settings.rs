//! How this broker's own connections authenticate, from Kafka's config
//! keys (pure parsing): to other brokers' inter-broker listener
//! (`security.inter.broker.protocol` / `inter.broker.listener.name`,
//! `sasl.mechanism.inter.broker.protocol`) and to the controllers'
//! listener (`controller.listener.names`, `sasl.mechanism.controller.protocol`).
//! The SASL credentials are the client options of the listener's JAAS
//! entry, `listener.name.<l>.<mechanism>.sasl.jaas.config` with
//! `username="..." password="..."` (Kafka's PlainLoginModule and
//! ScramLoginModule take them so); TLS uses the broker's keystore as its
//! client certificate and its truststore (`ssl.*`), checking the peer's
//! host name unless `ssl.endpoint.identification.algorithm` is empty.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio_rustls::rustls;

use crate::error::ConfigError;
use crate::listeners::{controller_listener, Listener, SecurityProtocol};
use crate::sasl::client::{Login, Mechanism};
use crate::sasl::plain::parse_jaas_options;
use crate::tls::TlsSettings;

/// How connections to one listener of the peers authenticate.
#[derive(Clone, Debug)]
pub struct ClientSettings {
    /// The listener's name, for messages.
    pub listener: String,
    pub protocol: SecurityProtocol,
    /// SASL listeners: the login, or why there is none (a mechanism this
    /// build does not speak, no credentials). Reported when a connection
    /// is attempted, so a single broker that never connects to a peer
    /// starts with Kafka's defaults.
    pub login: Result<Option<Login>, String>,
    /// TLS listeners: the client configuration.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl ClientSettings {
    /// PLAINTEXT: nothing to do.
    pub fn plaintext(listener: &str) -> ClientSettings {
        ClientSettings {
            listener: listener.to_string(),
            protocol: SecurityProtocol::Plaintext,
            login: Ok(None),
            tls: None,
        }
    }

    /// The settings of connections to `listener` (`protocol`), the SASL
    /// mechanism named by the value of `mechanism_key`.
    pub fn parse(
        map: &BTreeMap<String, String>,
        get: &impl Fn(&str) -> String,
        listener: &str,
        protocol: SecurityProtocol,
        mechanism_key: &str,
    ) -> Result<ClientSettings, ConfigError> {
        let login = if protocol.is_sasl() {
            login(map, listener, mechanism_key, &get(mechanism_key)).map(Some)
        } else {
            Ok(None)
        };
        let tls = if protocol.is_tls() {
            let verify_hostname = match get("ssl.endpoint.identification.algorithm")
                .trim()
                .to_ascii_lowercase()
                .as_str()
            {
                "" => false,
                "https" => true,
                other => {
                    return Err(ConfigError::InvalidValue {
                        key: "ssl.endpoint.identification.algorithm".into(),
                        value: format!("{other} (https, or empty for none)"),
                    })
                }
            };
            Some(TlsSettings::from_map(get).client_config(verify_hostname)?)
        } else {
            None
        };
        Ok(ClientSettings {
            listener: listener.to_string(),
            protocol,
            login,
            tls,
        })
    }
}

/// The KRaft controller listener when it is SSL or SASL_*: what the
/// metadata quorum transport's server checks, and how this node's own
/// connections to the controllers authenticate.
#[derive(Clone, Debug)]
pub struct ControllerSecurity {
    /// The listener: protocol, SASL mechanisms and PLAIN users.
    pub listener: Listener,
    /// SSL, SASL_SSL: the server's TLS configuration (`ssl.*`, with
    /// `ssl.client.auth`).
    pub tls_server: Option<Arc<rustls::ServerConfig>>,
    /// This node as a client of the other controllers.
    pub client: ClientSettings,
}

impl ControllerSecurity {
    /// `None` when there is no controller listener or it is PLAINTEXT.
    pub fn parse(
        map: &BTreeMap<String, String>,
        get: &impl Fn(&str) -> String,
    ) -> Result<Option<ControllerSecurity>, ConfigError> {
        let Some(listener) = controller_listener(map, get)? else {
            return Ok(None);
        };
        if listener.protocol == SecurityProtocol::Plaintext {
            return Ok(None);
        }
        let tls_server = if listener.protocol.is_tls() {
            Some(TlsSettings::from_map(get).server_config()?)
        } else {
            None
        };
        let client = ClientSettings::parse(
            map,
            get,
            &listener.name,
            listener.protocol,
            "sasl.mechanism.controller.protocol",
        )?;
        Ok(Some(ControllerSecurity {
            listener,
            tls_server,
            client,
        }))
    }
}

/// The client login of `listener` for `mechanism`, from its JAAS entry.
fn login(
    map: &BTreeMap<String, String>,
    listener: &str,
    mechanism_key: &str,
    mechanism: &str,
) -> Result<Login, String> {
    let parsed = Mechanism::from_name(mechanism)
        .filter(|m| *m != Mechanism::OAuthBearer)
        .ok_or_else(|| {
            format!(
                "{mechanism_key}={mechanism} is not supported for the broker's own connections \
                 to listener {listener} (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)"
            )
        })?;
    let key = format!(
        "listener.name.{}.{}.sasl.jaas.config",
        listener.to_ascii_lowercase(),
        parsed.name().to_ascii_lowercase()
    );
    let jaas = map
        .get(&key)
        .ok_or_else(|| format!("{key} is missing: the broker's credentials on listener {listener} (username=\"...\" password=\"...\")"))?;
    let options = parse_jaas_options(jaas).map_err(|e| format!("{key}: {e}"))?;
    let field = |name: &str| {
        options
            .get(name)
            .filter(|v| !v.is_empty())
            .cloned()
            .ok_or_else(|| format!("{key} has no {name}=\"...\" (the broker's own credentials)"))
    };
    Ok(Login {
        mechanism: parsed,
        user: field("username")?,
        password: field("password")?,
        oauthbearer: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)], protocol: SecurityProtocol) -> ClientSettings {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let get = |k: &str| {
            map.get(k).cloned().unwrap_or_else(|| match k {
                "sasl.mechanism.inter.broker.protocol" => "GSSAPI".into(),
                _ => String::new(),
            })
        };
        ClientSettings::parse(
            &map,
            &get,
            "BROKER",
            protocol,
            "sasl.mechanism.inter.broker.protocol",
        )
        .unwrap()
    }

    #[test]
    fn credentials_come_from_the_listener_jaas_entry() {
        let s = parse(
            &[
                ("sasl.mechanism.inter.broker.protocol", "SCRAM-SHA-512"),
                (
                    "listener.name.broker.scram-sha-512.sasl.jaas.config",
                    "org.apache.kafka.common.security.scram.ScramLoginModule required username=\"broker\" password=\"pw\";",
                ),
            ],
            SecurityProtocol::SaslPlaintext,
        );
        let login = s.login.unwrap().unwrap();
        assert_eq!(login.mechanism.name(), "SCRAM-SHA-512");
        assert_eq!(
            (login.user.as_str(), login.password.as_str()),
            ("broker", "pw")
        );
        let s = parse(
            &[
                ("sasl.mechanism.inter.broker.protocol", "PLAIN"),
                (
                    "listener.name.broker.plain.sasl.jaas.config",
                    "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"b\" password=\"p\" user_b=\"p\";",
                ),
            ],
            SecurityProtocol::SaslPlaintext,
        );
        assert_eq!(s.login.unwrap().unwrap().user, "b");
    }

    #[test]
    fn a_missing_login_is_told_not_guessed() {
        // Kafka's default GSSAPI is not spoken here.
        let e = parse(&[], SecurityProtocol::SaslPlaintext)
            .login
            .unwrap_err();
        assert!(e.contains("GSSAPI"), "{e}");
        // Server-side users only: no client credentials.
        let e = parse(
            &[
                ("sasl.mechanism.inter.broker.protocol", "PLAIN"),
                (
                    "listener.name.broker.plain.sasl.jaas.config",
                    "org.apache.kafka.common.security.plain.PlainLoginModule required user_b=\"p\";",
                ),
            ],
            SecurityProtocol::SaslPlaintext,
        )
        .login
        .unwrap_err();
        assert!(e.contains("username"), "{e}");
        // PLAINTEXT needs none.
        assert!(parse(&[], SecurityProtocol::Plaintext)
            .login
            .unwrap()
            .is_none());
    }
}
