//! DescribeClientQuotas filtering (KIP-546, Kafka's
//! `ClientQuotasImage.describe`) and AlterClientQuotas planning (Kafka's
//! `ClientQuotaControlManager.alterClientQuotas`), as pure functions of the
//! configured quotas.

use std::collections::BTreeMap;

use tessera_metadata::{ClientQuotaEntity, MetadataRecord, QuotaEntityName, QuotaValue};

use super::resolve::Quotas;
use crate::error::ApiError;

pub const USER: &str = "user";
pub const CLIENT_ID: &str = "client-id";
pub const IP: &str = "ip";

pub const MATCH_EXACT: i8 = 0;
pub const MATCH_DEFAULT: i8 = 1;
pub const MATCH_SPECIFIED: i8 = 2;

/// One filter component: entity type, match type, match string.
#[derive(Clone, Debug)]
pub struct Component {
    pub entity_type: String,
    pub match_type: i8,
    pub matched: Option<String>,
}

/// One described entity and its quotas.
pub type Described<'a> = (&'a ClientQuotaEntity, &'a BTreeMap<String, f64>);

/// The entities (and their quotas) a DescribeClientQuotas filter selects,
/// or the error Kafka answers the whole request with.
pub fn describe<'a>(
    quotas: &'a Quotas,
    components: &[Component],
    strict: bool,
) -> Result<Vec<Described<'a>>, ApiError> {
    // entity type -> Some(exact name or None for default) | None for "specified"
    let mut exact: BTreeMap<&str, Option<&str>> = BTreeMap::new();
    let mut specified: Vec<&str> = Vec::new();
    for c in components {
        let t = c.entity_type.as_str();
        if t.is_empty() {
            return Err(ApiError::InvalidRequest(
                "Invalid empty entity type.".into(),
            ));
        }
        if exact.contains_key(t) || specified.contains(&t) {
            return Err(ApiError::InvalidRequest(format!(
                "Entity type {t} cannot appear more than once in the filter."
            )));
        }
        if ![USER, CLIENT_ID, IP].contains(&t) {
            return Err(ApiError::UnsupportedVersion(format!(
                "Unsupported entity type {t}"
            )));
        }
        match c.match_type {
            MATCH_EXACT => match &c.matched {
                None => {
                    return Err(ApiError::InvalidRequest(
                        "Request specified MATCH_TYPE_EXACT, but set match string to null.".into(),
                    ))
                }
                Some(m) => {
                    exact.insert(t, Some(m.as_str()));
                }
            },
            MATCH_DEFAULT => {
                if c.matched.is_some() {
                    return Err(ApiError::InvalidRequest(
                        "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."
                            .into(),
                    ));
                }
                exact.insert(t, None);
            }
            MATCH_SPECIFIED => {
                if c.matched.is_some() {
                    return Err(ApiError::InvalidRequest(
                        "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string."
                            .into(),
                    ));
                }
                specified.push(t);
            }
            other => {
                return Err(ApiError::UnsupportedVersion(format!(
                    "Unknown match type {other}"
                )))
            }
        }
    }
    let has = |t: &str| exact.contains_key(t) || specified.contains(&t);
    if has(IP) && (has(USER) || has(CLIENT_ID)) {
        return Err(ApiError::InvalidRequest(
            "Invalid entity filter component combination. IP filter component should not be used with user or clientId filter component.".into(),
        ));
    }
    Ok(quotas
        .iter()
        .filter(|(entity, _)| matches(entity, &exact, &specified, strict))
        .collect())
}

fn part<'e>(entity: &'e ClientQuotaEntity, t: &str) -> Option<&'e QuotaEntityName> {
    match t {
        USER => entity.user.as_ref(),
        CLIENT_ID => entity.client_id.as_ref(),
        _ => None,
    }
}

fn matches(
    entity: &ClientQuotaEntity,
    exact: &BTreeMap<&str, Option<&str>>,
    specified: &[&str],
    strict: bool,
) -> bool {
    let size = usize::from(entity.user.is_some()) + usize::from(entity.client_id.is_some());
    if strict && size != exact.len() + specified.len() {
        return false;
    }
    exact.iter().all(|(t, want)| match part(entity, t) {
        None => false,
        Some(name) => name.as_option() == *want,
    }) && specified.iter().all(|t| part(entity, t).is_some())
}

/// The protocol form of an entity: (type, name or None for the default).
pub fn entity_parts(entity: &ClientQuotaEntity) -> Vec<(&'static str, Option<String>)> {
    let mut out = Vec::new();
    if let Some(u) = &entity.user {
        out.push((USER, u.as_option().map(String::from)));
    }
    if let Some(c) = &entity.client_id {
        out.push((CLIENT_ID, c.as_option().map(String::from)));
    }
    out
}

/// One entry of an AlterClientQuotas request.
#[derive(Clone, Debug)]
pub struct Alteration {
    /// (entity type, name or None for the default), as sent.
    pub entity: Vec<(String, Option<String>)>,
    /// (key, Some(value) to set, None to remove), as sent.
    pub ops: Vec<(String, Option<f64>)>,
}

/// Keys whose config type is LONG in Kafka (the rest are DOUBLE).
const LONG_KEYS: &[&str] = &["producer_byte_rate", "consumer_byte_rate"];

/// Validates an entity (Kafka's `validateEntity` + `configKeysForEntityType`).
fn validate_entity(parts: &[(String, Option<String>)]) -> Result<ClientQuotaEntity, ApiError> {
    if parts.is_empty() {
        return Err(ApiError::InvalidRequest(
            "Invalid empty client quota entity".into(),
        ));
    }
    let mut entity = ClientQuotaEntity::default();
    let mut ip = false;
    let mut seen: Vec<&str> = Vec::new();
    for (t, name) in parts {
        if seen.contains(&t.as_str()) {
            return Err(ApiError::InvalidRequest(format!(
                "Invalid empty client quota entity, duplicate entity entry {t}"
            )));
        }
        seen.push(t);
        let value = Some(QuotaEntityName::from_option(name.clone()));
        match t.as_str() {
            USER => entity.user = value,
            CLIENT_ID => entity.client_id = value,
            IP => ip = true,
            _ => {
                return Err(ApiError::InvalidRequest(format!(
                    "Unhandled client quota entity type: {t}"
                )))
            }
        }
        if name.as_deref() == Some("") {
            return Err(ApiError::InvalidRequest(format!("Empty {t} not supported")));
        }
        if name
            .as_ref()
            .is_some_and(|n| n.len() > tessera_metadata::MAX_USER_NAME_LEN)
        {
            return Err(ApiError::InvalidRequest(format!("{t} name too long")));
        }
    }
    if ip {
        if entity.user.is_some() || entity.client_id.is_some() {
            return Err(ApiError::InvalidRequest(
                "Invalid empty client quota entity".into(),
            ));
        }
        return Err(ApiError::InvalidRequest(
            "IP quotas are not supported by this broker".into(),
        ));
    }
    Ok(entity)
}

fn validate_value(key: &str, value: f64) -> Result<(), ApiError> {
    if !tessera_metadata::CLIENT_QUOTA_KEYS.contains(&key) {
        return Err(ApiError::InvalidRequest(format!(
            "Invalid configuration key {key}"
        )));
    }
    if LONG_KEYS.contains(&key) {
        let epsilon = 1e-6;
        let long = (value + epsilon) as i64;
        if (long as f64 - value).abs() > epsilon {
            return Err(ApiError::InvalidRequest(format!(
                "Configuration {key} must be a Long value"
            )));
        }
    }
    // Kafka stores any double; a negative, infinite or NaN rate is not one
    // this broker can enforce.
    if !value.is_finite() || value < 0.0 {
        return Err(ApiError::InvalidRequest(format!(
            "Quota {key} must be a finite, non-negative number"
        )));
    }
    Ok(())
}

/// Plans an AlterClientQuotas request: one result per entry (in request
/// order) and the records to write (only changes, as Kafka writes them).
/// An entry with an error writes nothing.
pub fn plan_alter(
    quotas: &Quotas,
    alterations: &[Alteration],
) -> (Vec<Result<(), ApiError>>, Vec<MetadataRecord>) {
    let mut results = Vec::with_capacity(alterations.len());
    let mut records = Vec::new();
    let mut seen: Vec<ClientQuotaEntity> = Vec::new();
    for alteration in alterations {
        let result = (|| {
            let entity = validate_entity(&alteration.entity)?;
            if seen.contains(&entity) {
                return Err(ApiError::InvalidRequest(format!(
                    "Ignoring duplicate entity {entity:?}"
                )));
            }
            seen.push(entity.clone());
            let mut keys: Vec<&str> = Vec::new();
            for (key, _) in &alteration.ops {
                if keys.contains(&key.as_str()) {
                    return Err(ApiError::InvalidRequest(format!(
                        "Duplicate quota key {key} not updating quota for this entity"
                    )));
                }
                keys.push(key);
            }
            let current = quotas.get(&entity);
            let mut out = Vec::new();
            for (key, value) in &alteration.ops {
                let now = current.and_then(|m| m.get(key)).copied();
                match value {
                    None => {
                        if now.is_some() {
                            out.push(MetadataRecord::ClientQuota {
                                entity: entity.clone(),
                                key: key.clone(),
                                value: None,
                            });
                        }
                    }
                    Some(v) => {
                        validate_value(key, *v)?;
                        if now.map(f64::to_bits) != Some(v.to_bits()) {
                            out.push(MetadataRecord::ClientQuota {
                                entity: entity.clone(),
                                key: key.clone(),
                                value: Some(QuotaValue(*v)),
                            });
                        }
                    }
                }
            }
            Ok(out)
        })();
        match result {
            Ok(out) => {
                records.extend(out);
                results.push(Ok(()));
            }
            Err(e) => results.push(Err(e)),
        }
    }
    (results, records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entity(user: Option<Option<&str>>, client: Option<Option<&str>>) -> ClientQuotaEntity {
        let f =
            |p: Option<Option<&str>>| p.map(|n| QuotaEntityName::from_option(n.map(String::from)));
        ClientQuotaEntity {
            user: f(user),
            client_id: f(client),
        }
    }

    fn sample() -> Quotas {
        let mut q = Quotas::new();
        for e in [
            entity(Some(Some("alice")), None),
            entity(Some(Some("alice")), Some(Some("app"))),
            entity(Some(None), None),
            entity(None, Some(Some("app"))),
            entity(None, Some(None)),
            entity(Some(None), Some(None)),
        ] {
            q.entry(e)
                .or_default()
                .insert("producer_byte_rate".into(), 1.0);
        }
        q
    }

    fn c(t: &str, m: i8, s: Option<&str>) -> Component {
        Component {
            entity_type: t.into(),
            match_type: m,
            matched: s.map(String::from),
        }
    }

    fn found(components: &[Component], strict: bool) -> Vec<ClientQuotaEntity> {
        let q = sample();
        describe(&q, components, strict)
            .unwrap()
            .into_iter()
            .map(|(e, _)| e.clone())
            .collect()
    }

    #[test]
    fn describe_filters() {
        // No components: everything (non-strict), nothing (strict).
        assert_eq!(found(&[], false).len(), 6);
        assert_eq!(found(&[], true).len(), 0);
        // Exact user alice: both of alice's entities; strict: only /users/alice.
        assert_eq!(
            found(&[c(USER, MATCH_EXACT, Some("alice"))], false).len(),
            2
        );
        assert_eq!(
            found(&[c(USER, MATCH_EXACT, Some("alice"))], true),
            vec![entity(Some(Some("alice")), None)]
        );
        // Default user, strict: /users/<default>.
        assert_eq!(
            found(&[c(USER, MATCH_DEFAULT, None)], true),
            vec![entity(Some(None), None)]
        );
        // Specified client id: every entity with a client id.
        assert_eq!(
            found(&[c(CLIENT_ID, MATCH_SPECIFIED, None)], false).len(),
            4
        );
        assert_eq!(found(&[c(CLIENT_ID, MATCH_SPECIFIED, None)], true).len(), 2);
        // User specified + client default.
        assert_eq!(
            found(
                &[
                    c(USER, MATCH_SPECIFIED, None),
                    c(CLIENT_ID, MATCH_DEFAULT, None)
                ],
                true
            ),
            vec![entity(Some(None), Some(None))]
        );
        // An ip filter matches nothing here.
        assert!(found(&[c(IP, MATCH_SPECIFIED, None)], false).is_empty());
    }

    #[test]
    fn describe_errors() {
        let q = sample();
        let err = |cs: &[Component]| describe(&q, cs, false).unwrap_err().code();
        let invalid = 42; // INVALID_REQUEST
        let unsupported = 35; // UNSUPPORTED_VERSION
        assert_eq!(err(&[c("", MATCH_EXACT, Some("a"))]), invalid);
        assert_eq!(err(&[c(USER, MATCH_EXACT, None)]), invalid);
        assert_eq!(err(&[c(USER, MATCH_DEFAULT, Some("a"))]), invalid);
        assert_eq!(err(&[c(USER, MATCH_SPECIFIED, Some("a"))]), invalid);
        assert_eq!(
            err(&[c(USER, MATCH_SPECIFIED, None), c(USER, MATCH_DEFAULT, None)]),
            invalid
        );
        assert_eq!(
            err(&[c(IP, MATCH_SPECIFIED, None), c(USER, MATCH_DEFAULT, None)]),
            invalid
        );
        assert_eq!(err(&[c("group", MATCH_SPECIFIED, None)]), unsupported);
        assert_eq!(err(&[c(USER, 7, None)]), unsupported);
    }

    fn alt(entity: &[(&str, Option<&str>)], ops: &[(&str, Option<f64>)]) -> Alteration {
        Alteration {
            entity: entity
                .iter()
                .map(|(t, n)| (t.to_string(), n.map(String::from)))
                .collect(),
            ops: ops.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }

    #[test]
    fn alter_plans_changes_only() {
        let q = sample();
        let (results, records) = plan_alter(
            &q,
            &[
                // Same value: no record.
                alt(
                    &[(USER, Some("alice"))],
                    &[("producer_byte_rate", Some(1.0))],
                ),
                // New key and a removal of a set key.
                alt(
                    &[(USER, None)],
                    &[
                        ("request_percentage", Some(12.5)),
                        ("producer_byte_rate", None),
                    ],
                ),
                // Removal of an unset key: nothing.
                alt(&[(CLIENT_ID, Some("x"))], &[("consumer_byte_rate", None)]),
            ],
        );
        assert!(results.iter().all(Result::is_ok));
        assert_eq!(records.len(), 2);
    }

    #[test]
    fn alter_errors() {
        let q = Quotas::new();
        let code = |a: Alteration| plan_alter(&q, &[a]).0[0].clone().unwrap_err().code();
        let invalid = 42;
        assert_eq!(
            code(alt(&[], &[("producer_byte_rate", Some(1.0))])),
            invalid
        );
        assert_eq!(code(alt(&[("group", Some("g"))], &[])), invalid);
        assert_eq!(code(alt(&[(USER, Some(""))], &[])), invalid);
        assert_eq!(
            code(alt(&[(USER, Some("a")), (USER, Some("b"))], &[])),
            invalid
        );
        assert_eq!(code(alt(&[(IP, Some("1.2.3.4"))], &[])), invalid);
        assert_eq!(
            code(alt(&[(USER, Some("a"))], &[("bogus", Some(1.0))])),
            invalid
        );
        assert_eq!(
            code(alt(
                &[(USER, Some("a"))],
                &[("producer_byte_rate", Some(1.5))]
            )),
            invalid
        );
        assert_eq!(
            code(alt(
                &[(USER, Some("a"))],
                &[
                    ("producer_byte_rate", Some(1.0)),
                    ("producer_byte_rate", None)
                ]
            )),
            invalid
        );
        // request_percentage is a double.
        assert!(plan_alter(
            &q,
            &[alt(
                &[(USER, Some("a"))],
                &[("request_percentage", Some(1.5))]
            )]
        )
        .0[0]
            .is_ok());
        // A duplicate entity: the second is refused, the first applies.
        let (results, records) = plan_alter(
            &q,
            &[
                alt(&[(USER, Some("a"))], &[("producer_byte_rate", Some(1.0))]),
                alt(&[(USER, Some("a"))], &[("producer_byte_rate", Some(2.0))]),
            ],
        );
        assert!(results[0].is_ok() && results[1].is_err());
        assert_eq!(records.len(), 1);
    }
}
