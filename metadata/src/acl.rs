//! Kafka's ACL model and the authorization decision, as Apache Kafka's
//! `StandardAuthorizer` makes it (StandardAuthorizerData): pure functions
//! of the ACLs in the metadata image, the principal, the client's host and
//! the requested operation on a resource.
//!
//! - A resource matches an ACL of the same resource type whose pattern is
//!   LITERAL with the same name or the wildcard `*`, or PREFIXED with a
//!   prefix of the name.
//! - An ACL applies to the principal it names or to `User:*`, and to the
//!   host it names or to `*`.
//! - A DENY whose operation is the one asked for (or ALL) wins over every
//!   ALLOW. An ALLOW of the operation, of ALL, or of an operation implying
//!   it (DESCRIBE is implied by READ, WRITE, DELETE and ALTER;
//!   DESCRIBE_CONFIGS by ALTER_CONFIGS) allows.
//! - Super users are always allowed. A resource with no ACL at all (for
//!   any principal) is allowed only with `allow.everyone.if.no.acl.found`.
//!
//! The numbers of every enum are Kafka's wire values.

use std::fmt;

/// Kafka's literal name of the cluster resource.
pub const CLUSTER_NAME: &str = "kafka-cluster";
/// The wildcard resource name of a LITERAL pattern.
pub const WILDCARD_RESOURCE: &str = "*";
/// The wildcard principal (Kafka's WILDCARD_KAFKA_PRINCIPAL).
pub const WILDCARD_PRINCIPAL: &str = "User:*";
/// The wildcard host.
pub const WILDCARD_HOST: &str = "*";

macro_rules! kafka_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident = $value:expr, $text:expr;)* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name {
            $($variant = $value,)*
        }

        impl $name {
            /// Every value, in wire order.
            pub const ALL_VALUES: &'static [$name] = &[$($name::$variant,)*];

            /// The value of a wire code; None for a code Kafka does not define.
            pub fn from_code(code: i8) -> Option<$name> {
                match code {
                    $($value => Some($name::$variant),)*
                    _ => None,
                }
            }

            pub fn code(self) -> i8 {
                self as i8
            }

            /// Kafka's name (`TOPIC`, `PREFIXED`, `DESCRIBE_CONFIGS`, ...).
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

kafka_enum!(
    /// Kafka's `ResourceType`.
    ResourceType {
        Unknown = 0, "UNKNOWN";
        Any = 1, "ANY";
        Topic = 2, "TOPIC";
        Group = 3, "GROUP";
        Cluster = 4, "CLUSTER";
        TransactionalId = 5, "TRANSACTIONAL_ID";
        DelegationToken = 6, "DELEGATION_TOKEN";
        User = 7, "USER";
    }
);

kafka_enum!(
    /// Kafka's `PatternType`: LITERAL and PREFIXED are the patterns of an
    /// ACL; ANY and MATCH only appear in filters.
    PatternType {
        Unknown = 0, "UNKNOWN";
        Any = 1, "ANY";
        Match = 2, "MATCH";
        Literal = 3, "LITERAL";
        Prefixed = 4, "PREFIXED";
    }
);

kafka_enum!(
    /// Kafka's `AclOperation`.
    AclOperation {
        Unknown = 0, "UNKNOWN";
        Any = 1, "ANY";
        All = 2, "ALL";
        Read = 3, "READ";
        Write = 4, "WRITE";
        Create = 5, "CREATE";
        Delete = 6, "DELETE";
        Alter = 7, "ALTER";
        Describe = 8, "DESCRIBE";
        ClusterAction = 9, "CLUSTER_ACTION";
        DescribeConfigs = 10, "DESCRIBE_CONFIGS";
        AlterConfigs = 11, "ALTER_CONFIGS";
        IdempotentWrite = 12, "IDEMPOTENT_WRITE";
        CreateTokens = 13, "CREATE_TOKENS";
        DescribeTokens = 14, "DESCRIBE_TOKENS";
    }
);

kafka_enum!(
    /// Kafka's `AclPermissionType`.
    AclPermissionType {
        Unknown = 0, "UNKNOWN";
        Any = 1, "ANY";
        Deny = 2, "DENY";
        Allow = 3, "ALLOW";
    }
);

impl ResourceType {
    /// A type an ACL can name (not UNKNOWN or ANY).
    pub fn is_concrete(self) -> bool {
        !matches!(self, ResourceType::Unknown | ResourceType::Any)
    }

    /// The operations Kafka reports in authorized-operations bitfields for
    /// a resource of this type (the operations that mean something for it).
    pub fn supported_operations(self) -> &'static [AclOperation] {
        use AclOperation as O;
        match self {
            ResourceType::Topic => &[
                O::Read,
                O::Write,
                O::Create,
                O::Describe,
                O::Delete,
                O::Alter,
                O::DescribeConfigs,
                O::AlterConfigs,
            ],
            ResourceType::Group => &[O::Read, O::Describe, O::Delete],
            ResourceType::Cluster => &[
                O::Create,
                O::ClusterAction,
                O::DescribeConfigs,
                O::AlterConfigs,
                O::IdempotentWrite,
                O::Alter,
                O::Describe,
            ],
            ResourceType::TransactionalId => &[O::Describe, O::Write],
            ResourceType::DelegationToken => &[O::Describe],
            ResourceType::User => &[O::CreateTokens, O::DescribeTokens],
            ResourceType::Unknown | ResourceType::Any => &[],
        }
    }
}

impl AclOperation {
    /// An operation an ACL can name (not UNKNOWN or ANY).
    pub fn is_concrete(self) -> bool {
        !matches!(self, AclOperation::Unknown | AclOperation::Any)
    }

    /// Whether an ALLOW ACL of `self` allows `requested` (Kafka's implied
    /// operations).
    pub fn allows(self, requested: AclOperation) -> bool {
        use AclOperation as O;
        self == O::All
            || self == requested
            || (requested == O::Describe
                && matches!(self, O::Read | O::Write | O::Delete | O::Alter))
            || (requested == O::DescribeConfigs && self == O::AlterConfigs)
    }

    /// Whether a DENY ACL of `self` denies `requested` (denials imply
    /// nothing beyond ALL).
    pub fn denies(self, requested: AclOperation) -> bool {
        self == AclOperation::All || self == requested
    }
}

impl AclPermissionType {
    pub fn is_concrete(self) -> bool {
        matches!(self, AclPermissionType::Allow | AclPermissionType::Deny)
    }
}

/// One ACL (Kafka's AclBinding: a resource pattern and an access control
/// entry). Built only through [`AclBinding::new`] or the record codec, so
/// its fields are concrete values.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AclBinding {
    pub resource_type: ResourceType,
    pub resource_name: String,
    pub pattern_type: PatternType,
    /// `Type:name`, e.g. `User:alice`, or `User:*`.
    pub principal: String,
    /// An IP address, or `*`.
    pub host: String,
    pub operation: AclOperation,
    pub permission: AclPermissionType,
}

/// Why an ACL cannot be created (Kafka answers INVALID_REQUEST).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidAcl(pub String);

impl fmt::Display for InvalidAcl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Bounds on the strings of an ACL (the record codec's u16 strings).
pub const MAX_ACL_STRING_LEN: usize = 32 * 1024;

impl AclBinding {
    /// Checks what Kafka checks of a new ACL (AclControlManager.validateNewAcl
    /// and the CreateAcls handler): concrete enums, a LITERAL or PREFIXED
    /// pattern, a non-empty resource name (`kafka-cluster` for CLUSTER), a
    /// `Type:name` principal and a host.
    pub fn validate(&self) -> Result<(), InvalidAcl> {
        let bad = |m: String| Err(InvalidAcl(m));
        if !self.resource_type.is_concrete() {
            return bad(format!("invalid resource type {}", self.resource_type));
        }
        if !matches!(
            self.pattern_type,
            PatternType::Literal | PatternType::Prefixed
        ) {
            return bad(format!(
                "invalid pattern type {} (LITERAL or PREFIXED)",
                self.pattern_type
            ));
        }
        if !self.operation.is_concrete() {
            return bad(format!("invalid operation {}", self.operation));
        }
        if !self.permission.is_concrete() {
            return bad(format!("invalid permission type {}", self.permission));
        }
        if self.resource_name.is_empty() {
            return bad("resource name must not be empty".into());
        }
        if self.resource_type == ResourceType::Cluster && self.resource_name != CLUSTER_NAME {
            return bad(format!(
                "the only valid name for the CLUSTER resource is {CLUSTER_NAME}"
            ));
        }
        match self.principal.split_once(':') {
            Some((kind, name)) if !kind.is_empty() && !name.is_empty() => {}
            _ => {
                return bad(format!(
                    "could not parse principal {:?} (expected Type:name)",
                    self.principal
                ))
            }
        }
        if self.host.is_empty() {
            return bad("host must not be empty (use * for any host)".into());
        }
        for (field, s) in [
            ("resource name", &self.resource_name),
            ("principal", &self.principal),
            ("host", &self.host),
        ] {
            if s.len() > MAX_ACL_STRING_LEN {
                return bad(format!("{field} longer than {MAX_ACL_STRING_LEN} bytes"));
            }
        }
        Ok(())
    }

    /// Whether this ACL's pattern covers the resource `name` of `rt`.
    pub fn covers(&self, rt: ResourceType, name: &str) -> bool {
        self.resource_type == rt
            && match self.pattern_type {
                PatternType::Literal => {
                    self.resource_name == name || self.resource_name == WILDCARD_RESOURCE
                }
                PatternType::Prefixed => name.starts_with(self.resource_name.as_str()),
                _ => false,
            }
    }

    /// Whether the ACL applies to `principal` connecting from `host`.
    pub fn applies_to(&self, principal: &str, host: &str) -> bool {
        // Kafka matches the session's principal and `User:*` (whatever
        // the session's principal type).
        let principal_matches = self.principal == principal || self.principal == WILDCARD_PRINCIPAL;
        principal_matches && (self.host == WILDCARD_HOST || self.host == host)
    }
}

/// A filter of DescribeAcls and DeleteAcls (Kafka's AclBindingFilter):
/// `None` strings and ANY enums match everything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AclFilter {
    pub resource_type: ResourceType,
    pub resource_name: Option<String>,
    pub pattern_type: PatternType,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: AclOperation,
    pub permission: AclPermissionType,
}

impl AclFilter {
    /// A filter with an UNKNOWN value is refused (INVALID_REQUEST), as Kafka
    /// refuses `filter.isUnknown`.
    pub fn validate(&self) -> Result<(), InvalidAcl> {
        if self.resource_type == ResourceType::Unknown {
            return Err(InvalidAcl("resource type filter is UNKNOWN".into()));
        }
        if self.pattern_type == PatternType::Unknown {
            return Err(InvalidAcl("pattern type filter is UNKNOWN".into()));
        }
        if self.operation == AclOperation::Unknown {
            return Err(InvalidAcl("operation filter is UNKNOWN".into()));
        }
        if self.permission == AclPermissionType::Unknown {
            return Err(InvalidAcl("permission type filter is UNKNOWN".into()));
        }
        Ok(())
    }

    /// Kafka's `AclBindingFilter.matches`.
    pub fn matches(&self, acl: &AclBinding) -> bool {
        if self.resource_type != ResourceType::Any && self.resource_type != acl.resource_type {
            return false;
        }
        if !self.pattern_matches(acl) {
            return false;
        }
        if let Some(p) = &self.principal {
            if *p != acl.principal {
                return false;
            }
        }
        if let Some(h) = &self.host {
            if *h != acl.host {
                return false;
            }
        }
        (self.operation == AclOperation::Any || self.operation == acl.operation)
            && (self.permission == AclPermissionType::Any || self.permission == acl.permission)
    }

    /// Kafka's `ResourcePatternFilter.matches`.
    fn pattern_matches(&self, acl: &AclBinding) -> bool {
        let pt = self.pattern_type;
        if pt != PatternType::Any && pt != PatternType::Match && pt != acl.pattern_type {
            return false;
        }
        let Some(name) = &self.resource_name else {
            return true;
        };
        if pt == PatternType::Any || pt == acl.pattern_type {
            return *name == acl.resource_name;
        }
        // MATCH: the ACLs that would apply to the resource `name`.
        match acl.pattern_type {
            PatternType::Literal => *name == acl.resource_name || acl.resource_name == "*",
            PatternType::Prefixed => name.starts_with(acl.resource_name.as_str()),
            _ => false,
        }
    }
}

/// The broker's authorizer settings (`super.users`,
/// `allow.everyone.if.no.acl.found`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthorizerSettings {
    pub super_users: Vec<String>,
    pub allow_everyone_if_no_acl_found: bool,
}

impl AuthorizerSettings {
    /// Parses `super.users`: principals separated by `;` (Kafka's format,
    /// e.g. `User:admin;User:bob`); blanks are ignored.
    pub fn parse_super_users(raw: &str) -> Vec<String> {
        raw.split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }

    pub fn is_super_user(&self, principal: &str) -> bool {
        self.super_users.iter().any(|s| s == principal)
    }
}

/// What decided an authorization (for logs and tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    SuperUser,
    Allowed,
    /// A matching DENY ACL.
    Denied,
    /// ACLs exist for the resource but none allows.
    NoAllow,
    /// No ACL at all for the resource: `allow.everyone.if.no.acl.found`.
    NoAclFound {
        allowed: bool,
    },
}

impl Decision {
    pub fn is_allowed(self) -> bool {
        match self {
            Decision::SuperUser | Decision::Allowed => true,
            Decision::Denied | Decision::NoAllow => false,
            Decision::NoAclFound { allowed } => allowed,
        }
    }
}

/// The decision for `principal` at `host` doing `op` on the resource
/// (`rt`, `name`), given every ACL.
pub fn authorize<'a>(
    acls: impl IntoIterator<Item = &'a AclBinding>,
    settings: &AuthorizerSettings,
    principal: &str,
    host: &str,
    op: AclOperation,
    rt: ResourceType,
    name: &str,
) -> Decision {
    if settings.is_super_user(principal) {
        return Decision::SuperUser;
    }
    let mut found = false;
    let mut allowed = false;
    for acl in acls {
        if !acl.covers(rt, name) {
            continue;
        }
        found = true;
        if !acl.applies_to(principal, host) {
            continue;
        }
        match acl.permission {
            AclPermissionType::Deny if acl.operation.denies(op) => return Decision::Denied,
            AclPermissionType::Allow if acl.operation.allows(op) => allowed = true,
            _ => {}
        }
    }
    if allowed {
        Decision::Allowed
    } else if found {
        Decision::NoAllow
    } else {
        Decision::NoAclFound {
            allowed: settings.allow_everyone_if_no_acl_found,
        }
    }
}

/// Kafka's `authorizeByResourceType`: whether `principal` at `host` may do
/// `op` on some resource of type `rt` (InitProducerId's "WRITE on any
/// topic" for idempotent producers, KIP-679). Allowed by an ALLOW pattern
/// that no applying DENY (a literal `*`, the same literal name, or a
/// prefix of the pattern) takes back; with no ACL of the type at all, by
/// `allow.everyone.if.no.acl.found`.
pub fn authorize_any<'a>(
    acls: impl IntoIterator<Item = &'a AclBinding> + Clone,
    settings: &AuthorizerSettings,
    principal: &str,
    host: &str,
    op: AclOperation,
    rt: ResourceType,
) -> bool {
    if settings.is_super_user(principal) {
        return true;
    }
    let applying = |perm: AclPermissionType| {
        acls.clone().into_iter().filter(move |a| {
            a.resource_type == rt && a.permission == perm && a.applies_to(principal, host)
        })
    };
    let denies: Vec<&AclBinding> = applying(AclPermissionType::Deny)
        .filter(|a| a.operation.denies(op))
        .collect();
    if denies
        .iter()
        .any(|d| d.pattern_type == PatternType::Literal && d.resource_name == WILDCARD_RESOURCE)
    {
        return false;
    }
    let allowed = applying(AclPermissionType::Allow)
        .filter(|a| a.operation.allows(op))
        .any(|allow| {
            !denies.iter().any(|d| match d.pattern_type {
                PatternType::Literal => {
                    allow.pattern_type == PatternType::Literal
                        && d.resource_name == allow.resource_name
                }
                PatternType::Prefixed => allow.resource_name.starts_with(d.resource_name.as_str()),
                _ => false,
            })
        });
    allowed
        || (settings.allow_everyone_if_no_acl_found
            && !acls.into_iter().any(|a| a.resource_type == rt))
}

/// Kafka's authorized-operations bitfield of a resource: bit `op.code()`
/// set for each supported operation of the type that is allowed.
pub fn authorized_operations<'a>(
    acls: impl IntoIterator<Item = &'a AclBinding> + Clone,
    settings: &AuthorizerSettings,
    principal: &str,
    host: &str,
    rt: ResourceType,
    name: &str,
) -> i32 {
    rt.supported_operations()
        .iter()
        .filter(|op| {
            authorize(acls.clone(), settings, principal, host, **op, rt, name).is_allowed()
        })
        .fold(0, |bits, op| bits | (1 << op.code()))
}

/// The bitfield of every supported operation of `rt` (no authorizer).
pub fn all_operations(rt: ResourceType) -> i32 {
    rt.supported_operations()
        .iter()
        .fold(0, |bits, op| bits | (1 << op.code()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn acl(
        rt: ResourceType,
        name: &str,
        pt: PatternType,
        principal: &str,
        host: &str,
        op: AclOperation,
        perm: AclPermissionType,
    ) -> AclBinding {
        AclBinding {
            resource_type: rt,
            resource_name: name.into(),
            pattern_type: pt,
            principal: principal.into(),
            host: host.into(),
            operation: op,
            permission: perm,
        }
    }

    fn allow_topic(name: &str, pt: PatternType, principal: &str, op: AclOperation) -> AclBinding {
        acl(
            ResourceType::Topic,
            name,
            pt,
            principal,
            "*",
            op,
            AclPermissionType::Allow,
        )
    }

    fn deny_topic(name: &str, pt: PatternType, principal: &str, op: AclOperation) -> AclBinding {
        acl(
            ResourceType::Topic,
            name,
            pt,
            principal,
            "*",
            op,
            AclPermissionType::Deny,
        )
    }

    fn settings() -> AuthorizerSettings {
        AuthorizerSettings {
            super_users: AuthorizerSettings::parse_super_users("User:admin; User:root ;"),
            allow_everyone_if_no_acl_found: false,
        }
    }

    fn check(acls: &[AclBinding], principal: &str, op: AclOperation, topic: &str) -> bool {
        authorize(
            acls,
            &settings(),
            principal,
            "10.0.0.1",
            op,
            ResourceType::Topic,
            topic,
        )
        .is_allowed()
    }

    use AclOperation as O;
    use PatternType as P;

    #[test]
    fn enums_are_kafkas() {
        assert_eq!(ResourceType::Topic.code(), 2);
        assert_eq!(ResourceType::User.code(), 7);
        assert_eq!(PatternType::Prefixed.code(), 4);
        assert_eq!(O::IdempotentWrite.code(), 12);
        assert_eq!(O::DescribeTokens.code(), 14);
        assert_eq!(AclPermissionType::Allow.code(), 3);
        for v in O::ALL_VALUES {
            assert_eq!(O::from_code(v.code()), Some(*v));
        }
        assert_eq!(O::from_code(15), None);
        assert_eq!(ResourceType::from_code(-1), None);
    }

    #[test]
    fn super_users_parse() {
        assert_eq!(settings().super_users, vec!["User:admin", "User:root"]);
        assert!(AuthorizerSettings::parse_super_users("").is_empty());
    }

    #[test]
    fn super_user_always_allowed() {
        let acls = [deny_topic("*", P::Literal, "User:*", O::All)];
        assert!(check(&acls, "User:admin", O::Write, "t"));
        assert!(check(&acls, "User:root", O::Delete, "t"));
        assert!(!check(&acls, "User:alice", O::Write, "t"));
    }

    #[test]
    fn no_acl_found() {
        assert!(!check(&[], "User:alice", O::Read, "t"));
        let mut s = settings();
        s.allow_everyone_if_no_acl_found = true;
        let decide = |acls: &[AclBinding]| {
            authorize(
                acls,
                &s,
                "User:alice",
                "h",
                O::Read,
                ResourceType::Topic,
                "t",
            )
        };
        assert_eq!(decide(&[]), Decision::NoAclFound { allowed: true });
        // An ACL on the resource for someone else: not "no ACL found".
        let other = [allow_topic("t", P::Literal, "User:bob", O::Read)];
        assert_eq!(decide(&other), Decision::NoAllow);
        // ACLs of other resources do not count.
        let elsewhere = [allow_topic("u", P::Literal, "User:bob", O::Read)];
        assert_eq!(decide(&elsewhere), Decision::NoAclFound { allowed: true });
    }

    #[test]
    fn literal_wildcard_and_prefixed_patterns() {
        let acls = [
            allow_topic("exact", P::Literal, "User:alice", O::Read),
            allow_topic("a-", P::Prefixed, "User:alice", O::Write),
            allow_topic("*", P::Literal, "User:bob", O::Read),
        ];
        assert!(check(&acls, "User:alice", O::Read, "exact"));
        assert!(!check(&acls, "User:alice", O::Read, "exact2"));
        assert!(!check(&acls, "User:alice", O::Read, "exac"));
        assert!(check(&acls, "User:alice", O::Write, "a-1"));
        assert!(check(&acls, "User:alice", O::Write, "a-"));
        assert!(!check(&acls, "User:alice", O::Write, "a"));
        assert!(!check(&acls, "User:alice", O::Write, "b-1"));
        assert!(check(&acls, "User:bob", O::Read, "anything"));
        assert!(!check(&acls, "User:bob", O::Write, "anything"));
        // A prefixed "*" is a prefix, not a wildcard.
        let star = [allow_topic("*", P::Prefixed, "User:alice", O::Read)];
        assert!(!check(&star, "User:alice", O::Read, "t"));
        assert!(check(&star, "User:alice", O::Read, "*t"));
    }

    #[test]
    fn resource_types_do_not_mix() {
        let acls = [acl(
            ResourceType::Group,
            "g",
            P::Literal,
            "User:alice",
            "*",
            O::Read,
            AclPermissionType::Allow,
        )];
        assert!(!check(&acls, "User:alice", O::Read, "g"));
        assert!(authorize(
            &acls,
            &settings(),
            "User:alice",
            "h",
            O::Read,
            ResourceType::Group,
            "g"
        )
        .is_allowed());
    }

    #[test]
    fn wildcard_principal() {
        let acls = [allow_topic("t", P::Literal, "User:*", O::Read)];
        assert!(check(&acls, "User:alice", O::Read, "t"));
        assert!(check(&acls, "User:ANONYMOUS", O::Read, "t"));
        // Kafka's wildcard is User:* whatever the session's principal type.
        assert!(check(&acls, "Group:x", O::Read, "t"));
        let group_star = [allow_topic("t", P::Literal, "Group:*", O::Read)];
        assert!(!check(&group_star, "Group:x", O::Read, "t"));
        // "User:*" as a principal asking is just a name.
        let alice_only = [allow_topic("t", P::Literal, "User:alice", O::Read)];
        assert!(!check(&alice_only, "User:*", O::Read, "t"));
    }

    #[test]
    fn hosts() {
        let acls = [acl(
            ResourceType::Topic,
            "t",
            P::Literal,
            "User:alice",
            "10.0.0.1",
            O::Read,
            AclPermissionType::Allow,
        )];
        let at = |host: &str| {
            authorize(
                &acls,
                &settings(),
                "User:alice",
                host,
                O::Read,
                ResourceType::Topic,
                "t",
            )
            .is_allowed()
        };
        assert!(at("10.0.0.1"));
        assert!(!at("10.0.0.2"));
        // A DENY from one host only.
        let acls = [
            allow_topic("t", P::Literal, "User:alice", O::Read),
            acl(
                ResourceType::Topic,
                "t",
                P::Literal,
                "User:alice",
                "10.0.0.9",
                O::Read,
                AclPermissionType::Deny,
            ),
        ];
        let at = |host: &str| {
            authorize(
                &acls,
                &settings(),
                "User:alice",
                host,
                O::Read,
                ResourceType::Topic,
                "t",
            )
        };
        assert_eq!(at("10.0.0.1"), Decision::Allowed);
        assert_eq!(at("10.0.0.9"), Decision::Denied);
    }

    #[test]
    fn implied_operations() {
        for op in [O::Read, O::Write, O::Delete, O::Alter, O::Describe, O::All] {
            let acls = [allow_topic("t", P::Literal, "User:a", op)];
            assert!(
                check(&acls, "User:a", O::Describe, "t"),
                "{op} implies DESCRIBE"
            );
        }
        for op in [
            O::Create,
            O::AlterConfigs,
            O::DescribeConfigs,
            O::ClusterAction,
        ] {
            let acls = [allow_topic("t", P::Literal, "User:a", op)];
            assert!(
                !check(&acls, "User:a", O::Describe, "t"),
                "{op} does not imply DESCRIBE"
            );
        }
        let acls = [allow_topic("t", P::Literal, "User:a", O::AlterConfigs)];
        assert!(check(&acls, "User:a", O::DescribeConfigs, "t"));
        let acls = [allow_topic("t", P::Literal, "User:a", O::Read)];
        assert!(!check(&acls, "User:a", O::Write, "t"));
        assert!(!check(&acls, "User:a", O::DescribeConfigs, "t"));
        let acls = [allow_topic("t", P::Literal, "User:a", O::All)];
        for op in ResourceType::Topic.supported_operations() {
            assert!(check(&acls, "User:a", *op, "t"));
        }
    }

    #[test]
    fn deny_beats_allow() {
        let acls = [
            allow_topic("a-", P::Prefixed, "User:alice", O::All),
            deny_topic("a-secret", P::Literal, "User:alice", O::Read),
        ];
        assert!(check(&acls, "User:alice", O::Read, "a-public"));
        assert!(!check(&acls, "User:alice", O::Read, "a-secret"));
        // A DENY of READ implies no DENY of DESCRIBE.
        assert!(check(&acls, "User:alice", O::Describe, "a-secret"));
        assert!(check(&acls, "User:alice", O::Write, "a-secret"));
        let acls = [
            allow_topic("t", P::Literal, "User:alice", O::Read),
            deny_topic("*", P::Literal, "User:*", O::All),
        ];
        assert!(!check(&acls, "User:alice", O::Read, "t"));
    }

    #[test]
    fn authorized_operations_bits() {
        let acls = [allow_topic("t", P::Literal, "User:a", O::Read)];
        let bits =
            authorized_operations(&acls, &settings(), "User:a", "h", ResourceType::Topic, "t");
        assert_eq!(bits, (1 << 3) | (1 << 8));
        let all = authorized_operations(
            &acls,
            &settings(),
            "User:admin",
            "h",
            ResourceType::Topic,
            "t",
        );
        assert_eq!(all, all_operations(ResourceType::Topic));
        assert_eq!(
            all,
            (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 10) | (1 << 11)
        );
    }

    #[test]
    fn validation() {
        let good = allow_topic("t", P::Literal, "User:a", O::Read);
        assert_eq!(good.validate(), Ok(()));
        let with = |f: &dyn Fn(&mut AclBinding)| {
            let mut a = good.clone();
            f(&mut a);
            a.validate()
        };
        assert!(with(&|a| a.resource_type = ResourceType::Any).is_err());
        assert!(with(&|a| a.resource_type = ResourceType::Unknown).is_err());
        assert!(with(&|a| a.pattern_type = P::Match).is_err());
        assert!(with(&|a| a.pattern_type = P::Any).is_err());
        assert!(with(&|a| a.operation = O::Any).is_err());
        assert!(with(&|a| a.permission = AclPermissionType::Any).is_err());
        assert!(with(&|a| a.resource_name.clear()).is_err());
        assert!(with(&|a| a.principal = "alice".into()).is_err());
        assert!(with(&|a| a.principal = "User:".into()).is_err());
        assert!(with(&|a| a.host.clear()).is_err());
        assert!(with(&|a| {
            a.resource_type = ResourceType::Cluster;
            a.resource_name = "c".into()
        })
        .is_err());
        assert_eq!(
            with(&|a| {
                a.resource_type = ResourceType::Cluster;
                a.resource_name = CLUSTER_NAME.into()
            }),
            Ok(())
        );
    }

    fn any_filter() -> AclFilter {
        AclFilter {
            resource_type: ResourceType::Any,
            resource_name: None,
            pattern_type: P::Any,
            principal: None,
            host: None,
            operation: O::Any,
            permission: AclPermissionType::Any,
        }
    }

    #[test]
    fn filters() {
        let lit = allow_topic("a-1", P::Literal, "User:a", O::Read);
        let pre = allow_topic("a-", P::Prefixed, "User:a", O::Write);
        let star = allow_topic("*", P::Literal, "User:b", O::Read);
        let all = [&lit, &pre, &star];
        let matching = |f: &AclFilter| all.iter().filter(|a| f.matches(a)).count();
        assert_eq!(matching(&any_filter()), 3);
        let mut f = any_filter();
        f.resource_name = Some("a-1".into());
        // ANY with a name: exact names of any pattern type.
        assert_eq!(matching(&f), 1);
        f.pattern_type = P::Match;
        // MATCH: every ACL that applies to a-1.
        assert_eq!(matching(&f), 3);
        f.pattern_type = P::Prefixed;
        assert_eq!(matching(&f), 0);
        f.resource_name = Some("a-".into());
        assert_eq!(matching(&f), 1);
        let mut f = any_filter();
        f.pattern_type = P::Literal;
        assert_eq!(matching(&f), 2);
        f.principal = Some("User:b".into());
        assert_eq!(matching(&f), 1);
        let mut f = any_filter();
        f.operation = O::Write;
        assert_eq!(matching(&f), 1);
        f.permission = AclPermissionType::Deny;
        assert_eq!(matching(&f), 0);
        let mut f = any_filter();
        f.resource_type = ResourceType::Group;
        assert_eq!(matching(&f), 0);
        f.host = Some("*".into());
        assert_eq!(matching(&f), 0);
        assert!(any_filter().validate().is_ok());
        let mut f = any_filter();
        f.operation = O::Unknown;
        assert!(f.validate().is_err());
    }

    #[test]
    fn authorize_by_resource_type() {
        let s = settings();
        let any = |acls: &[AclBinding], who: &str| {
            authorize_any(acls, &s, who, "h", O::Write, ResourceType::Topic)
        };
        assert!(!any(&[], "User:a"));
        assert!(any(&[], "User:admin"));
        let acls = [allow_topic("a-", P::Prefixed, "User:a", O::Write)];
        assert!(any(&acls, "User:a"));
        assert!(!any(&acls, "User:b"));
        let mut denied = acls.to_vec();
        denied.push(deny_topic("a", P::Prefixed, "User:a", O::Write));
        assert!(!any(&denied, "User:a"));
        let mut denied = acls.to_vec();
        denied.push(deny_topic("*", P::Literal, "User:*", O::All));
        assert!(!any(&denied, "User:a"));
        // A DENY of one literal name leaves the prefix.
        let mut partly = acls.to_vec();
        partly.push(deny_topic("a-1", P::Literal, "User:a", O::Write));
        assert!(any(&partly, "User:a"));
    }

    fn arb_op() -> impl Strategy<Value = AclOperation> {
        prop::sample::select(
            O::ALL_VALUES
                .iter()
                .copied()
                .filter(|o| o.is_concrete())
                .collect::<Vec<_>>(),
        )
    }

    fn arb_acl() -> impl Strategy<Value = AclBinding> {
        (
            prop::sample::select(vec![ResourceType::Topic, ResourceType::Group]),
            prop::sample::select(vec!["t", "t1", "*", "u", ""]),
            prop::sample::select(vec![P::Literal, P::Prefixed]),
            prop::sample::select(vec!["User:alice", "User:bob", "User:*"]),
            prop::sample::select(vec!["*", "h1", "h2"]),
            arb_op(),
            prop::sample::select(vec![AclPermissionType::Allow, AclPermissionType::Deny]),
        )
            .prop_map(|(rt, name, pt, principal, host, op, perm)| {
                acl(rt, name, pt, principal, host, op, perm)
            })
    }

    proptest! {
        #[test]
        fn deny_always_wins(
            acls in prop::collection::vec(arb_acl(), 0..12),
            principal in prop::sample::select(vec!["User:alice", "User:bob", "User:carol"]),
            host in prop::sample::select(vec!["h1", "h2"]),
            op in arb_op(),
            name in prop::sample::select(vec!["t", "t1", "u", "x"]),
            allow_if_none in any::<bool>(),
        ) {
            let s = AuthorizerSettings { super_users: vec!["User:admin".into()], allow_everyone_if_no_acl_found: allow_if_none };
            let decision = authorize(&acls, &s, principal, host, op, ResourceType::Topic, name);
            let denied_by_acl = acls.iter().any(|a| a.permission == AclPermissionType::Deny
                && a.covers(ResourceType::Topic, name)
                && a.applies_to(principal, host)
                && a.operation.denies(op));
            if denied_by_acl {
                prop_assert_eq!(decision, Decision::Denied);
            }
            // Adding a matching DENY to any set of ACLs denies.
            let mut more = acls.clone();
            more.push(deny_topic(name, P::Literal, principal, op));
            prop_assert!(!authorize(&more, &s, principal, host, op, ResourceType::Topic, name).is_allowed());
            // Super users are allowed whatever the ACLs.
            prop_assert!(authorize(&more, &s, "User:admin", host, op, ResourceType::Topic, name).is_allowed());
            // Allowed only through an ALLOW that applies, or no ACL for the resource.
            if decision.is_allowed() {
                let allow = acls.iter().any(|a| a.permission == AclPermissionType::Allow
                    && a.covers(ResourceType::Topic, name)
                    && a.applies_to(principal, host)
                    && a.operation.allows(op));
                let none = !acls.iter().any(|a| a.covers(ResourceType::Topic, name));
                prop_assert!(allow || (none && allow_if_none));
            }
            // The order of ACLs never matters.
            let mut reversed = acls.clone();
            reversed.reverse();
            prop_assert_eq!(authorize(&reversed, &s, principal, host, op, ResourceType::Topic, name), decision);
        }
    }
}
