//! Config administration: AlterConfigs and IncrementalAlterConfigs of topic
//! and broker resources. The new set of configs is computed and validated
//! (`alter_config.rs`, pure), planned as the records that make the stored
//! set equal to it (`tessera_planner`) against the committed image, and
//! written as one metadata entry through the controller.

use super::Broker;
use crate::alter_config::{
    broker_resource, new_broker_configs, new_topic_configs, ConfigChange, RESOURCE_BROKER,
    RESOURCE_TOPIC,
};
use crate::error::ApiError;

impl Broker {
    /// AlterConfigs and IncrementalAlterConfigs: alters each
    /// `(resource type, name, change)` in turn, a resource named twice
    /// failing both times (Kafka's rule); each one's `(error code,
    /// message)`, in request order.
    pub async fn alter_resources(
        &self,
        resources: Vec<(i8, &str, ConfigChange)>,
        validate_only: bool,
    ) -> Vec<(i16, Option<String>)> {
        let duplicates =
            crate::alter_config::duplicate_resources(resources.iter().map(|(t, n, _)| (*t, *n)));
        let mut outcomes = Vec::with_capacity(resources.len());
        for (i, (resource_type, name, change)) in resources.iter().enumerate() {
            let outcome = if duplicates.contains(&i) {
                Err(ApiError::InvalidRequest(
                    "Each resource must appear at most once.".into(),
                ))
            } else {
                self.alter_configs(*resource_type, name, change, validate_only)
                    .await
            };
            outcomes.push(match outcome {
                Ok(()) => (crate::error::NONE, None),
                Err(e) => (e.code(), e.message()),
            });
        }
        outcomes
    }

    /// Alters one resource's configs; with `validate_only` everything is
    /// checked and nothing written.
    pub async fn alter_configs(
        &self,
        resource_type: i8,
        name: &str,
        change: &ConfigChange,
        validate_only: bool,
    ) -> Result<(), ApiError> {
        match resource_type {
            RESOURCE_TOPIC => self.alter_topic_configs(name, change, validate_only).await,
            RESOURCE_BROKER => self.alter_broker_configs(name, change, validate_only).await,
            other => Err(ApiError::InvalidRequest(format!(
                "Unsupported resource type {other}"
            ))),
        }
    }

    async fn alter_topic_configs(
        &self,
        name: &str,
        change: &ConfigChange,
        validate_only: bool,
    ) -> Result<(), ApiError> {
        if name.is_empty() {
            return Err(ApiError::InvalidRequest(
                "Default topic resources are not allowed.".into(),
            ));
        }
        let _guard = self.admin.lock().await;
        let image = self.image();
        let topic = image
            .topic_by_name(name)
            .ok_or(ApiError::UnknownTopicOrPartition)?;
        let wanted = new_topic_configs(&topic.configs, change)?;
        let records = tessera_planner::alter_topic_configs(&image, topic.id, &wanted)?;
        if validate_only || records.is_empty() {
            return Ok(());
        }
        let outcome = self.controller.write_detailed(records).await?;
        if !outcome.skipped.is_empty() {
            // The topic was deleted between our plan and our write.
            return Err(ApiError::UnknownTopicOrPartition);
        }
        // Answered once this broker's open logs follow (roll limits).
        self.await_reconciled(outcome.offset).await
    }

    async fn alter_broker_configs(
        &self,
        name: &str,
        change: &ConfigChange,
        validate_only: bool,
    ) -> Result<(), ApiError> {
        let broker_id = broker_resource(name, self.config.node_id)?;
        let _guard = self.admin.lock().await;
        let image = self.image();
        let empty = Default::default();
        let current = image.broker_configs.get(&broker_id).unwrap_or(&empty);
        let wanted = new_broker_configs(current, change)?;
        // Certificates: per broker only (Kafka's rule for SSL keys); the
        // files are loaded now, so a set that does not load is refused
        // before anything is written. Naming a key reloads its files even
        // when the value is unchanged (how a rotated file is picked up).
        let tls_keys: Vec<&str> = change
            .keys()
            .into_iter()
            .filter(|k| crate::tls::is_reloadable(k))
            .collect();
        let tls = match (&self.config.tls, tls_keys.is_empty()) {
            (_, true) => None,
            (_, false) if broker_id.is_none() => {
                return Err(ApiError::InvalidRequest(format!(
                    "Cannot update these configs at default cluster level, broker id must be specified: Set({})",
                    tls_keys.join(", ")
                )))
            }
            (None, false) => {
                return Err(ApiError::InvalidRequest(format!(
                    "This broker has no SSL or SASL_SSL listener to update: Set({})",
                    tls_keys.join(", ")
                )))
            }
            (Some(tls), false) => Some((
                tls,
                tls.prepare(&wanted).map_err(|e| {
                    ApiError::InvalidRequest(format!(
                        "Validation of dynamic config update of SSLFactory failed: {e}"
                    ))
                })?,
            )),
        };
        let per_broker = crate::dynamic_config::per_broker_only(change.keys());
        if broker_id.is_none() && !per_broker.is_empty() {
            return Err(ApiError::InvalidRequest(format!(
                "Cannot update these configs at default cluster level, broker id must be specified: Set({})",
                per_broker.join(", ")
            )));
        }
        let records = tessera_planner::alter_broker_configs(&image, broker_id, &wanted);
        if validate_only {
            return Ok(());
        }
        if !records.is_empty() {
            let offset = self.controller.write(records).await?;
            self.await_reconciled(offset).await?;
        }
        if let Some((tls, configs)) = tls {
            tls.install(configs);
            tracing::info!(keys = ?tls_keys, "TLS certificates reloaded");
        }
        Ok(())
    }
}
