//! AlterUserScramCredentials and DescribeUserScramCredentials decided
//! against an image, as Kafka's controller decides them
//! (`ScramControlManager`): per user, every deletion and upsertion is
//! checked; a user with any bad one gets that error and none of its
//! changes, the others apply. Pure.

use std::collections::{BTreeMap, BTreeSet};

use tessera_metadata::{MetadataImage, MetadataRecord};

use super::scram::{ScramCredential, ScramMechanism};
use crate::error::ApiError;

/// One requested change.
#[derive(Clone, Debug)]
pub enum Alteration {
    Delete {
        user: String,
        mechanism: i8,
    },
    Upsert {
        user: String,
        mechanism: i8,
        iterations: i32,
        salt: Vec<u8>,
        salted_password: Vec<u8>,
    },
}

impl Alteration {
    fn user(&self) -> &str {
        match self {
            Alteration::Delete { user, .. } | Alteration::Upsert { user, .. } => user,
        }
    }
    fn mechanism(&self) -> i8 {
        match self {
            Alteration::Delete { mechanism, .. } | Alteration::Upsert { mechanism, .. } => {
                *mechanism
            }
        }
    }
}

/// Each user's outcome, in first-seen order.
pub type UserResults = Vec<(String, Result<(), ApiError>)>;

/// Per user (in first-seen order) its outcome, and the records to write.
pub fn plan_alter(
    image: &MetadataImage,
    alterations: &[Alteration],
) -> (UserResults, Vec<MetadataRecord>) {
    let mut users: Vec<String> = Vec::new();
    let mut by_user: BTreeMap<String, Vec<&Alteration>> = BTreeMap::new();
    for a in alterations {
        if !by_user.contains_key(a.user()) {
            users.push(a.user().to_string());
        }
        by_user.entry(a.user().to_string()).or_default().push(a);
    }
    let mut results = Vec::new();
    let mut records = Vec::new();
    for user in users {
        match plan_user(image, &user, &by_user[&user]) {
            Ok(mut r) => {
                records.append(&mut r);
                results.push((user, Ok(())));
            }
            Err(e) => results.push((user, Err(e))),
        }
    }
    (results, records)
}

fn plan_user(
    image: &MetadataImage,
    user: &str,
    alterations: &[&Alteration],
) -> Result<Vec<MetadataRecord>, ApiError> {
    if user.is_empty() {
        return Err(ApiError::UnacceptableCredential(
            "Username must not be empty".into(),
        ));
    }
    let mut seen = BTreeSet::new();
    let mut records = Vec::new();
    for a in alterations {
        if !seen.insert(a.mechanism()) {
            return Err(ApiError::DuplicateResource(
                "A user credential cannot be altered twice in the same request".into(),
            ));
        }
        let mechanism = ScramMechanism::from_kafka_type(a.mechanism()).ok_or_else(|| {
            ApiError::UnsupportedSaslMechanism(format!("Unknown SCRAM mechanism {}", a.mechanism()))
        })?;
        match a {
            Alteration::Delete { .. } => {
                let key = (user.to_string(), mechanism.kafka_type() as u8);
                if !image.scram_credentials.contains_key(&key) {
                    return Err(ApiError::ResourceNotFound(
                        "Attempt to delete a user credential that does not exist".into(),
                    ));
                }
                records.push(MetadataRecord::RemoveScramCredential {
                    user: user.to_string(),
                    mechanism: mechanism.kafka_type() as u8,
                });
            }
            Alteration::Upsert {
                iterations,
                salt,
                salted_password,
                ..
            } => {
                if *iterations < ScramMechanism::MIN_ITERATIONS as i32 {
                    return Err(ApiError::UnacceptableCredential(
                        "Too few iterations".into(),
                    ));
                }
                if *iterations > ScramMechanism::MAX_ITERATIONS as i32 {
                    return Err(ApiError::UnacceptableCredential(
                        "Too many iterations".into(),
                    ));
                }
                if salt.is_empty() || salt.len() > tessera_metadata::MAX_SCRAM_SALT_LEN {
                    return Err(ApiError::UnacceptableCredential(format!(
                        "The salt must be 1 to {} bytes",
                        tessera_metadata::MAX_SCRAM_SALT_LEN
                    )));
                }
                if salted_password.is_empty() {
                    return Err(ApiError::UnacceptableCredential(
                        "The salted password must not be empty".into(),
                    ));
                }
                if user.len() > tessera_metadata::MAX_USER_NAME_LEN {
                    return Err(ApiError::UnacceptableCredential(
                        "Username is too long".into(),
                    ));
                }
                let credential = ScramCredential::from_salted_password(
                    mechanism,
                    salted_password,
                    salt,
                    *iterations as u32,
                );
                records.push(MetadataRecord::SetScramCredential(
                    credential.to_record(user, mechanism),
                ));
            }
        }
    }
    Ok(records)
}

/// What DescribeUserScramCredentials answers for one user: its mechanisms
/// and iterations, or an error.
pub type Described = (String, Result<Vec<(i8, i32)>, ApiError>);

/// `users`: None or empty describes every user with a credential.
pub fn describe(image: &MetadataImage, users: Option<&[String]>) -> Vec<Described> {
    let infos = |user: &str| -> Vec<(i8, i32)> {
        image
            .scram_credentials
            .range((user.to_string(), 0)..=(user.to_string(), u8::MAX))
            .map(|((_, m), c)| (*m as i8, c.iterations as i32))
            .collect()
    };
    match users {
        None | Some([]) => {
            let names: BTreeSet<&String> = image.scram_credentials.keys().map(|(u, _)| u).collect();
            names
                .into_iter()
                .map(|u| (u.clone(), Ok(infos(u))))
                .collect()
        }
        Some(users) => {
            let mut count: BTreeMap<&String, usize> = BTreeMap::new();
            for u in users {
                *count.entry(u).or_default() += 1;
            }
            let mut out = Vec::new();
            let mut done = BTreeSet::new();
            for u in users {
                if !done.insert(u) {
                    continue;
                }
                let result = if count[u] > 1 {
                    Err(ApiError::DuplicateResource(
                        "Cannot describe SCRAM credentials for the same user twice in a single request".into(),
                    ))
                } else {
                    let i = infos(u);
                    if i.is_empty() {
                        Err(ApiError::ResourceNotFound(
                            "Attempt to describe a user credential that does not exist".into(),
                        ))
                    } else {
                        Ok(i)
                    }
                };
                out.push((u.clone(), result));
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn upsert(user: &str, mechanism: i8, iterations: i32) -> Alteration {
        Alteration::Upsert {
            user: user.into(),
            mechanism,
            iterations,
            salt: b"salt".to_vec(),
            salted_password: vec![9; 32],
        }
    }

    fn apply(image: &mut MetadataImage, records: Vec<MetadataRecord>) {
        for r in records {
            image.apply(&r, 0);
        }
    }

    #[test]
    fn alter_then_describe() {
        let mut img = MetadataImage::default();
        let (results, records) = plan_alter(
            &img,
            &[
                upsert("alice", 1, 4096),
                upsert("alice", 2, 8192),
                upsert("bob", 1, 100),
                upsert("carol", 3, 4096),
                upsert("dave", 1, 4096),
                upsert("dave", 1, 5000),
                Alteration::Delete {
                    user: "erin".into(),
                    mechanism: 1,
                },
                upsert("", 1, 4096),
            ],
        );
        let codes: Vec<(String, i16)> = results
            .iter()
            .map(|(u, r)| (u.clone(), r.as_ref().err().map_or(0, |e| e.code())))
            .collect();
        assert_eq!(
            codes,
            vec![
                ("alice".into(), 0),
                ("bob".into(), 93),
                ("carol".into(), 33),
                ("dave".into(), 92),
                ("erin".into(), 91),
                ("".into(), 93),
            ]
        );
        assert_eq!(records.len(), 2);
        apply(&mut img, records);
        let d = describe(&img, None);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].1.as_ref().unwrap(), &vec![(1, 4096), (2, 8192)]);
        let d = describe(
            &img,
            Some(&["alice".to_string(), "zed".to_string(), "alice".to_string()]),
        );
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].1.as_ref().unwrap_err().code(), 92);
        assert_eq!(d[1].1.as_ref().unwrap_err().code(), 91);
        // Delete one mechanism.
        let (results, records) = plan_alter(
            &img,
            &[Alteration::Delete {
                user: "alice".into(),
                mechanism: 1,
            }],
        );
        assert!(results[0].1.is_ok());
        apply(&mut img, records);
        assert_eq!(
            describe(&img, Some(&["alice".to_string()]))[0]
                .1
                .as_ref()
                .unwrap(),
            &vec![(2, 8192)]
        );
    }

    proptest! {
        /// Every planned record is valid for the metadata log.
        #[test]
        fn planned_records_validate(
            user in ".{0,12}",
            mechanism in -1i8..4,
            iterations in 0i32..20000,
            salt in proptest::collection::vec(any::<u8>(), 0..8),
            salted in proptest::collection::vec(any::<u8>(), 0..70),
        ) {
            let img = MetadataImage::default();
            let (_, records) = plan_alter(&img, &[Alteration::Upsert {
                user, mechanism, iterations, salt, salted_password: salted,
            }]);
            for r in records {
                prop_assert!(r.validate().is_ok());
            }
        }
    }
}
