//! Kafka's listener model: `listeners` (`NAME://host:port,...`),
//! `listener.security.protocol.map` (`NAME:PROTOCOL,...`),
//! `advertised.listeners`, `inter.broker.listener.name`, and each SASL
//! listener's mechanisms (`sasl.enabled.mechanisms`, or
//! `listener.name.<name>.sasl.enabled.mechanisms`) and PLAIN users
//! (`listener.name.<name>.plain.sasl.jaas.config`), also of the KRaft
//! controller listener (`controller.listener.names`). Pure parsing.

use std::collections::BTreeMap;

use crate::error::ConfigError;
use crate::sasl::plain::jaas_users;
use crate::sasl::scram::ScramMechanism;

/// A listener's security protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn parse(s: &str) -> Option<SecurityProtocol> {
        match s.trim().to_ascii_uppercase().as_str() {
            "PLAINTEXT" => Some(SecurityProtocol::Plaintext),
            "SSL" => Some(SecurityProtocol::Ssl),
            "SASL_PLAINTEXT" => Some(SecurityProtocol::SaslPlaintext),
            "SASL_SSL" => Some(SecurityProtocol::SaslSsl),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    pub fn is_sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }

    pub fn is_tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }
}

/// The SASL mechanisms this build serves.
pub const SUPPORTED_MECHANISMS: &[&str] =
    &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"];

/// One listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listener {
    /// Upper-case listener name (`PLAINTEXT`, `SASL_PLAINTEXT`, `CLIENT`...).
    pub name: String,
    pub protocol: SecurityProtocol,
    /// Where it binds.
    pub host: String,
    pub port: u16,
    /// What Metadata tells a client that connected to it (port 0: the bound port).
    pub advertised_host: String,
    pub advertised_port: u16,
    /// Enabled SASL mechanisms, in configured order (SASL listeners only).
    pub mechanisms: Vec<String>,
    /// PLAIN users from the listener's JAAS entry.
    pub plain_users: BTreeMap<String, String>,
    /// OAUTHBEARER's unsecured validator options (its JAAS entry, optional).
    pub oauthbearer: crate::sasl::oauthbearer::ValidatorOptions,
    /// `connections.max.reauth.ms` per enabled mechanism (KIP-368): the
    /// most specific of `listener.name.<l>.<mechanism>.`, `listener.name.<l>.`
    /// and the broker-wide key; 0 or less: sessions do not expire.
    pub reauth_ms: BTreeMap<String, i64>,
}

impl Listener {
    pub fn mechanism_enabled(&self, name: &str) -> bool {
        self.mechanisms.iter().any(|m| m == name)
    }

    /// The session lifetime `mechanism` gets on this listener, if any.
    pub fn max_reauth_ms(&self, mechanism: &str) -> Option<i64> {
        self.reauth_ms.get(mechanism).copied().filter(|ms| *ms > 0)
    }
}

/// Kafka's default `listener.security.protocol.map`.
pub const DEFAULT_PROTOCOL_MAP: &str =
    "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL";

fn invalid(key: &str, value: impl Into<String>) -> ConfigError {
    ConfigError::InvalidValue {
        key: key.to_string(),
        value: value.into(),
    }
}

/// `NAME://host:port` (or `host:port`, read as PLAINTEXT) -> (NAME, host, port).
pub fn parse_endpoint(key: &str, raw: &str) -> Result<(String, String, u16), ConfigError> {
    let raw = raw.trim();
    let (name, addr) = match raw.split_once("://") {
        Some((name, rest)) => (name.trim().to_ascii_uppercase(), rest),
        None => ("PLAINTEXT".to_string(), raw),
    };
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(invalid(key, raw));
    }
    // `[::1]:9092` or `host:9092`.
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| invalid(key, raw))?;
    let port: u16 = port.parse().map_err(|_| invalid(key, raw))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let host = if host.is_empty() { "127.0.0.1" } else { host };
    Ok((name, host.to_string(), port))
}

fn parse_protocol_map(raw: &str) -> Result<BTreeMap<String, SecurityProtocol>, ConfigError> {
    let key = "listener.security.protocol.map";
    let mut map = BTreeMap::new();
    for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, protocol) = entry.split_once(':').ok_or_else(|| invalid(key, raw))?;
        let protocol = SecurityProtocol::parse(protocol).ok_or_else(|| invalid(key, raw))?;
        map.insert(name.trim().to_ascii_uppercase(), protocol);
    }
    Ok(map)
}

/// Every config key that applies to one listener: `listener.name.<name>.rest`
/// (Kafka lower-cases the name in these keys).
fn listener_key<'a>(map: &'a BTreeMap<String, String>, name: &str, rest: &str) -> Option<&'a str> {
    map.get(&format!(
        "listener.name.{}.{rest}",
        name.to_ascii_lowercase()
    ))
    .map(String::as_str)
}

/// Is `key` one of the per-listener keys this build reads?
/// (`listener.name.<name>.sasl.enabled.mechanisms`,
/// `listener.name.<name>.<mechanism>.sasl.jaas.config`,
/// `listener.name.<name>[.<mechanism>].connections.max.reauth.ms`)
pub fn is_listener_key(key: &str) -> bool {
    let Some(rest) = key.strip_prefix("listener.name.") else {
        return false;
    };
    let Some((_, tail)) = rest.split_once('.') else {
        return false;
    };
    let mechanism_key = |suffix: &str| {
        tail.strip_suffix(suffix)
            .is_some_and(|m| !m.is_empty() && !m.contains('.'))
    };
    tail == "sasl.enabled.mechanisms"
        || tail == REAUTH_KEY
        || mechanism_key(".sasl.jaas.config")
        || mechanism_key(".connections.max.reauth.ms")
}

const REAUTH_KEY: &str = "connections.max.reauth.ms";

/// The names in `listeners` that are not KRaft controller listeners
/// (`controller.listener.names`), in order: the Kafka client listeners. A
/// controller-only node must have none (Kafka's rule).
pub fn client_listener_names(get: impl Fn(&str) -> String) -> Result<Vec<String>, ConfigError> {
    let controller_names = get("controller.listener.names").to_ascii_uppercase();
    let mut out = Vec::new();
    for entry in get("listeners")
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let (name, _, _) = parse_endpoint("listeners", entry)?;
        if !controller_names.split(',').any(|c| c.trim() == name) {
            out.push(name);
        }
    }
    Ok(out)
}

/// Builds the listeners from the flattened config (`get` returns a key's
/// value or its default).
pub fn parse_listeners(
    map: &BTreeMap<String, String>,
    get: impl Fn(&str) -> String,
) -> Result<Vec<Listener>, ConfigError> {
    let protocols = parse_protocol_map(&get("listener.security.protocol.map"))?;
    let raw = get("listeners");
    // Kafka's KRaft controller listeners: the metadata quorum listens where
    // `controller.quorum.voters` says, so they are not Kafka listeners here.
    let controller_names = get("controller.listener.names").to_ascii_uppercase();
    let is_controller = |name: &str| controller_names.split(',').any(|c| c.trim() == name);
    let mut out: Vec<Listener> = Vec::new();
    for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, host, port) = parse_endpoint("listeners", entry)?;
        if is_controller(&name) {
            continue;
        }
        let protocol = *protocols.get(&name).ok_or_else(|| {
            invalid(
                "listener.security.protocol.map",
                format!("no security protocol for listener {name}"),
            )
        })?;
        if out.iter().any(|l| l.name == name) {
            return Err(invalid(
                "listeners",
                format!("listener {name} appears twice"),
            ));
        }
        if port != 0 && out.iter().any(|l| l.port == port && l.host == host) {
            return Err(invalid("listeners", format!("port {port} appears twice")));
        }
        let mut listener = Listener {
            advertised_host: host.clone(),
            advertised_port: port,
            name,
            protocol,
            host,
            port,
            mechanisms: Vec::new(),
            plain_users: BTreeMap::new(),
            oauthbearer: Default::default(),
            reauth_ms: BTreeMap::new(),
        };
        if protocol.is_sasl() {
            sasl_settings(map, &get, &mut listener)?;
        }
        out.push(listener);
    }
    if out.is_empty() {
        return Err(invalid("listeners", raw));
    }
    let advertised = get("advertised.listeners");
    for entry in advertised
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let (name, host, port) = parse_endpoint("advertised.listeners", entry)?;
        let listener = out.iter_mut().find(|l| l.name == name).ok_or_else(|| {
            invalid(
                "advertised.listeners",
                format!("{name} is not in listeners"),
            )
        })?;
        listener.advertised_host = host;
        listener.advertised_port = port;
    }
    Ok(out)
}

/// The security protocol `listener.security.protocol.map` gives the
/// listener `name` (upper-case), if it names one.
pub fn listener_protocol(
    get: impl Fn(&str) -> String,
    name: &str,
) -> Result<Option<SecurityProtocol>, ConfigError> {
    Ok(parse_protocol_map(&get("listener.security.protocol.map"))?
        .get(name)
        .copied())
}

/// The KRaft controller listener (the first of `controller.listener.names`)
/// as the metadata quorum transport secures it: its protocol from
/// `listener.security.protocol.map` and, for SASL, its mechanisms and PLAIN
/// users, read as a Kafka listener's are. `None` without
/// `controller.listener.names` (the transport is PLAINTEXT). It binds where
/// `controller.quorum.voters` says, so no host or port is kept.
pub fn controller_listener(
    map: &BTreeMap<String, String>,
    get: impl Fn(&str) -> String,
) -> Result<Option<Listener>, ConfigError> {
    let names = get("controller.listener.names").to_ascii_uppercase();
    let Some(name) = names.split(',').map(str::trim).find(|n| !n.is_empty()) else {
        return Ok(None);
    };
    let protocols = parse_protocol_map(&get("listener.security.protocol.map"))?;
    // Kafka's `effectiveListenerSecurityProtocolMap`: without an explicit
    // map a controller listener it does not name is PLAINTEXT.
    let protocol = match protocols.get(name) {
        Some(p) => *p,
        None if !map.contains_key("listener.security.protocol.map") => SecurityProtocol::Plaintext,
        None => {
            return Err(invalid(
                "listener.security.protocol.map",
                format!("no security protocol for controller listener {name}"),
            ))
        }
    };
    let mut listener = Listener {
        name: name.to_string(),
        protocol,
        host: String::new(),
        port: 0,
        advertised_host: String::new(),
        advertised_port: 0,
        mechanisms: Vec::new(),
        plain_users: BTreeMap::new(),
        oauthbearer: Default::default(),
        reauth_ms: BTreeMap::new(),
    };
    if protocol.is_sasl() {
        sasl_settings(map, &get, &mut listener)?;
    }
    Ok(Some(listener))
}

fn sasl_settings(
    map: &BTreeMap<String, String>,
    get: &impl Fn(&str) -> String,
    listener: &mut Listener,
) -> Result<(), ConfigError> {
    let mechanisms = listener_key(map, &listener.name, "sasl.enabled.mechanisms")
        .map(str::to_string)
        .unwrap_or_else(|| get("sasl.enabled.mechanisms"));
    for m in mechanisms
        .split(',')
        .map(|m| m.trim().to_ascii_uppercase())
        .filter(|m| !m.is_empty())
    {
        if !SUPPORTED_MECHANISMS.contains(&m.as_str()) {
            return Err(invalid(
                "sasl.enabled.mechanisms",
                format!(
                    "{m} (listener {}: supported are {})",
                    listener.name,
                    SUPPORTED_MECHANISMS.join(", ")
                ),
            ));
        }
        if !listener.mechanisms.contains(&m) {
            listener.mechanisms.push(m);
        }
    }
    if listener.mechanisms.is_empty() {
        return Err(invalid(
            "sasl.enabled.mechanisms",
            format!("no mechanism for SASL listener {}", listener.name),
        ));
    }
    if listener.mechanism_enabled("PLAIN") {
        let key = format!(
            "listener.name.{}.plain.sasl.jaas.config",
            listener.name.to_ascii_lowercase()
        );
        let jaas = map.get(&key).ok_or_else(|| {
            invalid(
                &key,
                format!(
                    "missing: PLAIN is enabled on listener {} and needs its users",
                    listener.name
                ),
            )
        })?;
        listener.plain_users = jaas_users(jaas).map_err(|e| invalid(&key, e))?;
    }
    if listener.mechanism_enabled("OAUTHBEARER") {
        let key = format!(
            "listener.name.{}.oauthbearer.sasl.jaas.config",
            listener.name.to_ascii_lowercase()
        );
        if let Some(jaas) = map.get(&key) {
            let options =
                crate::sasl::plain::parse_jaas_options(jaas).map_err(|e| invalid(&key, e))?;
            listener.oauthbearer = crate::sasl::oauthbearer::ValidatorOptions::from_jaas(&options)
                .map_err(|e| invalid(&key, e))?;
        }
    }
    for mechanism in &listener.mechanisms {
        let specific = format!("{}.{REAUTH_KEY}", mechanism.to_ascii_lowercase());
        let (key, raw) = match listener_key(map, &listener.name, &specific) {
            Some(v) => (specific, v.to_string()),
            None => match listener_key(map, &listener.name, REAUTH_KEY) {
                Some(v) => (REAUTH_KEY.to_string(), v.to_string()),
                None => (REAUTH_KEY.to_string(), get(REAUTH_KEY)),
            },
        };
        let ms = raw.trim().parse::<i64>().map_err(|_| invalid(&key, raw))?;
        listener.reauth_ms.insert(mechanism.clone(), ms);
    }
    // SCRAM users live in the metadata log; nothing to read here.
    debug_assert!(ScramMechanism::ALL.len() == 2);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listeners(pairs: &[(&str, &str)]) -> Result<Vec<Listener>, ConfigError> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let get = |k: &str| {
            map.get(k).cloned().unwrap_or_else(|| match k {
                "listener.security.protocol.map" => DEFAULT_PROTOCOL_MAP.into(),
                "sasl.enabled.mechanisms" => "GSSAPI".into(),
                "connections.max.reauth.ms" => "0".into(),
                _ => String::new(),
            })
        };
        parse_listeners(&map, get)
    }

    #[test]
    fn default_and_kafka_forms() {
        let l = listeners(&[("listeners", "PLAINTEXT://127.0.0.1:9092")]).unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].protocol, SecurityProtocol::Plaintext);
        assert_eq!(
            (l[0].advertised_host.as_str(), l[0].advertised_port),
            ("127.0.0.1", 9092)
        );
        let l = listeners(&[
            (
                "listeners",
                "PLAINTEXT://127.0.0.1:9092,CLIENT://0.0.0.0:9095",
            ),
            (
                "listener.security.protocol.map",
                "PLAINTEXT:PLAINTEXT,CLIENT:SASL_PLAINTEXT",
            ),
            ("advertised.listeners", "CLIENT://kafka.example:19095"),
            ("sasl.enabled.mechanisms", "SCRAM-SHA-512,scram-sha-256"),
        ])
        .unwrap();
        assert_eq!(l[1].name, "CLIENT");
        assert_eq!(l[1].protocol, SecurityProtocol::SaslPlaintext);
        assert_eq!(l[1].advertised_host, "kafka.example");
        assert_eq!(l[1].advertised_port, 19095);
        assert_eq!(l[1].mechanisms, vec!["SCRAM-SHA-512", "SCRAM-SHA-256"]);
        assert_eq!(l[0].advertised_port, 9092);
    }

    #[test]
    fn sasl_listener_settings() {
        let l = listeners(&[
            ("listeners", "SASL_PLAINTEXT://127.0.0.1:9095"),
            ("listener.name.sasl_plaintext.sasl.enabled.mechanisms", "PLAIN"),
            (
                "listener.name.sasl_plaintext.plain.sasl.jaas.config",
                "org.apache.kafka.common.security.plain.PlainLoginModule required user_alice=\"pw\";",
            ),
        ])
        .unwrap();
        assert_eq!(l[0].mechanisms, vec!["PLAIN"]);
        assert_eq!(l[0].plain_users["alice"], "pw");
        // Kafka's default mechanism (GSSAPI) is not served here.
        assert!(listeners(&[("listeners", "SASL_PLAINTEXT://127.0.0.1:9095")]).is_err());
        // PLAIN without users.
        assert!(listeners(&[
            ("listeners", "SASL_PLAINTEXT://127.0.0.1:9095"),
            ("sasl.enabled.mechanisms", "PLAIN"),
        ])
        .is_err());
    }

    #[test]
    fn reauth_lifetime_most_specific_key_wins() {
        let jaas = "org.apache.kafka.common.security.plain.PlainLoginModule required user_a=\"p\";";
        let l = listeners(&[
            ("listeners", "A://127.0.0.1:1,B://127.0.0.1:2"),
            (
                "listener.security.protocol.map",
                "A:SASL_PLAINTEXT,B:SASL_SSL",
            ),
            ("sasl.enabled.mechanisms", "PLAIN,SCRAM-SHA-256"),
            ("listener.name.a.plain.sasl.jaas.config", jaas),
            ("listener.name.b.plain.sasl.jaas.config", jaas),
            ("listener.name.a.connections.max.reauth.ms", "5000"),
            ("listener.name.a.plain.connections.max.reauth.ms", "700"),
        ])
        .unwrap();
        assert_eq!(l[0].max_reauth_ms("PLAIN"), Some(700));
        assert_eq!(l[0].max_reauth_ms("SCRAM-SHA-256"), Some(5000));
        assert_eq!(l[1].max_reauth_ms("PLAIN"), None);
        assert!(listeners(&[
            ("listeners", "A://127.0.0.1:1"),
            ("listener.security.protocol.map", "A:SASL_PLAINTEXT"),
            ("sasl.enabled.mechanisms", "SCRAM-SHA-256"),
            ("listener.name.a.connections.max.reauth.ms", "soon"),
        ])
        .is_err());
    }

    #[test]
    fn the_controller_listener() {
        let c = |pairs: &[(&str, &str)]| {
            let map: BTreeMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let get = |k: &str| {
                map.get(k).cloned().unwrap_or_else(|| match k {
                    "listener.security.protocol.map" => DEFAULT_PROTOCOL_MAP.into(),
                    "connections.max.reauth.ms" => "0".into(),
                    _ => String::new(),
                })
            };
            controller_listener(&map, get)
        };
        assert_eq!(c(&[]).unwrap(), None);
        // Kafka's default: an unmapped controller listener is PLAINTEXT.
        let l = c(&[("controller.listener.names", "CONTROLLER")])
            .unwrap()
            .unwrap();
        assert_eq!(l.protocol, SecurityProtocol::Plaintext);
        let jaas = "org.apache.kafka.common.security.plain.PlainLoginModule required user_b=\"p\";";
        let l = c(&[
            ("controller.listener.names", "CONTROLLER"),
            (
                "listener.security.protocol.map",
                "CONTROLLER:SASL_PLAINTEXT,PLAINTEXT:PLAINTEXT",
            ),
            ("listener.name.controller.sasl.enabled.mechanisms", "PLAIN"),
            ("listener.name.controller.plain.sasl.jaas.config", jaas),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(l.protocol, SecurityProtocol::SaslPlaintext);
        assert_eq!(l.plain_users["b"], "p");
        // An explicit map that leaves it out is an error, as in Kafka.
        assert!(c(&[
            ("controller.listener.names", "CONTROLLER"),
            ("listener.security.protocol.map", "PLAINTEXT:PLAINTEXT"),
        ])
        .is_err());
    }

    #[test]
    fn bad_listeners_are_refused() {
        assert!(listeners(&[("listeners", "FOO://h:1")]).is_err());
        assert!(listeners(&[("listeners", "PLAINTEXT://h:1,PLAINTEXT://h:2")]).is_err());
        assert!(listeners(&[("listeners", "PLAINTEXT://h:1,SSL://h:1")]).is_err());
        assert!(listeners(&[("listeners", "PLAINTEXT://h")]).is_err());
        assert!(listeners(&[("listeners", "")]).is_err());
        assert!(listeners(&[
            ("listeners", "PLAINTEXT://h:1"),
            ("advertised.listeners", "SSL://h:2")
        ])
        .is_err());
    }

    #[test]
    fn listener_keys() {
        assert!(is_listener_key(
            "listener.name.client.plain.sasl.jaas.config"
        ));
        assert!(is_listener_key(
            "listener.name.client.scram-sha-256.sasl.jaas.config"
        ));
        assert!(is_listener_key(
            "listener.name.client.sasl.enabled.mechanisms"
        ));
        assert!(is_listener_key(
            "listener.name.client.connections.max.reauth.ms"
        ));
        assert!(is_listener_key(
            "listener.name.client.oauthbearer.connections.max.reauth.ms"
        ));
        assert!(!is_listener_key("listener.name.client.nope"));
        assert!(!is_listener_key("listener.name.sasl.jaas.config"));
    }
}
