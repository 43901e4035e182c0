//! The gRPC API's event hub (`api_*`): subscribers now, events published, and events subscribers
//! lost because they read too slowly. Nothing when the API is off. And the HTTP server's refused
//! connections (`http_connections_refused`), in the agent.
use std::fmt;

use super::{MetricEncoder, Scrape, counter, counter_family, gauge};

/// `api_subscribers`, `api_events_published_total`, `api_events_lost_total`,
/// `api_subscriptions_total`, `api_subscriptions_refused_total`,
/// `api_connections_refused_total{reason}` (every reason, also at 0).
pub fn api(s: &Scrape<'_>, e: &mut dyn MetricEncoder) -> fmt::Result {
    let Some(a) = &s.snapshot.api else {
        return Ok(());
    };
    gauge(e, "api_subscribers", "Subscribers of the gRPC event stream connected now.", None, a.subscribers)?;
    counter(e, "api_events_published", "Events the agent published to its gRPC event stream.", None, a.published)?;
    counter(
        e,
        "api_events_lost",
        "Events subscribers missed because they read too slowly, summed over subscribers (each was sent LostEvents).",
        None,
        a.lost,
    )?;
    counter(e, "api_subscriptions", "Subscriptions accepted.", None, a.subscriptions)?;
    counter(
        e,
        "api_subscriptions_refused",
        "Subscriptions refused because api.max_subscribers were connected.",
        None,
        a.refused,
    )?;
    let c = &a.connections;
    counter_family(
        e,
        "api_connections_refused",
        "TCP connections the gRPC API closed, by reason (server_limit: its connection limit was reached; \
         peer_limit: that client address held its share; handshake_timeout: no TLS handshake and HTTP/2 preface \
         within the timeout; handshake_failed: a failed TLS handshake or not HTTP/2).",
        None,
        [
            ([("reason", "server_limit")], c.refused_server_limit),
            ([("reason", "peer_limit")], c.refused_peer_limit),
            ([("reason", "handshake_timeout")], c.handshake_timeout),
            ([("reason", "handshake_failed")], c.handshake_failed),
        ],
    )
}

/// `http_connections_refused_total{reason}`: connections the HTTP server closed at accept, by
/// which limit (both reasons, also at 0); `http_unauthorized_requests_total`: scrapes refused for
/// their token. Nothing outside the agent.
pub fn http(s: &Scrape<'_>, e: &mut dyn MetricEncoder) -> fmt::Result {
    let Some(h) = &s.snapshot.http else {
        return Ok(());
    };
    counter_family(
        e,
        "http_connections_refused",
        "Connections the /metrics server closed at accept, by reason (server_limit: max_connections open; \
         peer_limit: that client address already held max_connections_per_peer).",
        None,
        [([("reason", "server_limit")], h.refused_server_limit), ([("reason", "peer_limit")], h.refused_peer_limit)],
    )?;
    counter_family(
        e,
        "http_unauthorized_requests",
        "Scrapes of /metrics answered 401 for want of the bearer token (metrics.token_file): a scraper with a stale \
         or missing token, or someone probing.",
        None,
        [([("endpoint", "/metrics")], h.unauthorized)],
    )
}
