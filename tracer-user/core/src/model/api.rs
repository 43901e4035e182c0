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
    /// a `LostEvents` message), and those a subscriber that is behind has missed and not yet
    /// been told of (it is told when it reads next).
    pub lost: u64,
    /// TCP connections the API listener closed, by why (`export::api::accept`).
    pub connections: ApiConnStats,
}

/// What the API's TCP listener refused, since the agent started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ApiConnStats {
    /// Closed at accept: the listener's `max_connections` were open.
    pub refused_server_limit: u64,
    /// Closed at accept: that client address already held `max_connections_per_peer`.
    pub refused_peer_limit: u64,
    /// Closed because the TLS handshake and HTTP/2 preface did not arrive within the handshake
    /// timeout (idle connections).
    pub handshake_timeout: u64,
    /// Closed because the TLS handshake failed or what came was not HTTP/2.
    pub handshake_failed: u64,
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
