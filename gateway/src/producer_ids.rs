//! Producer ids, handed out from blocks recorded in the metadata log (as
//! KRaft's ProducerIdsRecord), so no id is ever reused, also across restarts.

use tessera_metadata::Controller;

use crate::error::ApiError;

/// Kafka's producer id block size.
pub const BLOCK_SIZE: i32 = 1000;

#[derive(Default)]
pub struct ProducerIdManager {
    /// `[next, end)` of the block this broker owns.
    block: tokio::sync::Mutex<(i64, i64)>,
}

impl ProducerIdManager {
    pub async fn next_id(&self, controller: &Controller, broker_id: i32) -> Result<i64, ApiError> {
        let mut block = self.block.lock().await;
        let mut attempts = 0;
        while block.0 >= block.1 {
            attempts += 1;
            if attempts > 5 {
                return Err(ApiError::Metadata(
                    "could not allocate a producer id block".into(),
                ));
            }
            let image = controller.image();
            let first = image.next_producer_id;
            let outcome = controller
                .write_detailed(vec![tessera_planner::allocate_producer_ids(
                    &image, broker_id, BLOCK_SIZE,
                )])
                .await?;
            // Skipped means another allocation won the race: try the next block.
            if outcome.skipped.is_empty() {
                *block = (first, first + BLOCK_SIZE as i64);
            }
        }
        let id = block.0;
        block.0 += 1;
        Ok(id)
    }

    /// Makes sure no id up to `id` is ever handed out (migrated batches
    /// carry the source cluster's producer ids; a new producer here must
    /// not be mistaken for one of them): the cluster's next block starts
    /// above it (blocks `[next, id]` are recorded as used by this broker)
    /// and this broker's own block skips past it.
    pub async fn reserve_through(
        &self,
        controller: &Controller,
        broker_id: i32,
        id: i64,
    ) -> Result<(), ApiError> {
        let mut block = self.block.lock().await;
        if block.0 <= id {
            // Past the block's end: the next id takes a new block.
            block.0 = id + 1;
        }
        for _ in 0..64 {
            let image = controller.image();
            let next = image.next_producer_id;
            if next > id {
                return Ok(());
            }
            let count = (id + 1 - next).min(i32::MAX as i64) as i32;
            controller
                .write_detailed(vec![tessera_planner::allocate_producer_ids(
                    &image, broker_id, count,
                )])
                .await?;
        }
        Err(ApiError::Metadata(
            "could not reserve the migrated producer ids".into(),
        ))
    }
}
