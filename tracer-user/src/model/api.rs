//! What the agent's gRPC API did: its subscribers and the events they lost.
use serde::Serialize;

/// The event hub's counters (`export::api::hub`), since the agent started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ApiStats {
    /// Events the agent published to the hub.
    pub published: u64,
    /// Subscribers connected now.
    pub subscribers: u64,
    /// Subscriptions accepted so far.
    pub subscriptions: u64,
    /// Subscriptions refused because `api.max_subscribers` were connected.
    pub refused: u64,
    /// Events subscribers missed because they fell behind, summed over subscribers (each told by
    /// a `LostEvents` message).
    pub lost: u64,
}
