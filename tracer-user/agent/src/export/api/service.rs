//! `gputracer.v1.GpuTracer`: what the agent answers. Reads only what the agent loop publishes
//! (the [`EventHub`] and the latest snapshot in [`ServeState`]); never touches the pipeline.
use std::{
    collections::VecDeque,
    pin::Pin,
    sync::{Arc, RwLock},
};

use gpu_tracer_proto::{
    EncodedSubscribeResponse,
    tonic::{self, Request, Response, Status},
    v1::{self, gpu_tracer_server::GpuTracer},
};
use tokio_stream::Stream;

use super::accept::ConnCounters;
use super::hub::{EventHub, Published, Received, Subscription};
use super::profiles::{ProfileControl, ProfileStream};
use crate::export::http::ServeState;
use tracer_core::filter::Filters;
use tracer_core::model::probes::ProbeReport;
use tracer_core::wire::snapshot::{snapshot_to_proto, status_to_proto};

/// What the service reads: the agent loop writes it.
#[derive(Debug)]
pub struct ApiState {
    pub hub: Arc<EventHub>,
    /// What the TCP listener refused (`accept`).
    pub connections: Arc<ConnCounters>,
    pub serve: Arc<ServeState>,
    report: RwLock<Arc<ProbeReport>>,
    /// The agent loop's profiling desk (`None`: this agent serves no profiling sessions).
    profiles: Option<ProfileControl>,
}

impl ApiState {
    /// The state of an agent whose probes reported `report`.
    pub fn new(hub: Arc<EventHub>, serve: Arc<ServeState>, report: ProbeReport) -> Self {
        ApiState { hub, connections: Arc::default(), serve, report: RwLock::new(Arc::new(report)), profiles: None }
    }

    /// The hub's counters and the listener's.
    pub fn stats(&self) -> tracer_core::model::ApiStats {
        tracer_core::model::ApiStats { connections: self.connections.read(), ..self.hub.stats() }
    }

    /// Serve `Profile` through the agent loop's desk.
    pub(crate) fn with_profiles(mut self, control: ProfileControl) -> Self {
        self.profiles = Some(control);
        self
    }

    fn profiles(&self) -> Result<&ProfileControl, Status> {
        self.profiles.as_ref().ok_or_else(|| Status::unimplemented("this agent serves no profiling sessions"))
    }

    /// The probe report changed (a libcuda copy probed or detached).
    pub(crate) fn set_report(&self, report: ProbeReport) {
        *self.report.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(report);
    }

    fn report(&self) -> Arc<ProbeReport> {
        self.report.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The service over an [`ApiState`].
#[derive(Debug, Clone)]
pub(crate) struct ApiService {
    state: Arc<ApiState>,
}

impl ApiService {
    pub fn new(state: Arc<ApiState>) -> Self {
        ApiService { state }
    }
}

/// The events of the history a request asks for, oldest first. With `number`, the history is
/// read from the end it keeps (the newest, or the oldest with `first`) and no further than needed,
/// so events beyond are not even checked against the filters.
pub fn replay(hub: &EventHub, history: &[Published], req: &v1::SubscribeRequest, filters: &Filters) -> Vec<Published> {
    if req.follow && req.since_unix_ns == 0 && req.number == 0 {
        return Vec::new();
    }
    let wanted = |p: &&Published| p.key.wall_time_unix_ns >= req.since_unix_ns && hub.matches(p, filters);
    let n = if req.number == 0 { usize::MAX } else { usize::try_from(req.number).unwrap_or(usize::MAX) };
    if req.first || req.number == 0 {
        return history.iter().filter(wanted).take(n).cloned().collect();
    }
    let mut newest: Vec<Published> = history.iter().rev().filter(wanted).take(n).cloned().collect();
    newest.reverse();
    newest
}

fn lost_response(count: u64) -> EncodedSubscribeResponse {
    EncodedSubscribeResponse::new(&v1::SubscribeResponse {
        response: Some(v1::subscribe_response::Response::LostEvents(v1::LostEvents {
            count,
            reason: "subscriber_behind".into(),
        })),
    })
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<EncodedSubscribeResponse, Status>> + Send>>;

/// Events taken out of the hub per wake-up of one subscriber's stream.
const BATCH: usize = 256;

/// One subscriber's stream: the replay, then (with `follow`) the hub's events that match.
struct StreamState {
    sub: Subscription,
    filters: Filters,
    follow: bool,
    /// Responses ready to send, oldest first.
    pending: VecDeque<EncodedSubscribeResponse>,
}

impl StreamState {
    async fn next(mut self) -> Option<(Result<EncodedSubscribeResponse, Status>, Self)> {
        loop {
            if let Some(r) = self.pending.pop_front() {
                return Some((Ok(r), self));
            }
            if !self.follow {
                return None;
            }
            match self.sub.recv(BATCH).await {
                Received::Events(events) => {
                    // Each event's bytes, encoded once when it was published, shared by every subscriber.
                    let (hub, filters) = (self.sub.hub(), &self.filters);
                    self.pending.extend(events.into_iter().filter(|p| hub.matches(p, filters)).map(|p| p.encoded));
                }
                Received::Lost(n) => self.pending.push_back(lost_response(n)),
                Received::Closed => return None,
            }
        }
    }
}

#[tonic::async_trait]
impl GpuTracer for ApiService {
    type SubscribeStream = ResponseStream;

    async fn subscribe(&self, request: Request<v1::SubscribeRequest>) -> Result<Response<ResponseStream>, Status> {
        let req = request.into_inner();
        let filters = Filters::new(&req.include, &req.exclude).map_err(|e| Status::invalid_argument(e.to_string()))?;
        if req.first && req.number == 0 {
            return Err(Status::invalid_argument("`first` needs `number`: how many of the oldest events to send"));
        }
        let mut sub = self.state.hub.subscribe().map_err(|e| Status::resource_exhausted(e.to_string()))?;
        let history = std::mem::take(&mut sub.history);
        let pending = replay(&self.state.hub, &history, &req, &filters).into_iter().map(|p| p.encoded).collect();
        drop(history);
        let state = StreamState { sub, filters, follow: req.follow, pending };
        // Polled by the connection itself: no task, no queue between the hub and the socket.
        // When the client goes away the stream is dropped, and with it the subscription.
        Ok(Response::new(Box::pin(futures::stream::unfold(state, StreamState::next))))
    }

    type ProfileStream = ResponseStream;

    async fn profile(&self, request: Request<v1::ProfileRequest>) -> Result<Response<ResponseStream>, Status> {
        let control = self.state.profiles()?;
        let stream = ProfileStream::open(&self.state.hub, &self.state.serve, control, &request.into_inner()).await?;
        // Dropped with the connection when the client goes: that ends the session.
        Ok(Response::new(Box::pin(futures::stream::unfold(stream, ProfileStream::next))))
    }

    async fn end_profile(
        &self,
        request: Request<v1::EndProfileRequest>,
    ) -> Result<Response<v1::EndProfileResponse>, Status> {
        super::profiles::end(self.state.profiles()?, request.into_inner().session_id)?;
        Ok(Response::new(v1::EndProfileResponse {}))
    }

    async fn get_snapshot(
        &self,
        _request: Request<v1::GetSnapshotRequest>,
    ) -> Result<Response<v1::GetSnapshotResponse>, Status> {
        let (snap, at) = self.state.serve.latest_with_time().ok_or_else(|| {
            Status::unavailable("no snapshot yet: the agent publishes its first one after one interval; retry")
        })?;
        Ok(Response::new(v1::GetSnapshotResponse { snapshot: Some(snapshot_to_proto(&snap, at)) }))
    }

    async fn get_status(
        &self,
        _request: Request<v1::GetStatusRequest>,
    ) -> Result<Response<v1::GetStatusResponse>, Status> {
        let (snap, at) = self.state.serve.latest_with_time().unwrap_or_default();
        let status = status_to_proto(&snap, &self.state.report(), env!("CARGO_PKG_VERSION"), at);
        Ok(Response::new(v1::GetStatusResponse { status: Some(status) }))
    }
}

/// Checks `authorization: Bearer <token>` in constant time (for the token's length).
#[derive(Clone)]
pub(crate) struct BearerToken(Arc<str>);

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(..)")
    }
}

impl BearerToken {
    pub fn new(token: &str) -> Self {
        BearerToken(Arc::from(token))
    }

    /// A tonic interceptor: UNAUTHENTICATED unless the request carries the token.
    pub fn check(&self, req: Request<()>) -> Result<Request<()>, Status> {
        let given = req.metadata().get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
        let given = given.strip_prefix("Bearer ").unwrap_or("");
        // An empty token never matches (fail closed): the settings refuse one, and if one got here
        // anyway it must not let in a request that carries none.
        if !self.0.is_empty() && constant_time_eq(given.as_bytes(), self.0.as_bytes()) {
            Ok(req)
        } else {
            Err(Status::unauthenticated(
                "missing or wrong bearer token (metadata `authorization: Bearer <token>`, the agent's api.token_file)",
            ))
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
