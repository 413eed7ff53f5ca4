//! Who may speak to this broker as a broker (pure decisions): open a
//! replication stream on a Kafka listener, or use the metadata quorum
//! transport. Kafka's analogue is the authorization of a replica's Fetch
//! and of the controller RPCs (`authHelper.authorizeClusterOperation(
//! request, CLUSTER_ACTION)`): only a principal allowed CLUSTER_ACTION on
//! the cluster — a broker's, named in `super.users` — is a broker. No
//! connection is one because of the listener it came in on.

use std::fmt;

/// What is known of a connection that asks to be taken as a broker's.
#[derive(Clone, Copy, Debug)]
pub struct Peer {
    /// It came in on the inter-broker listener (replication streams are
    /// served there only, as Kafka serves replica fetches).
    pub on_inter_broker_listener: bool,
    /// The listener's authentication is complete (SASL done, or the TLS
    /// handshake its `ssl.client.auth` asks for; PLAINTEXT: ANONYMOUS).
    pub authenticated: bool,
    /// Its principal may do CLUSTER_ACTION on the cluster (always, without
    /// an authorizer).
    pub cluster_action: bool,
}

/// Why a connection is not taken as a broker's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    NotInterBrokerListener,
    NotAuthenticated,
    NotAuthorized,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::NotInterBrokerListener => "not the inter-broker listener",
            Refusal::NotAuthenticated => "the connection has not authenticated",
            Refusal::NotAuthorized => "its principal is not allowed CLUSTER_ACTION on the cluster",
        })
    }
}

/// Whether `peer` may turn its connection into a replication stream.
pub fn admit_replication(peer: Peer) -> Result<(), Refusal> {
    if !peer.on_inter_broker_listener {
        return Err(Refusal::NotInterBrokerListener);
    }
    admit_quorum_peer(peer)
}

/// Whether `peer` may use the metadata quorum transport (its listener is
/// the controller listener; `on_inter_broker_listener` is not asked).
pub fn admit_quorum_peer(peer: Peer) -> Result<(), Refusal> {
    if !peer.authenticated {
        return Err(Refusal::NotAuthenticated);
    }
    if !peer.cluster_action {
        return Err(Refusal::NotAuthorized);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(listener: bool, authenticated: bool, cluster_action: bool) -> Peer {
        Peer {
            on_inter_broker_listener: listener,
            authenticated,
            cluster_action,
        }
    }

    #[test]
    fn only_an_authenticated_broker_on_the_inter_broker_listener() {
        assert_eq!(admit_replication(peer(true, true, true)), Ok(()));
        assert_eq!(
            admit_replication(peer(false, true, true)),
            Err(Refusal::NotInterBrokerListener)
        );
        assert_eq!(
            admit_replication(peer(true, false, true)),
            Err(Refusal::NotAuthenticated)
        );
        assert_eq!(
            admit_replication(peer(true, true, false)),
            Err(Refusal::NotAuthorized)
        );
    }

    #[test]
    fn the_quorum_asks_the_same_of_any_listener() {
        assert_eq!(admit_quorum_peer(peer(false, true, true)), Ok(()));
        assert_eq!(
            admit_quorum_peer(peer(false, false, true)),
            Err(Refusal::NotAuthenticated)
        );
        assert_eq!(
            admit_quorum_peer(peer(false, true, false)),
            Err(Refusal::NotAuthorized)
        );
    }
}
