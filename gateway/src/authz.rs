//! Authorization of the request being handled: the one place handlers ask
//! "may this connection do OP on RESOURCE" (Kafka's AuthHelper). The
//! decision itself is `tessera_metadata::acl::authorize` over the ACLs of
//! the metadata image; this module adds the request's principal and host
//! (from the connection), the broker's settings, the exemptions, logging
//! of denials (debug) and `tessera_authorization_denied_total`.
//!
//! Authorization is on only when `authorizer.class.name` is set. Then every
//! connection is authorized by its principal, on whichever listener it
//! came in (the inter-broker one too, as in Kafka): only `super.users` are
//! super, and other brokers prove they are brokers with their credentials
//! (SASL, or a client certificate, whose principal is in `super.users` or
//! granted CLUSTER_ACTION). A request handled outside a connection (tests
//! calling handlers, the broker's own internal calls) is allowed.

use std::sync::Arc;

use tessera_metadata::acl::{self, AuthorizerSettings};
use tessera_metadata::MetadataImage;

pub use tessera_metadata::acl::{AclOperation as Op, ResourceType as Resource, CLUSTER_NAME};

use crate::broker::Broker;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::request_context::{Connection, RequestContext};

/// Who is asking and how to decide, for one request.
pub struct Authz<'b> {
    broker: &'b Broker,
    /// None: authorization is off, or the caller is trusted.
    subject: Option<Subject<'b>>,
}

struct Subject<'b> {
    settings: &'b AuthorizerSettings,
    principal: Arc<str>,
    host: String,
    image: Arc<MetadataImage>,
}

impl<'b> Authz<'b> {
    /// The authorization context of a request.
    pub fn of(broker: &'b Broker, ctx: &RequestContext) -> Authz<'b> {
        match &ctx.connection {
            Some(connection) => Authz::for_connection(broker, connection),
            None => Authz {
                broker,
                subject: None,
            },
        }
    }

    /// The authorization context of `connection`'s requests.
    pub fn for_connection(broker: &'b Broker, connection: &Connection) -> Authz<'b> {
        Authz::for_principal(
            broker,
            connection
                .principal
                .clone()
                .unwrap_or_else(|| Arc::from("User:ANONYMOUS")),
            connection
                .peer
                .map(|p| p.ip().to_string())
                .unwrap_or_default(),
        )
    }

    /// The authorization context of `principal` asking from `host` (the
    /// admin HTTP port's callers).
    pub fn for_principal(broker: &'b Broker, principal: Arc<str>, host: String) -> Authz<'b> {
        let subject = broker.config().authorizer.as_ref().map(|settings| Subject {
            settings,
            principal,
            host,
            image: broker.image(),
        });
        Authz { broker, subject }
    }

    /// Whether an authorizer is configured (ACL APIs answer
    /// SECURITY_DISABLED without one).
    pub fn enabled(broker: &Broker) -> bool {
        broker.config().authorizer.is_some()
    }

    /// Whether the request may do `op` on the resource; a denial is logged
    /// and counted.
    pub fn allows(&self, op: Op, rt: Resource, name: &str) -> bool {
        let Some(s) = &self.subject else {
            return true;
        };
        let decision = acl::authorize(
            s.image.acls.values(),
            s.settings,
            &s.principal,
            &s.host,
            op,
            rt,
            name,
        );
        if decision.is_allowed() {
            return true;
        }
        Metrics::add(&self.broker.metrics().authorization_denied, 1);
        tracing::debug!(
            principal = %s.principal,
            host = %s.host,
            operation = %op,
            resource_type = %rt,
            resource = name,
            ?decision,
            "authorization denied"
        );
        false
    }

    /// Like [`Authz::allows`] but neither logged nor counted: for listing
    /// (Metadata of all topics, ListGroups), where unauthorized resources
    /// are left out, not refused.
    pub fn may(&self, op: Op, rt: Resource, name: &str) -> bool {
        let Some(s) = &self.subject else {
            return true;
        };
        acl::authorize(
            s.image.acls.values(),
            s.settings,
            &s.principal,
            &s.host,
            op,
            rt,
            name,
        )
        .is_allowed()
    }

    /// `op` on the cluster resource.
    pub fn allows_cluster(&self, op: Op) -> bool {
        self.allows(op, Resource::Cluster, CLUSTER_NAME)
    }

    /// CREATE on the cluster (not logged: the fallback is per topic) or on
    /// the topic: what creating a topic, or auto-creating it, needs.
    pub fn may_create_topic(&self, name: &str) -> bool {
        self.may(Op::Create, Resource::Cluster, CLUSTER_NAME)
            || self.allows(Op::Create, Resource::Topic, name)
    }

    /// `op` on a topic, or TOPIC_AUTHORIZATION_FAILED.
    pub fn topic(&self, op: Op, name: &str) -> Result<(), ApiError> {
        self.check(
            op,
            Resource::Topic,
            name,
            ApiError::TopicAuthorizationFailed,
        )
    }

    /// `op` on a group, or GROUP_AUTHORIZATION_FAILED.
    pub fn group(&self, op: Op, name: &str) -> Result<(), ApiError> {
        self.check(
            op,
            Resource::Group,
            name,
            ApiError::GroupAuthorizationFailed,
        )
    }

    /// `op` on the cluster, or CLUSTER_AUTHORIZATION_FAILED.
    pub fn cluster(&self, op: Op) -> Result<(), ApiError> {
        self.check(
            op,
            Resource::Cluster,
            CLUSTER_NAME,
            ApiError::ClusterAuthorizationFailed,
        )
    }

    /// `op` on a transactional id, or TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
    pub fn transactional_id(&self, op: Op, id: &str) -> Result<(), ApiError> {
        self.check(
            op,
            Resource::TransactionalId,
            id,
            ApiError::TransactionalIdAuthorizationFailed,
        )
    }

    fn check(&self, op: Op, rt: Resource, name: &str, denied: ApiError) -> Result<(), ApiError> {
        if self.allows(op, rt, name) {
            Ok(())
        } else {
            Err(denied)
        }
    }

    /// `op` (DESCRIBE_CONFIGS or ALTER_CONFIGS) on a config resource of
    /// DescribeConfigs/AlterConfigs: a topic, or the cluster for a broker
    /// or broker logger. Other types are left to the handler.
    pub fn config_resource(&self, op: Op, resource_type: i8, name: &str) -> Result<(), ApiError> {
        match resource_type {
            crate::alter_config::RESOURCE_TOPIC => self.topic(op, name),
            crate::alter_config::RESOURCE_BROKER | BROKER_LOGGER => self.cluster(op),
            _ => Ok(()),
        }
    }

    /// Kafka's `authorizeByResourceType`: `op` on some resource of `rt`.
    pub fn allows_any(&self, op: Op, rt: Resource) -> bool {
        let Some(s) = &self.subject else {
            return true;
        };
        let allowed = acl::authorize_any(
            s.image.acls.values(),
            s.settings,
            &s.principal,
            &s.host,
            op,
            rt,
        );
        if !allowed {
            Metrics::add(&self.broker.metrics().authorization_denied, 1);
            tracing::debug!(principal = %s.principal, operation = %op, resource_type = %rt, "authorization denied (any resource)");
        }
        allowed
    }

    /// Kafka's authorized-operations bitfield of a resource: 0 without
    /// DESCRIBE on it (as KafkaApis answers).
    pub fn operations(&self, rt: Resource, name: &str) -> i32 {
        match &self.subject {
            None => acl::all_operations(rt),
            Some(_) if !self.may(Op::Describe, rt, name) => 0,
            Some(s) => acl::authorized_operations(
                s.image.acls.values(),
                s.settings,
                &s.principal,
                &s.host,
                rt,
                name,
            ),
        }
    }
}

/// Kafka's config resource type of a broker logger.
const BROKER_LOGGER: i8 = 8;
