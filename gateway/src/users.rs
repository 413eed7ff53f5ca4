//! `tessera users add NAME --password ...`: writes a user's SCRAM
//! credentials to the metadata log of a node that is not running (Kafka's
//! `kafka-storage format --add-scram`), so the first client can log in
//! to a SASL listener; later users are added with AlterUserScramCredentials
//! (`kafka-configs --alter --add-config 'SCRAM-SHA-256=[password=...]'`).

use tessera_metadata::Controller;

use crate::broker::controller_config;
use crate::config::BrokerConfig;
use crate::sasl::scram::{fresh_salt, ScramCredential, ScramMechanism};

/// Kafka's default iterations (`kafka-configs`, `kafka-storage`).
pub const DEFAULT_ITERATIONS: u32 = 4096;

/// Adds (or replaces) `user`'s credentials for `mechanisms`.
pub async fn add(
    config: &BrokerConfig,
    user: &str,
    password: &str,
    mechanisms: &[ScramMechanism],
    iterations: u32,
) -> anyhow::Result<()> {
    if user.is_empty() || password.is_empty() {
        anyhow::bail!("the user name and the password must not be empty");
    }
    if !(ScramMechanism::MIN_ITERATIONS..=ScramMechanism::MAX_ITERATIONS).contains(&iterations) {
        anyhow::bail!(
            "iterations must be in {}..={}",
            ScramMechanism::MIN_ITERATIONS,
            ScramMechanism::MAX_ITERATIONS
        );
    }
    std::fs::create_dir_all(&config.data_dir)?;
    let records = mechanisms
        .iter()
        .map(|m| {
            tessera_metadata::MetadataRecord::SetScramCredential(
                ScramCredential::from_password(*m, password, &fresh_salt(), iterations)
                    .to_record(user, *m),
            )
        })
        .collect();
    let controller = Controller::start(controller_config(config)?).await?;
    let written = controller.write(records).await;
    controller.shutdown().await;
    written?;
    Ok(())
}
