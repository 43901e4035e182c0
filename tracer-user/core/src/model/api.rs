//! What the agent's servers did: the gRPC API's subscribers and the events they lost, and the
//! HTTP server's refused connections.
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

/// The HTTP server's counters (`export::http`), since the agent started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HttpStats {
    /// Connections closed at accept because the server's `max_connections` were open.
    pub refused_server_limit: u64,
    /// Connections closed at accept because their peer address already held
    /// `max_connections_per_peer` (one client cannot take every slot).
    pub refused_peer_limit: u64,
    /// Scrapes of /metrics answered 401: no or a wrong bearer token (`metrics.token_file`).
    pub unauthorized: u64,
}
