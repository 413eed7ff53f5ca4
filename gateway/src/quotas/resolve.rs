//! Which quota applies to a (user, client id) and which clients share it:
//! Kafka's `DefaultQuotaCallback` (`quotaMetricTags` + `quotaLimit`), as a
//! pure function of the configured quotas.
//!
//! The first of these entities that sets the key wins:
//!
//! 1. `/users/U/clients/C`
//! 2. `/users/U/clients/<default>`
//! 3. `/users/U`
//! 4. `/users/<default>/clients/C`
//! 5. `/users/<default>/clients/<default>`
//! 6. `/users/<default>`
//! 7. `/clients/C`
//! 8. `/clients/<default>`
//!
//! The sensor the usage is measured on is named by Kafka's metric tags:
//! (user, client id) for levels 1, 2, 4 and 5, (user, "") for 3 and 6 (every
//! client of the user shares the quota) and ("", client id) for 7 and 8.

use std::collections::BTreeMap;

use tessera_metadata::{ClientQuotaEntity, QuotaEntityName};

/// The configured quotas: entity -> key -> value (the image's
/// `client_quotas`).
pub type Quotas = BTreeMap<ClientQuotaEntity, BTreeMap<String, f64>>;

/// The quota that applies, and the tags of the sensor that measures it.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    pub bound: f64,
    /// Kafka's `user` metric tag ("" when the quota is not per user).
    pub user_tag: String,
    /// Kafka's `client-id` metric tag ("" when the quota is not per client).
    pub client_tag: String,
    /// Which of the 8 levels matched (1-based, as above).
    pub level: u8,
}

fn named(n: &str) -> Option<QuotaEntityName> {
    Some(QuotaEntityName::Named(n.to_string()))
}

/// The 8 entities in precedence order, with the shape of their tags:
/// (entity, per user, per client).
pub fn candidates(user: &str, client_id: &str) -> [(ClientQuotaEntity, bool, bool); 8] {
    let e = |user, client_id| ClientQuotaEntity { user, client_id };
    let d = || Some(QuotaEntityName::Default);
    [
        (e(named(user), named(client_id)), true, true),
        (e(named(user), d()), true, true),
        (e(named(user), None), true, false),
        (e(d(), named(client_id)), true, true),
        (e(d(), d()), true, true),
        (e(d(), None), true, false),
        (e(None, named(client_id)), false, true),
        (e(None, d()), false, true),
    ]
}

/// The quota on `key` for a client authenticated as `user` (the
/// principal's name, `ANONYMOUS` when none) with `client_id`; None when
/// nothing sets it (the client is unlimited).
pub fn resolve(quotas: &Quotas, key: &str, user: &str, client_id: &str) -> Option<Resolved> {
    if quotas.is_empty() {
        return None;
    }
    candidates(user, client_id)
        .into_iter()
        .enumerate()
        .find_map(|(i, (entity, per_user, per_client))| {
            let bound = *quotas.get(&entity)?.get(key)?;
            Some(Resolved {
                bound,
                user_tag: if per_user {
                    user.to_string()
                } else {
                    String::new()
                },
                client_tag: if per_client {
                    client_id.to_string()
                } else {
                    String::new()
                },
                level: i as u8 + 1,
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KEY: &str = "producer_byte_rate";

    /// Quotas with level i (1-based) set to `i * 10` when its bit is set
    /// in `mask` (bit i-1), for user "u" and client "c".
    fn quotas_for(mask: u8) -> Quotas {
        let mut q = Quotas::new();
        for (i, (entity, _, _)) in candidates("u", "c").into_iter().enumerate() {
            if mask & (1 << i) != 0 {
                q.entry(entity)
                    .or_default()
                    .insert(KEY.to_string(), (i as f64 + 1.0) * 10.0);
            }
        }
        q
    }

    /// Every subset of the 8 levels: the lowest set level wins, with
    /// Kafka's tags for it.
    #[test]
    fn exhaustive_precedence() {
        for mask in 0u16..256 {
            let mask = mask as u8;
            let got = resolve(&quotas_for(mask), KEY, "u", "c");
            if mask == 0 {
                assert_eq!(got, None);
                continue;
            }
            let level = mask.trailing_zeros() as u8 + 1;
            let (user_tag, client_tag) = match level {
                1 | 2 | 4 | 5 => ("u", "c"),
                3 | 6 => ("u", ""),
                _ => ("", "c"),
            };
            assert_eq!(
                got,
                Some(Resolved {
                    bound: level as f64 * 10.0,
                    user_tag: user_tag.into(),
                    client_tag: client_tag.into(),
                    level,
                }),
                "mask {mask:08b}"
            );
            // Another key is never picked up.
            assert_eq!(
                resolve(&quotas_for(mask), "consumer_byte_rate", "u", "c"),
                None
            );
        }
    }

    #[test]
    fn other_users_and_clients_only_see_defaults() {
        let q = quotas_for(0xff);
        // User "v", client "c": levels 1-3 name "u"; level 4 (default user,
        // client c) applies.
        assert_eq!(resolve(&q, KEY, "v", "c").unwrap().level, 4);
        // User "v", client "d": level 5 (default user, default client).
        assert_eq!(resolve(&q, KEY, "v", "d").unwrap().level, 5);
        let only_clients = quotas_for(0b1100_0000);
        assert_eq!(resolve(&only_clients, KEY, "v", "c").unwrap().level, 7);
        let r = resolve(&only_clients, KEY, "v", "d").unwrap();
        assert_eq!(
            (r.level, r.user_tag.as_str(), r.client_tag.as_str()),
            (8, "", "d")
        );
        let only_user = quotas_for(0b0000_0100);
        assert_eq!(resolve(&only_user, KEY, "v", "c"), None);
    }

    #[test]
    fn empty_names_are_names() {
        // An empty client id is a client id like any other (Kafka's
        // default is a separate entity, never "").
        let mut q = Quotas::new();
        q.entry(ClientQuotaEntity {
            user: None,
            client_id: Some(QuotaEntityName::Default),
        })
        .or_default()
        .insert(KEY.into(), 5.0);
        let r = resolve(&q, KEY, "ANONYMOUS", "").unwrap();
        assert_eq!(r.level, 8);
        assert_eq!(r.bound, 5.0);
    }

    proptest! {
        /// Against a direct reading of Kafka's quotaMetricTags/quotaLimit.
        #[test]
        fn matches_kafka_callback(mask in any::<u8>(), user in "[uv]", client in "[cd]") {
            let q = quotas_for(mask);
            let has = |e: &ClientQuotaEntity| q.get(e).is_some_and(|m| m.contains_key(KEY));
            let c = candidates(&user, &client);
            // quotaMetricTags
            let tags = if has(&c[0].0) || has(&c[1].0) {
                (user.clone(), client.clone())
            } else if has(&c[2].0) {
                (user.clone(), String::new())
            } else if has(&c[3].0) || has(&c[4].0) {
                (user.clone(), client.clone())
            } else if has(&c[5].0) {
                (user.clone(), String::new())
            } else {
                (String::new(), client.clone())
            };
            // quotaLimit
            let get = |i: usize| q.get(&c[i].0).and_then(|m| m.get(KEY)).copied();
            let limit = if !tags.0.is_empty() && !tags.1.is_empty() {
                get(0).or(get(1)).or(get(3)).or(get(4))
            } else if !tags.0.is_empty() {
                get(2).or(get(5))
            } else {
                get(6).or(get(7))
            };
            let got = resolve(&q, KEY, &user, &client);
            prop_assert_eq!(got.as_ref().map(|r| r.bound), limit);
            if let Some(r) = got {
                prop_assert_eq!((r.user_tag, r.client_tag), tags);
            }
        }
    }
}
