//! Broker configs: the static ones a broker starts with (`config.rs`) and
//! the dynamic ones set with AlterConfigs / IncrementalAlterConfigs and
//! stored in the metadata log (`SetBrokerConfig`), per broker or as the
//! cluster-wide default. Pure functions over the static config and the
//! image; tested below.
//!
//! Dynamic keys are the broker synonyms of topic configs that Kafka lets
//! change at runtime (`DynamicLogConfig`: `log.retention.ms`,
//! `message.max.bytes`, `min.insync.replicas`, ...). Their precedence, as
//! in Kafka: this broker's dynamic value, the cluster-wide dynamic default,
//! the static value, the default.

use std::collections::BTreeMap;

use tessera_metadata::MetadataImage;

use crate::config::{in_millis, static_default, static_keys, time_synonyms, BrokerConfig};
use crate::error::ApiError;
use crate::topic_config::{
    check_value, BrokerDefaults, ConfigSynonym, DescribedConfig, Kind, Synonym, SOURCE_DEFAULT,
    SOURCE_DYNAMIC_BROKER, SOURCE_DYNAMIC_DEFAULT_BROKER, SOURCE_STATIC_BROKER, TOPIC_CONFIGS,
};

/// A broker's configs as of an image: static plus dynamic.
#[derive(Clone, Copy)]
pub struct BrokerView<'a> {
    pub config: &'a BrokerConfig,
    pub image: &'a MetadataImage,
}

impl<'a> BrokerView<'a> {
    pub fn new(config: &'a BrokerConfig, image: &'a MetadataImage) -> BrokerView<'a> {
        BrokerView { config, image }
    }

    /// The dynamic value of `key` for this broker: its own, else the
    /// cluster-wide default.
    pub fn dynamic(&self, key: &str) -> Option<&'a str> {
        self.image
            .dynamic_broker_config(self.config.node_id, key)
            .map(|(v, _)| v)
    }

    /// Every source with a value for broker key `key`, highest precedence
    /// first: DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG,
    /// STATIC_BROKER_CONFIG, DEFAULT_CONFIG.
    pub fn sources(&self, key: &str) -> Vec<ConfigSynonym> {
        let Some(name) = broker_key_name(key) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut push_as = |name: &'static str, value: &str, source| {
            out.push(ConfigSynonym {
                name: name.into(),
                value: value.to_string(),
                source,
            })
        };
        let own = self.image.broker_configs.get(&Some(self.config.node_id));
        if let Some(v) = own.and_then(|m| m.get(key)) {
            push_as(name, v, SOURCE_DYNAMIC_BROKER);
        }
        if let Some(v) = self
            .image
            .broker_configs
            .get(&None)
            .and_then(|m| m.get(key))
        {
            push_as(name, v, SOURCE_DYNAMIC_DEFAULT_BROKER);
        }
        if let Some(v) = self.config.explicit.get(key) {
            push_as(name, v, SOURCE_STATIC_BROKER);
        }
        // `log.retention.hours` and the like, in their own unit.
        for (synonym, _) in time_synonyms(key) {
            if let Some(v) = self.config.explicit.get(*synonym) {
                push_as(synonym, v, SOURCE_STATIC_BROKER);
            }
        }
        if let Some(v) = broker_default(key) {
            push_as(name, v, SOURCE_DEFAULT);
        }
        out
    }
}

impl BrokerDefaults for BrokerView<'_> {
    fn config(&self) -> &BrokerConfig {
        self.config
    }

    fn dynamic(&self, key: &str) -> Option<&str> {
        BrokerView::dynamic(self, key)
    }

    fn sources(&self, key: &str) -> Vec<ConfigSynonym> {
        BrokerView::sources(self, key)
    }
}

/// The `&'static` spelling of a broker key this build knows.
fn broker_key_name(key: &str) -> Option<&'static str> {
    static_keys()
        .find(|k| *k == key)
        .or_else(|| dynamic_keys().find(|k| *k == key))
        .or_else(|| kafka_dynamic_key(key).map(|k| k.name))
}

/// The broker keys that can be set dynamically and act at once: the
/// broker synonyms of topic configs.
pub fn dynamic_keys() -> impl Iterator<Item = &'static str> {
    TOPIC_CONFIGS.iter().filter_map(|k| match k.synonym {
        Synonym::Dynamic(s) => Some(s),
        _ => None,
    })
}

pub fn is_dynamic(key: &str) -> bool {
    dynamic_keys().any(|k| k == key)
        || crate::tls::is_reloadable(key)
        || kafka_dynamic_key(key).is_some()
        || crate::tls::unprefixed(key) != key
            && kafka_dynamic_key(crate::tls::unprefixed(key)).is_some_and(|k| k.listener)
}

/// One of Kafka's other dynamic broker keys (see [`KAFKA_DYNAMIC_KEYS`]).
pub struct KafkaDynamicKey {
    pub name: &'static str,
    kind: Kind,
    default: &'static str,
    /// A listener or security key (Kafka's `DynamicListenerConfig`): it
    /// may also be set per listener (`listener.name.<l>.<key>`).
    listener: bool,
    /// Set per broker only (Kafka's `PerBrokerConfigs`).
    per_broker: bool,
}

const fn key(
    name: &'static str,
    kind: Kind,
    default: &'static str,
    listener: bool,
    per_broker: bool,
) -> KafkaDynamicKey {
    KafkaDynamicKey {
        name,
        kind,
        default,
        listener,
        per_broker,
    }
}

/// Kafka's dynamic broker keys (`DynamicBrokerConfig.AllDynamicConfigs`)
/// beyond the topic-config synonyms and the reloadable TLS files above:
/// AlterConfigs accepts them (validated by their type), the metadata log
/// stores them, DescribeConfigs shows them with their source, so tools and
/// tests written for Kafka run unchanged (librdkafka's admin test sets
/// `sasl.kerberos.min.time.before.relogin`). Tessera does not act on them:
/// their documentation says so ([`INERT_DOC`], [`STARTUP_ONLY_DOC`]).
const KAFKA_DYNAMIC_KEYS: &[KafkaDynamicKey] = &[
    // DynamicListenerConfig: listeners, SSL and SASL (per broker).
    key("listeners", Kind::AnyList, "PLAINTEXT://:9092", true, true),
    key("advertised.listeners", Kind::AnyList, "", true, true),
    key(
        "listener.security.protocol.map",
        Kind::AnyList,
        "SASL_SSL:SASL_SSL,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT",
        true,
        true,
    ),
    key(
        "principal.builder.class",
        Kind::Text,
        "org.apache.kafka.common.security.authenticator.DefaultKafkaPrincipalBuilder",
        true,
        true,
    ),
    key("ssl.protocol", Kind::Text, "TLSv1.3", true, true),
    key("ssl.provider", Kind::Text, "", true, true),
    key("ssl.cipher.suites", Kind::AnyList, "", true, true),
    key(
        "ssl.enabled.protocols",
        Kind::AnyList,
        "TLSv1.2,TLSv1.3",
        true,
        true,
    ),
    key("ssl.keystore.password", Kind::Password, "", true, true),
    key("ssl.key.password", Kind::Password, "", true, true),
    key("ssl.truststore.password", Kind::Password, "", true, true),
    key("ssl.keystore.key", Kind::Password, "", true, true),
    key(
        "ssl.keystore.certificate.chain",
        Kind::Password,
        "",
        true,
        true,
    ),
    key(
        "ssl.truststore.certificates",
        Kind::Password,
        "",
        true,
        true,
    ),
    key(
        "ssl.keymanager.algorithm",
        Kind::Text,
        "SunX509",
        true,
        true,
    ),
    key("ssl.trustmanager.algorithm", Kind::Text, "PKIX", true, true),
    key(
        "ssl.endpoint.identification.algorithm",
        Kind::Text,
        "https",
        true,
        true,
    ),
    key(
        "ssl.secure.random.implementation",
        Kind::Text,
        "",
        true,
        true,
    ),
    key(
        "ssl.client.auth",
        Kind::OneOf(&["none", "requested", "required"]),
        "none",
        true,
        true,
    ),
    key("ssl.engine.factory.class", Kind::Text, "", true, true),
    key(
        "sasl.mechanism.inter.broker.protocol",
        Kind::Text,
        "GSSAPI",
        true,
        true,
    ),
    key("sasl.jaas.config", Kind::Password, "", true, true),
    key(
        "sasl.enabled.mechanisms",
        Kind::AnyList,
        "GSSAPI",
        true,
        true,
    ),
    key("sasl.kerberos.service.name", Kind::Text, "", true, true),
    key(
        "sasl.kerberos.kinit.cmd",
        Kind::Text,
        "/usr/bin/kinit",
        true,
        true,
    ),
    key(
        "sasl.kerberos.ticket.renew.window.factor",
        Kind::AnyDouble,
        "0.8",
        true,
        true,
    ),
    key(
        "sasl.kerberos.ticket.renew.jitter",
        Kind::AnyDouble,
        "0.05",
        true,
        true,
    ),
    key(
        "sasl.kerberos.min.time.before.relogin",
        Kind::Long(0),
        "60000",
        true,
        true,
    ),
    key(
        "sasl.kerberos.principal.to.local.rules",
        Kind::AnyList,
        "DEFAULT",
        true,
        true,
    ),
    key(
        "sasl.login.refresh.window.factor",
        Kind::AnyDouble,
        "0.8",
        true,
        true,
    ),
    key(
        "sasl.login.refresh.window.jitter",
        Kind::AnyDouble,
        "0.05",
        true,
        true,
    ),
    key(
        "sasl.login.refresh.min.period.seconds",
        Kind::Int(0),
        "60",
        true,
        true,
    ),
    key(
        "sasl.login.refresh.buffer.seconds",
        Kind::Int(0),
        "300",
        true,
        true,
    ),
    // Connection limits and network threads: cluster-wide allowed.
    key("max.connections", Kind::Int(0), "2147483647", true, false),
    key(
        "max.connection.creation.rate",
        Kind::Int(0),
        "2147483647",
        true,
        false,
    ),
    key("num.network.threads", Kind::Int(1), "3", true, false),
    key(
        "max.connections.per.ip",
        Kind::Int(0),
        "2147483647",
        false,
        false,
    ),
    key(
        "max.connections.per.ip.overrides",
        Kind::AnyList,
        "",
        false,
        false,
    ),
    // DynamicThreadPool.
    key("num.io.threads", Kind::Int(1), "8", false, false),
    key("num.replica.fetchers", Kind::Int(1), "1", false, false),
    key(
        "num.recovery.threads.per.data.dir",
        Kind::Int(1),
        "2",
        false,
        false,
    ),
    key("background.threads", Kind::Int(1), "10", false, false),
    // LogCleaner.
    key("log.cleaner.threads", Kind::Int(0), "1", false, false),
    key(
        "log.cleaner.dedupe.buffer.size",
        Kind::Long(0),
        "134217728",
        false,
        false,
    ),
    key(
        "log.cleaner.io.buffer.load.factor",
        Kind::AnyDouble,
        "0.9",
        false,
        false,
    ),
    key(
        "log.cleaner.io.buffer.size",
        Kind::Int(0),
        "524288",
        false,
        false,
    ),
    key(
        "log.cleaner.io.max.bytes.per.second",
        Kind::AnyDouble,
        "1.7976931348623157E308",
        false,
        false,
    ),
    key(
        "log.cleaner.backoff.ms",
        Kind::Long(0),
        "15000",
        false,
        false,
    ),
    // Metrics, config providers, producer state.
    key("metric.reporters", Kind::AnyList, "", false, false),
    key("config.providers", Kind::AnyList, "", false, false),
    key(
        "producer.id.expiration.ms",
        Kind::Int(1),
        "86400000",
        false,
        false,
    ),
    key(
        "transaction.partition.verification.enable",
        Kind::Bool,
        "true",
        false,
        false,
    ),
    // DynamicRemoteLogConfig (tiered storage, which Tessera does not have).
    key(
        "remote.log.index.file.cache.total.size.bytes",
        Kind::Long(1),
        "1073741824",
        false,
        false,
    ),
    key(
        "remote.fetch.max.wait.ms",
        Kind::Int(1),
        "500",
        false,
        false,
    ),
    key(
        "remote.log.manager.copy.max.bytes.per.second",
        Kind::Long(1),
        "9223372036854775807",
        false,
        false,
    ),
    key(
        "remote.log.manager.fetch.max.bytes.per.second",
        Kind::Long(1),
        "9223372036854775807",
        false,
        false,
    ),
    key(
        "remote.log.reader.threads",
        Kind::Int(1),
        "10",
        false,
        false,
    ),
    key(
        "remote.log.manager.copier.thread.pool.size",
        Kind::Int(1),
        "10",
        false,
        false,
    ),
    key(
        "remote.log.manager.expiration.thread.pool.size",
        Kind::Int(1),
        "10",
        false,
        false,
    ),
    key(
        "remote.log.manager.follower.thread.pool.size",
        Kind::Int(1),
        "2",
        false,
        false,
    ),
    key(
        "remote.list.offsets.request.timeout.ms",
        Kind::Long(1),
        "30000",
        false,
        false,
    ),
];

/// The documentation of a Kafka dynamic key Tessera has no use for.
const INERT_DOC: &str = "Kafka's dynamic broker config: accepted, checked and stored so that tools written for Kafka work; Tessera does not use it.";

/// The documentation of a Kafka dynamic key Tessera reads at startup only.
const STARTUP_ONLY_DOC: &str = "Kafka's dynamic broker config: accepted, checked and stored so that tools written for Kafka work; Tessera reads this key from its static config at startup only, so a dynamic value does not change what the broker does.";

/// One of Kafka's other dynamic broker keys, by name.
pub fn kafka_dynamic_key(key: &str) -> Option<&'static KafkaDynamicKey> {
    KAFKA_DYNAMIC_KEYS.iter().find(|k| k.name == key)
}

/// The keys among `keys` Kafka sets per broker only, never as the
/// cluster-wide default (`DynamicBrokerConfig.PerBrokerConfigs`).
pub fn per_broker_only<'a>(keys: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    keys.into_iter()
        .filter(|k| kafka_dynamic_key(crate::tls::unprefixed(k)).is_some_and(|d| d.per_broker))
        .collect()
}

/// The topic config a dynamic broker key is the default of.
fn topic_of(key: &str) -> Option<&'static crate::topic_config::TopicKey> {
    TOPIC_CONFIGS.iter().find(|k| match k.synonym {
        Synonym::Dynamic(s) | Synonym::Static(s) => s == key,
        Synonym::None => false,
    })
}

/// A broker key's default: tessera's where it reads the key at startup,
/// else the default of the topic config it stands for (Kafka's broker
/// defaults of these keys are the topic defaults).
pub fn broker_default(key: &str) -> Option<&'static str> {
    static_default(key)
        .or_else(|| topic_of(key).map(|k| k.default))
        .or_else(|| kafka_dynamic_key(key).map(|k| k.default))
}

/// Type (Kafka's ConfigType code) and documentation of the keys tessera
/// reads at startup.
const STATIC_KEYS: &[(&str, i8, &str)] = &[
    (
        "offsets.retention.minutes",
        3,
        "How long committed offsets of an empty group (or of topics it no longer subscribes to) are kept.",
    ),
    (
        "offsets.retention.check.interval.ms",
        5,
        "How often committed offsets are checked for expiry.",
    ),
    (
        "offsets.topic.segment.bytes",
        3,
        "The segment size of __consumer_offsets, set when it is created.",
    ),
    (
        "transaction.state.log.segment.bytes",
        3,
        "The segment size of __transaction_state, set when it is created.",
    ),
    (
        "log.cleaner.enable",
        1,
        "Run the log cleaner, which compacts topics whose cleanup.policy includes compact.",
    ),
    (
        "log.cleaner.threads",
        3,
        "How many ranges the log cleaner compacts at once.",
    ),
    (
        "log.cleaner.io.max.bytes.per.second",
        6,
        "The log cleaner's read plus write rate, over all its threads.",
    ),
    (
        "log.cleaner.backoff.ms",
        5,
        "The pause between two passes of the log cleaner.",
    ),
    (
        "log.retention.check.interval.ms",
        5,
        "How often each range's primary deletes sealed segments past retention.",
    ),
    (
        "node.id",
        3,
        "This node's id, as broker and as metadata voter.",
    ),
    (
        "listeners",
        7,
        "The Kafka listeners, NAME://host:port,... (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL or a name from listener.security.protocol.map).",
    ),
    (
        "advertised.listeners",
        7,
        "NAME://host:port per listener, given in Metadata to the clients connected on it; each listener's own address when absent.",
    ),
    (
        "listener.security.protocol.map",
        7,
        "Listener name to security protocol (NAME:PROTOCOL,...).",
    ),
    (
        "ssl.keystore.type",
        2,
        "The format of the server's key and certificates: only PEM is supported.",
    ),
    (
        "ssl.keystore.location",
        2,
        "A PEM file with the server's private key and certificate chain, for SSL and SASL_SSL listeners.",
    ),
    (
        "ssl.key.password",
        9,
        "The password of an encrypted private key (not supported: give an unencrypted key).",
    ),
    (
        "ssl.keystore.certificate.chain",
        9,
        "The server's certificate chain as PEM text (instead of ssl.keystore.location).",
    ),
    (
        "ssl.keystore.key",
        9,
        "The server's private key as PEM text (with ssl.keystore.certificate.chain).",
    ),
    (
        "ssl.truststore.type",
        2,
        "The format of the truststore: only PEM is supported.",
    ),
    (
        "ssl.truststore.location",
        2,
        "A PEM file with the CA certificates client certificates are checked against.",
    ),
    (
        "ssl.truststore.certificates",
        9,
        "The CA certificates as PEM text (instead of ssl.truststore.location).",
    ),
    (
        "ssl.client.auth",
        2,
        "Client certificates on TLS listeners: none, requested or required; the principal is User:<subject DN>.",
    ),
    (
        "inter.broker.listener.name",
        2,
        "The listener registered for other brokers; empty: the first PLAINTEXT listener, else the first.",
    ),
    (
        "security.inter.broker.protocol",
        2,
        "Names the inter-broker listener by its protocol when inter.broker.listener.name is not set.",
    ),
    (
        "sasl.mechanism.inter.broker.protocol",
        2,
        "The SASL mechanism this broker logs in with to other brokers' inter-broker listener (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).",
    ),
    (
        "sasl.mechanism.controller.protocol",
        2,
        "The SASL mechanism this node logs in with to the controllers' listener (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).",
    ),
    (
        "ssl.endpoint.identification.algorithm",
        2,
        "https: this broker checks the host name in the certificates of the brokers and controllers it connects to; empty: not.",
    ),
    (
        "sasl.enabled.mechanisms",
        7,
        "SASL mechanisms of SASL listeners (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512); listener.name.<name>.sasl.enabled.mechanisms overrides it per listener, and listener.name.<name>.plain.sasl.jaas.config lists PLAIN users (user_NAME=\"password\").",
    ),
    (
        "authorizer.class.name",
        2,
        "Turns authorization (ACLs) on: org.apache.kafka.metadata.authorizer.StandardAuthorizer or kafka.security.authorizer.AclAuthorizer (one ACL model, Kafka's StandardAuthorizer). Empty: everyone may do everything.",
    ),
    (
        "super.users",
        2,
        "Principals allowed everything whatever the ACLs, separated by semicolons (User:admin;User:ops).",
    ),
    (
        "allow.everyone.if.no.acl.found",
        1,
        "With an authorizer: whether a resource with no ACL at all is open to everyone.",
    ),
    (
        "admin.listener",
        2,
        "Tessera: the HTTP address of /metrics, /health and /ready.",
    ),
    ("log.dirs", 2, "The data directory (the first one listed)."),
    (
        "broker.rack",
        2,
        "The rack of this broker, for replica placement.",
    ),
    (
        "process.roles",
        7,
        "The roles of this node: broker,controller (combined) or broker (follows the metadata log as a learner).",
    ),
    (
        "controller.quorum.voters",
        7,
        "The metadata quorum as id@host:port entries; empty: this node alone.",
    ),
    (
        "controller.listener.names",
        7,
        "Listeners that are the KRaft controller's (as in Kafka's server.properties): not served as Kafka listeners; the metadata quorum listens at this node's entry in controller.quorum.voters.",
    ),
    (
        "metadata.listener",
        7,
        "Tessera: where a broker-only node listens for the metadata log (host:port; empty: the listener's host, a free port).",
    ),
    (
        "broker.heartbeat.interval.ms",
        3,
        "How often this broker heartbeats to the active controller.",
    ),
    (
        "broker.session.timeout.ms",
        3,
        "A broker not heard from for this long is fenced.",
    ),
    (
        "num.partitions",
        3,
        "The partition count of auto-created topics and of CreateTopics with -1.",
    ),
    (
        "default.replication.factor",
        3,
        "The replication factor of auto-created topics and of CreateTopics with -1.",
    ),
    (
        "auto.create.topics.enable",
        1,
        "Whether Metadata and Produce create unknown topics.",
    ),
    (
        "migration.append.enable",
        1,
        "Tessera only: whether this broker takes MigrateAppend requests (tessera migrate writing copied batches at their source offsets). Enable it on the target only while migrating.",
    ),
    (
        "socket.request.max.bytes",
        3,
        "The largest request frame accepted; a larger one closes the connection.",
    ),
    (
        "sasl.server.max.receive.size",
        3,
        "The largest frame a SASL listener reads before the client has authenticated; a larger one closes the connection.",
    ),
    (
        "connections.max.idle.ms",
        5,
        "A connection that completes no request for this long is closed (an idle client, or one sending a request slower than this).",
    ),
    (
        "max.connections",
        3,
        "The most connections the broker holds; beyond it new connections wait to be accepted (the inter-broker listener does not wait).",
    ),
    (
        "max.connections.per.ip",
        3,
        "The most connections from one client address; a connection beyond it is closed at once.",
    ),
    (
        "max.connections.per.ip.overrides",
        2,
        "Per-address exceptions to max.connections.per.ip: host:count pairs, comma-separated (a hostname is resolved at startup).",
    ),
    (
        "connections.max.reauth.ms",
        5,
        "The lifetime of an authenticated SASL session (KIP-368, 0: none); a client re-authenticates before it ends or its connection is closed. listener.name.<listener>.<mechanism>.connections.max.reauth.ms overrides it.",
    ),
    (
        "message.max.bytes",
        3,
        "The largest record batch accepted, unless the topic sets max.message.bytes.",
    ),
    (
        "log.segment.bytes",
        3,
        "The size at which a segment rolls, unless the topic sets segment.bytes.",
    ),
    (
        "log.roll.ms",
        5,
        "The age at which a segment rolls, unless the topic sets segment.ms.",
    ),
    (
        "log.retention.ms",
        5,
        "How long segments are kept, unless the topic sets retention.ms.",
    ),
    (
        "log.retention.minutes",
        3,
        "How long segments are kept, in minutes, when log.retention.ms is not set.",
    ),
    (
        "log.retention.hours",
        3,
        "How long segments are kept, in hours, when neither log.retention.ms nor log.retention.minutes is set.",
    ),
    (
        "log.roll.hours",
        3,
        "The age in hours at which a segment rolls, when log.roll.ms is not set.",
    ),
    (
        "log.retention.bytes",
        5,
        "The most bytes a partition keeps, unless the topic sets retention.bytes.",
    ),
    (
        "min.insync.replicas",
        3,
        "The fewest in-sync replicas for acks=all, unless the topic sets it.",
    ),
    (
        "replica.lag.time.max.ms",
        5,
        "A follower not caught up for this long leaves the in-sync replicas.",
    ),
    (
        "replica.heal.delay.ms",
        5,
        "How long a broker stays fenced before its copies of sealed segments are re-created elsewhere.",
    ),
    (
        "replica.heal.max.bytes.per.sec",
        5,
        "The rate at which this broker copies segments for healing and repair.",
    ),
    (
        "admin.listener.ssl.enable",
        1,
        "The admin port (the console included) speaks TLS with the keys of the first SSL or SASL_SSL listener.",
    ),
    (
        "console.enable",
        1,
        "The web console at / of the admin listener.",
    ),
    (
        "console.read.only",
        1,
        "The web console shows the cluster but changes nothing.",
    ),
    (
        "console.messages.enable",
        1,
        "The web console shows message keys, values and headers.",
    ),
    (
        "replica.producer.snapshot.prefetch.enable",
        1,
        "A follower without the range's older segments fetches the producer snapshot where its segment starts as it follows it (false only in tests: fetched only when the broker is to lead).",
    ),
    (
        "replica.placement.rebalance.enable",
        1,
        "The active controller moves the next segments of existing ranges onto less loaded brokers (one that joined), at a segment boundary.",
    ),
    (
        "replica.placement.roll.enable",
        1,
        "A primary's own segment roll places the next segment: followers on fenced brokers or out of sync replaced, one swapped onto a less loaded broker.",
    ),
    (
        "replica.placement.rebalance.interval.ms",
        5,
        "How often the active controller looks for ranges to re-place.",
    ),
    (
        "replica.placement.rebalance.max.ranges",
        3,
        "The most ranges re-placed per look, and whose leadership moves per leader-imbalance check.",
    ),
    (
        "auto.leader.rebalance.enable",
        1,
        "The active controller evens out the number of ranges each live broker leads, handing a range's next segment to a follower of it (a broker that restarted or joined leads again).",
    ),
    (
        "leader.imbalance.check.interval.seconds",
        5,
        "How often the active controller checks the leadership balance.",
    ),
    (
        "leader.imbalance.per.broker.percentage",
        3,
        "A broker whose bytes in as primary exceed the live brokers' mean by more than this percent hands ranges to followers at the leadership check (Kafka measures this ratio in preferred leaders; tessera in bytes in).",
    ),
    (
        "leader.load.balance.min.bytes.per.sec",
        5,
        "Below this mean bytes in per live broker the leadership check moves nothing by load (an idle cluster's rates are noise).",
    ),
    (
        "quota.window.num",
        3,
        "The number of samples to retain in memory for client quotas.",
    ),
    (
        "quota.window.size.seconds",
        3,
        "The time span of each sample for client quotas.",
    ),
    (
        "replica.selector.class",
        8,
        "RackAwareReplicaSelector lets consumers with client.rack read sealed data from a replica in their rack; empty: leaders only.",
    ),
    (
        "controlled.shutdown.enable",
        1,
        "On SIGTERM, move the leadership of this broker's replicated ranges to other replicas before stopping.",
    ),
    (
        "controlled.shutdown.max.retries",
        3,
        "Attempts of a controlled shutdown's leadership moves.",
    ),
    (
        "controlled.shutdown.retry.backoff.ms",
        5,
        "How long one controlled-shutdown attempt waits for its moves.",
    ),
    (
        "offsets.topic.replication.factor",
        4,
        "The replication factor of __consumer_offsets (capped at the live brokers).",
    ),
    (
        "transaction.state.log.replication.factor",
        4,
        "The replication factor of __transaction_state (capped at the live brokers).",
    ),
    (
        "log.cleanup.policy",
        7,
        "The cleanup policy of topics that set none.",
    ),
    (
        "log.message.timestamp.type",
        2,
        "The timestamp type of topics that set none.",
    ),
    (
        "compression.type",
        2,
        "The codec batches of topics that set none are stored with (uncompressed, gzip, snappy, lz4, zstd; producer keeps the producer's).",
    ),
    (
        "metadata.snapshot.interval.entries",
        5,
        "Metadata log entries between snapshots.",
    ),
    (
        "controller.quorum.fetch.timeout.ms",
        3,
        "How long a controller voter hears nothing from the quorum's leader before it stands for election.",
    ),
    (
        "group.initial.rebalance.delay.ms",
        3,
        "How long the first rebalance of an empty group waits for more members.",
    ),
    (
        "group.min.session.timeout.ms",
        3,
        "The shortest session timeout a group member may ask for.",
    ),
    (
        "group.max.session.timeout.ms",
        3,
        "The longest session timeout a group member may ask for.",
    ),
    ("group.max.size", 3, "The most members of a classic group."),
    (
        "group.consumer.session.timeout.ms",
        3,
        "KIP-848 members are fenced after this long without a heartbeat.",
    ),
    (
        "group.consumer.heartbeat.interval.ms",
        3,
        "The heartbeat interval told to KIP-848 members.",
    ),
    (
        "group.consumer.max.size",
        3,
        "The most members of a KIP-848 consumer group.",
    ),
    (
        "group.consumer.assignors",
        7,
        "The server-side assignors of KIP-848 groups, the first the default.",
    ),
    (
        "offset.metadata.max.bytes",
        3,
        "The largest metadata string of a committed offset.",
    ),
    (
        "transaction.max.timeout.ms",
        3,
        "The largest transaction.timeout.ms a producer may ask for.",
    ),
    (
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        3,
        "How often timed-out transactions are looked for.",
    ),
    (
        "transactional.id.expiration.ms",
        3,
        "An idle transactional id is forgotten after this long.",
    ),
    (
        "range.policy.enable",
        1,
        "Tessera: whether ranges split and merge automatically.",
    ),
    (
        "range.policy.interval.ms",
        5,
        "Tessera: how often range load is measured and decided on.",
    ),
    (
        "range.split.bytes.per.sec",
        5,
        "Tessera: a range producing above this rate splits.",
    ),
    (
        "range.merge.bytes.per.sec",
        5,
        "Tessera: two adjacent ranges below this rate merge.",
    ),
    (
        "range.min.count",
        3,
        "Tessera: the fewest active ranges per topic.",
    ),
    (
        "range.max.count",
        3,
        "Tessera: the most active ranges per topic.",
    ),
    (
        "range.policy.sustain.intervals",
        3,
        "Tessera: intervals a rate must last before the policy acts.",
    ),
];

/// Type and documentation of a broker key.
fn broker_key_info(key: &str) -> (i8, &'static str) {
    let kafka = kafka_dynamic_key(key);
    if let Some((_, t, doc)) = STATIC_KEYS.iter().find(|(k, _, _)| *k == key) {
        // A key Tessera reads at startup that Kafka can also change at
        // runtime: its doc says a dynamic value does not act.
        return (
            *t,
            if kafka.is_some() {
                STARTUP_ONLY_DOC
            } else {
                doc
            },
        );
    }
    if let Some(k) = topic_of(key) {
        return (k.kind.config_type(), k.doc);
    }
    kafka.map_or((2, ""), |k| (k.kind.config_type(), INERT_DOC))
}

/// DescribeConfigs of a BROKER resource. `per_broker` (resource name = this
/// node id): every broker config, static and dynamic, with its source;
/// otherwise (resource name "") only the cluster-wide dynamic defaults, as
/// Kafka answers.
pub fn describe_broker_configs(view: &BrokerView<'_>, per_broker: bool) -> Vec<DescribedConfig> {
    let mut names: Vec<&'static str> = static_keys()
        .chain(dynamic_keys())
        .chain(KAFKA_DYNAMIC_KEYS.iter().map(|k| k.name))
        .collect();
    names.sort_unstable();
    names.dedup();
    let overrides = listener_overrides(view, per_broker);
    let mut described: Vec<DescribedConfig> = names
        .into_iter()
        .filter_map(|name| {
            let mut synonyms = view.sources(name);
            if !per_broker {
                synonyms.retain(|s| s.source == SOURCE_DYNAMIC_DEFAULT_BROKER);
                synonyms.first()?;
            }
            let (value, source) = synonyms
                .first()
                .map_or((String::new(), SOURCE_DEFAULT), |s| {
                    (in_millis(&s.name, &s.value), s.source)
                });
            let (config_type, doc) = broker_key_info(name);
            Some(DescribedConfig {
                name: name.into(),
                value,
                source,
                config_type,
                read_only: !is_dynamic(name),
                sensitive: config_type == Kind::Password.config_type(),
                synonyms,
                doc,
            })
        })
        .collect();
    described.extend(overrides);
    described.sort_by(|a, b| a.name.cmp(&b.name));
    described
}

/// The stored keys no fixed name covers, the listener overrides
/// (`listener.name.<l>.ssl.keystore.location`), as Kafka lists them: the
/// override first among its synonyms, then the unprefixed key's sources.
fn listener_overrides(view: &BrokerView<'_>, per_broker: bool) -> Vec<DescribedConfig> {
    let level = per_broker.then_some(view.config.node_id);
    let source = if per_broker {
        SOURCE_DYNAMIC_BROKER
    } else {
        SOURCE_DYNAMIC_DEFAULT_BROKER
    };
    view.image
        .broker_configs
        .get(&level)
        .into_iter()
        .flatten()
        .filter(|(key, _)| broker_key_name(key).is_none())
        .map(|(key, value)| {
            let base = crate::tls::unprefixed(key);
            let mut synonyms = vec![ConfigSynonym {
                name: key.clone().into(),
                value: value.clone(),
                source,
            }];
            if per_broker {
                synonyms.extend(view.sources(base));
            }
            let (config_type, doc) = broker_key_info(base);
            DescribedConfig {
                name: key.clone().into(),
                value: value.clone(),
                source,
                config_type,
                read_only: false,
                sensitive: config_type == Kind::Password.config_type(),
                synonyms,
                doc,
            }
        })
        .collect()
}

/// Checks one dynamic broker config as Kafka's `DynamicBrokerConfig`
/// does; every failure is INVALID_REQUEST, Kafka's answer for broker
/// configs (KAFKA-13609).
pub fn check_dynamic(key: &str, value: &str) -> Result<(), ApiError> {
    if !is_dynamic(key) {
        return Err(ApiError::InvalidRequest(
            if broker_key_name(key).is_some() {
                format!("Cannot update these configs dynamically: Set({key})")
            } else {
                format!("Unknown broker config: {key}")
            },
        ));
    }
    let kind = topic_of(key)
        .map(|k| k.kind)
        .or_else(|| kafka_dynamic_key(crate::tls::unprefixed(key)).map(|k| k.kind))
        .unwrap_or(Kind::Text);
    check_value(key, kind, value).map_err(|e| match e {
        ApiError::InvalidConfig(m) => ApiError::InvalidRequest(m),
        other => other,
    })
}

/// Whether the dynamic broker key `key` is a list (APPEND/SUBTRACT).
pub fn is_list(key: &str) -> bool {
    is_dynamic(key)
        && (topic_of(key).is_some_and(|k| k.kind.is_list())
            || kafka_dynamic_key(crate::tls::unprefixed(key)).is_some_and(|k| k.kind.is_list()))
}

/// Validates a broker's whole new set of dynamic configs.
pub fn validate_dynamic(configs: &BTreeMap<String, String>) -> Result<(), ApiError> {
    configs.iter().try_for_each(|(k, v)| check_dynamic(k, v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topic_config::SOURCE_STATIC_BROKER;
    use tessera_metadata::MetadataRecord;

    #[test]
    fn every_static_key_has_a_type_and_a_doc() {
        for key in static_keys() {
            assert!(
                STATIC_KEYS
                    .iter()
                    .any(|(k, _, d)| *k == key && !d.is_empty()),
                "{key} has no entry in STATIC_KEYS"
            );
        }
        for (k, _, _) in STATIC_KEYS {
            assert!(static_default(k).is_some(), "{k} is not a broker key");
        }
    }

    #[test]
    fn dynamic_keys_are_kafkas() {
        for k in [
            "log.retention.ms",
            "log.retention.bytes",
            "log.segment.bytes",
            "log.roll.ms",
            "message.max.bytes",
            "min.insync.replicas",
            "compression.type",
            "log.cleanup.policy",
            "log.message.timestamp.type",
        ] {
            assert!(is_dynamic(k), "{k}");
            assert!(broker_default(k).is_some(), "{k}");
        }
        for k in [
            "node.id",
            "num.partitions",
            "log.dirs",
            "log.message.format.version",
            "range.min.count",
            "retention.ms",
        ] {
            assert!(!is_dynamic(k), "{k}");
        }
        assert!(is_list("log.cleanup.policy"));
        assert!(!is_list("log.retention.ms"));
    }

    #[test]
    fn dynamic_values_are_checked_and_refused_as_invalid_request() {
        assert!(check_dynamic("log.retention.ms", "1000").is_ok());
        assert!(check_dynamic("log.cleanup.policy", "compact,delete").is_ok());
        for (k, v) in [
            ("log.retention.ms", "soon"),
            ("min.insync.replicas", "0"),
            ("node.id", "3"),
            ("no.such.key", "1"),
            ("log.retention.hours", "1"),
        ] {
            let e = check_dynamic(k, v).unwrap_err();
            assert_eq!(e.code(), 42, "{k}={v}: {e}");
        }
        assert!(check_dynamic("node.id", "3")
            .unwrap_err()
            .to_string()
            .contains("Cannot update these configs dynamically"));
    }

    #[test]
    fn kafkas_other_dynamic_keys_are_accepted_by_type() {
        // librdkafka's admin test sets this one on a broker.
        assert!(check_dynamic("sasl.kerberos.min.time.before.relogin", "60000").is_ok());
        assert!(check_dynamic("listener.name.external.ssl.cipher.suites", "A,B").is_ok());
        assert!(check_dynamic(
            "log.cleaner.io.max.bytes.per.second",
            "1.7976931348623157E308"
        )
        .is_ok());
        assert!(check_dynamic("metric.reporters", "com.example.Reporter").is_ok());
        assert!(is_list("metric.reporters"));
        for (k, v) in [
            ("sasl.kerberos.min.time.before.relogin", "soon"),
            ("num.io.threads", "0"),
            ("transaction.partition.verification.enable", "maybe"),
            ("log.cleaner.io.buffer.load.factor", "-1"),
            ("ssl.client.auth", "sometimes"),
            // Only listener keys take a listener prefix.
            ("listener.name.external.num.io.threads", "4"),
        ] {
            let e = check_dynamic(k, v).unwrap_err();
            assert_eq!(e.code(), 42, "{k}={v}: {e}");
        }
        // Listener and security keys are per broker; connection limits
        // and thread pools may be cluster-wide defaults (Kafka's rule).
        assert_eq!(
            per_broker_only([
                "listeners",
                "listener.name.external.ssl.protocol",
                "max.connections",
                "num.io.threads",
                "log.retention.ms",
            ]),
            vec!["listeners", "listener.name.external.ssl.protocol"]
        );
    }

    #[test]
    fn secrets_are_described_as_sensitive_and_inert_keys_say_so() {
        let config = BrokerConfig::from_map(&BTreeMap::new()).unwrap();
        let mut image = MetadataImage::default();
        for (i, (key, value)) in [
            ("sasl.kerberos.min.time.before.relogin", "70000"),
            ("listener.name.external.sasl.jaas.config", "secret"),
        ]
        .into_iter()
        .enumerate()
        {
            image.apply(
                &MetadataRecord::SetBrokerConfig {
                    broker_id: Some(config.node_id),
                    key: key.into(),
                    value: Some(value.into()),
                },
                i as i64 + 1,
            );
        }
        let described = describe_broker_configs(&BrokerView::new(&config, &image), true);
        let get = |name: &str| described.iter().find(|c| c.name == name).unwrap();
        let relogin = get("sasl.kerberos.min.time.before.relogin");
        assert_eq!(relogin.value, "70000");
        assert_eq!(relogin.source, SOURCE_DYNAMIC_BROKER);
        assert!(!relogin.read_only && !relogin.sensitive);
        assert_eq!(relogin.doc, INERT_DOC);
        let jaas = get("listener.name.external.sasl.jaas.config");
        assert!(jaas.sensitive, "a secret is never shown");
        assert!(get("ssl.keystore.key").sensitive);
        // A key Tessera reads at startup says a dynamic value does not act.
        assert_eq!(get("max.connections").doc, STARTUP_ONLY_DOC);
        assert!(!get("max.connections").read_only);
        assert!(get("node.id").read_only);
    }

    #[test]
    fn broker_description_marks_sources_and_read_only() {
        let mut map = BTreeMap::new();
        map.insert("num.partitions".to_string(), "3".to_string());
        let config = BrokerConfig::from_map(&map).unwrap();
        let mut image = MetadataImage::default();
        for (i, (broker_id, key, value)) in [
            (None, "log.retention.ms", "1000"),
            (Some(1), "log.retention.ms", "2000"),
            (None, "compression.type", "lz4"),
            (Some(2), "message.max.bytes", "7"),
            (
                Some(1),
                "listener.name.external.ssl.keystore.location",
                "/new.pem",
            ),
        ]
        .into_iter()
        .enumerate()
        {
            image.apply(
                &MetadataRecord::SetBrokerConfig {
                    broker_id,
                    key: key.into(),
                    value: Some(value.into()),
                },
                i as i64,
            );
        }
        let view = BrokerView::new(&config, &image);
        let all = describe_broker_configs(&view, true);
        let get = |name: &str| all.iter().find(|c| c.name == name).unwrap();
        let r = get("log.retention.ms");
        assert_eq!(
            (r.value.as_str(), r.source),
            ("2000", SOURCE_DYNAMIC_BROKER)
        );
        assert_eq!(r.synonyms.len(), 3);
        assert!(!r.read_only);
        assert_eq!(r.config_type, 5);
        let c = get("compression.type");
        assert_eq!(
            (c.value.as_str(), c.source),
            ("lz4", SOURCE_DYNAMIC_DEFAULT_BROKER)
        );
        let n = get("num.partitions");
        assert_eq!((n.value.as_str(), n.source), ("3", SOURCE_STATIC_BROKER));
        assert!(n.read_only);
        let m = get("message.max.bytes");
        assert_eq!((m.value.as_str(), m.source), ("1048588", SOURCE_DEFAULT));
        assert!(
            all.iter().all(|c| !c.doc.is_empty()),
            "every key documented"
        );
        // A listener override: listed, then the unprefixed key's sources.
        let o = get("listener.name.external.ssl.keystore.location");
        assert_eq!(
            (o.value.as_str(), o.source, o.read_only),
            ("/new.pem", SOURCE_DYNAMIC_BROKER, false)
        );
        let sources: Vec<(&str, i8)> = o
            .synonyms
            .iter()
            .map(|s| (s.name.as_ref(), s.source))
            .collect();
        assert_eq!(
            sources,
            vec![
                (
                    "listener.name.external.ssl.keystore.location",
                    SOURCE_DYNAMIC_BROKER
                ),
                ("ssl.keystore.location", SOURCE_DEFAULT)
            ]
        );
        assert_eq!(o.doc, get("ssl.keystore.location").doc);
        // The cluster-wide resource: only the dynamic defaults.
        let defaults = describe_broker_configs(&view, false);
        let names: Vec<&str> = defaults.iter().map(|c| c.name.as_ref()).collect();
        assert_eq!(names, vec!["compression.type", "log.retention.ms"]);
        assert!(defaults
            .iter()
            .all(|c| c.source == SOURCE_DYNAMIC_DEFAULT_BROKER && c.synonyms.len() == 1));
    }
}
