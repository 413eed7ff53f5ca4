//! Topic administration: requests validated as Kafka validates them, turned
//! into the controller's plans ([`tessera_planner`]) against the committed
//! image, written to the metadata log, and answered once this broker's logs
//! follow the image that holds them.

use std::collections::BTreeMap;
use std::sync::Arc;

use tessera_metadata::{TopicId, TopicImage};
use tessera_planner::TopicSpec;

use super::Broker;
use crate::error::ApiError;
use crate::topic_config::{validate_topic_configs, validate_topic_name};

/// A topic creation request, already decoded.
pub struct NewTopic {
    pub name: String,
    pub partitions: u32,
    pub replication_factor: i16,
    pub configs: BTreeMap<String, String>,
}

impl Broker {
    /// Validates a new topic against the committed image; with `validate_only`
    /// nothing is written.
    pub async fn create_topic(
        &self,
        topic: NewTopic,
        validate_only: bool,
    ) -> Result<Arc<TopicImage>, ApiError> {
        self.create_topic_assigned(topic, None, validate_only).await
    }

    /// [`Broker::create_topic`] with the client's replica list for each
    /// partition, if it gave them (CreateTopics' manual assignment).
    pub async fn create_topic_assigned(
        &self,
        topic: NewTopic,
        assignments: Option<Vec<Vec<i32>>>,
        validate_only: bool,
    ) -> Result<Arc<TopicImage>, ApiError> {
        validate_topic_name(&topic.name)?;
        // Every creator's configs are checked here, whoever calls (CreateTopics,
        // the console, auto-creation, internal topics), as Kafka's
        // `LogConfig.validate` does before any plan is made.
        let configs = validate_topic_configs(topic.configs.into_iter().map(|(k, v)| (k, Some(v))))?;
        let _guard = self.admin.lock().await;
        let image = self.image();
        let spec = TopicSpec {
            topic_id: uuid::Uuid::new_v4(),
            name: topic.name,
            partitions: topic.partitions,
            replication_factor: topic.replication_factor,
            configs,
        };
        let records =
            tessera_planner::create_topic_assigned(&image, spec.clone(), assignments.as_deref())?;
        if validate_only {
            return Ok(Arc::new(TopicImage {
                id: spec.topic_id,
                name: spec.name,
                partitions: spec.partitions,
                replication_factor: spec.replication_factor,
                configs: spec.configs,
            }));
        }
        let outcome = self.controller.write_detailed(records).await?;
        if outcome.skipped.contains(&0) {
            // Another broker created the name first (its entry committed
            // between our plan and our write): replay skipped ours. This
            // broker's image is brought up to our entry first, so that a
            // caller taking the existing topic (auto-creation) finds it.
            self.await_reconciled(outcome.offset).await?;
            return Err(ApiError::TopicAlreadyExists(spec.name));
        }
        let mut offset = outcome.offset;
        if !outcome.skipped.is_empty() {
            // The topic is ours, but a concurrent write (a plan made on
            // another node against the same image) took some of our range
            // ids: the partitions without a range are covered before
            // answering.
            for _ in 0..5 {
                let records = tessera_planner::cover_partitions(&self.image(), spec.topic_id)?;
                if records.is_empty() {
                    break;
                }
                offset = self.controller.write(records).await?;
            }
        }
        self.await_reconciled(offset).await?;
        self.image()
            .topics
            .get(&spec.topic_id)
            .cloned()
            .ok_or(ApiError::UnknownTopicOrPartition)
    }

    /// Creates a topic with the broker's defaults, for auto-creation.
    pub async fn auto_create_topic(&self, name: &str) -> Result<Arc<TopicImage>, ApiError> {
        self.create_or_existing(NewTopic {
            name: name.to_string(),
            partitions: self.config.num_partitions,
            replication_factor: self.config.default_replication_factor,
            configs: BTreeMap::new(),
        })
        .await
    }

    /// Creates a topic, or returns the one another creator made first
    /// (auto-creation and internal topics race other requests and brokers).
    pub async fn create_or_existing(&self, topic: NewTopic) -> Result<Arc<TopicImage>, ApiError> {
        let name = topic.name.clone();
        match self.create_topic(topic, false).await {
            Err(ApiError::TopicAlreadyExists(_)) => self
                .image()
                .topic_by_name(&name)
                .cloned()
                .ok_or(ApiError::UnknownTopicOrPartition),
            other => other,
        }
    }

    /// CreatePartitions for one topic: planned against the committed image
    /// (`tessera_planner::create_partitions`: a new range for the new
    /// partitions, see there why), written as one metadata entry, and
    /// answered once this broker's logs follow it. With `validate_only`
    /// the plan is made and nothing is written. Internal topics are
    /// refused: their partition count is the coordinators' hash modulus.
    pub async fn create_partitions(
        &self,
        name: &str,
        count: u32,
        assignments: Option<Vec<Vec<i32>>>,
        validate_only: bool,
    ) -> Result<(), ApiError> {
        let _guard = self.admin.lock().await;
        let mut image = self.image();
        let topic = image
            .topic_by_name(name)
            .cloned()
            .ok_or(ApiError::UnknownTopicOrPartition)?;
        if crate::internal_topics::is_internal(name) {
            return Err(ApiError::InvalidRequest(format!(
                "cannot add partitions to the internal topic {name}: its partition count keys its coordinators"
            )));
        }
        if !validate_only {
            // A tail a concurrent CreatePartitions left without a range
            // (its writer died before covering it) is covered first.
            let cover = tessera_planner::cover_partitions(&image, topic.id)?;
            if !cover.is_empty() {
                self.controller.write(cover).await?;
                image = self.image();
            }
        }
        let records =
            tessera_planner::create_partitions(&image, topic.id, count, assignments.as_deref())?;
        if validate_only {
            return Ok(());
        }
        let outcome = self.controller.write_detailed(records).await?;
        let mut offset = outcome.offset;
        if !outcome.skipped.is_empty() {
            // Another broker changed the topic between our plan and our
            // write (plans on other nodes are made against their images):
            // it deleted the topic, grew it first (our count is skipped),
            // or took our range id (our count applied, our range did not).
            // Partitions without a range are covered before answering.
            for _ in 0..5 {
                let image = self.image();
                let records = tessera_planner::cover_partitions(&image, topic.id)?;
                if records.is_empty() {
                    break;
                }
                offset = self.controller.write(records).await?;
            }
            if outcome.skipped.contains(&0) {
                let now = self.image();
                return match now.topics.get(&topic.id) {
                    None => Err(ApiError::UnknownTopicOrPartition),
                    Some(t) => Err(ApiError::InvalidPartitions(format!(
                        "The topic {name} currently has {} partition(s); {count} would not be an increase.",
                        t.partitions
                    ))),
                };
            }
        }
        self.await_reconciled(offset).await
    }

    /// DeleteRecords: writes the new log start offsets `(partition,
    /// offset)` of the topics given (already checked by the leader against
    /// its high watermarks) as one metadata entry, and returns once this
    /// broker's logs have applied it.
    pub async fn advance_log_starts(
        &self,
        targets: &[(TopicId, Vec<(u32, i64)>)],
    ) -> Result<(), ApiError> {
        let image = self.image();
        let mut records = Vec::new();
        for (topic_id, offsets) in targets {
            records.extend(tessera_planner::advance_log_start_offsets(
                &image, *topic_id, offsets,
            )?);
        }
        if records.is_empty() {
            return Ok(());
        }
        let offset = self.controller.write(records).await?;
        self.await_reconciled(offset).await
    }

    /// Deletes a topic: its metadata goes first; its files go when this
    /// broker's logs follow the image without it.
    pub async fn delete_topic(&self, topic_id: TopicId) -> Result<(), ApiError> {
        let _guard = self.admin.lock().await;
        let records = tessera_planner::delete_topic(&self.image(), topic_id)?;
        let offset = self.controller.write(records).await?;
        self.await_reconciled(offset).await
    }
}
