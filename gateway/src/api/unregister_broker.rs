//! UnregisterBroker (v0; KIP-631, `kafka-cluster.sh unregister`,
//! `Admin.unregisterBroker`), answered as Kafka's controller answers it
//! (`ReplicationControlManager.unregisterBroker`):
//!
//! - ALTER on the cluster, else CLUSTER_AUTHORIZATION_FAILED;
//! - a broker id the image does not hold (never registered, or already
//!   unregistered): BROKER_ID_NOT_REGISTERED;
//! - a controller (a voter of the metadata quorum): INVALID_REQUEST. Kafka
//!   has no such case (its controllers are not brokers); here a voter's
//!   registration is its broker half and the voter set is static, so it
//!   is refused rather than left half-removed;
//! - otherwise an `UnregisterBroker` record is written (forwarded to the
//!   active controller like every metadata write). Kafka allows a live
//!   (registered, unfenced) broker too: it then re-registers on its next
//!   heartbeat. So does this broker (see `liveness::heartbeat`), and a
//!   live broker-only node therefore stays a learner of the quorum. A
//!   fenced broker-only node is also removed from the raft membership
//!   (the leader stops replicating to it); if that fails a WARN is logged
//!   and the record stays (a restart of the node joins it again anyway).
//!
//! Its copies are then gone for placement, failover and healing: the
//! active controller re-creates its sealed segments' copies elsewhere at
//! once (`tessera_planner::heal_segments`), with no heal delay.

use std::sync::Arc;

use kafka_protocol::messages::{UnregisterBrokerRequest, UnregisterBrokerResponse};
use kafka_protocol::protocol::StrBytes;
use tessera_metadata::MetadataRecord;

use crate::authz::{Authz, Op};
use crate::broker::Broker;
use crate::error::ApiError;
use crate::request_context::RequestContext;

pub async fn handle(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    request: UnregisterBrokerRequest,
) -> UnregisterBrokerResponse {
    match unregister(broker, ctx, request.broker_id.0).await {
        Ok(()) => UnregisterBrokerResponse::default(),
        Err(e) => UnregisterBrokerResponse::default()
            .with_error_code(e.code())
            .with_error_message(e.message().map(StrBytes::from_string)),
    }
}

async fn unregister(
    broker: &Arc<Broker>,
    ctx: &RequestContext,
    broker_id: i32,
) -> Result<(), ApiError> {
    Authz::of(broker, ctx).cluster(Op::Alter)?;
    if broker_id >= 0 && broker.controller().is_voter(broker_id as u64) {
        return Err(ApiError::InvalidRequest(format!(
            "Broker {broker_id} is a controller (a voter of the metadata quorum): the voter set is static, a controller cannot be unregistered"
        )));
    }
    // A linearizable read: a broker that registered a moment ago is known.
    let image = broker.controller().catch_up().await?;
    let Some(registered) = image.brokers.get(&broker_id) else {
        return Err(not_registered(broker_id));
    };
    let was_live = !registered.fenced;
    let outcome = broker
        .controller()
        .write_detailed(vec![MetadataRecord::UnregisterBroker { broker_id }])
        .await?;
    if !outcome.skipped.is_empty() {
        // Lost a race to another unregistration of the same broker.
        return Err(not_registered(broker_id));
    }
    tracing::info!(broker_id, was_live, "broker unregistered");
    if !was_live {
        match broker.controller().remove_learner(broker_id as u64).await {
            Ok(true) => tracing::info!(broker_id, "unregistered broker left the metadata quorum"),
            Ok(false) => {}
            Err(e) => tracing::warn!(
                broker_id,
                error = %e,
                "broker unregistered, but could not remove it from the metadata quorum's learners"
            ),
        }
    }
    Ok(())
}

fn not_registered(broker_id: i32) -> ApiError {
    ApiError::BrokerIdNotRegistered(format!("Broker ID {broker_id} is not currently registered"))
}
