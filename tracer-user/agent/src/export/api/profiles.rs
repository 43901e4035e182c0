//! `Profile`'s API side (`gpu-tracer profile --connect`): [`ProfileStream`] subscribes to the hub,
//! asks the agent loop to start the session through a [`ProfileControl`], streams the workload's
//! events, asks the loop to end it when the window is over (or when the client goes: dropping the
//! stream ends the session too), then sends what is left and `ended`. The loop's side is
//! `crate::profile::desk`.
use std::{
    collections::{BTreeSet, VecDeque},
    time::Duration,
};

use gpu_tracer_proto::{EncodedSubscribeResponse, prost::Message, tonic::Status, v1};
use tokio::sync::{mpsc, oneshot};
use tracer_core::profile::TargetSpec;

use super::hub::{EventHub, Received, Subscription};

/// The longest session the agent serves.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(3600);

/// What the API side asks of the agent loop.
#[derive(Debug)]
pub enum Control {
    /// Start a session on `spec` for `duration`; the answer says what it resolved to.
    Start { spec: TargetSpec, duration: Duration, reply: oneshot::Sender<Result<Started, Status>> },
    /// End session `id` (the window is over, the client ended it, or its stream was dropped).
    End { id: u64, reason: &'static str },
}

/// A session the agent loop started.
#[derive(Debug)]
pub struct Started {
    pub id: u64,
    pub message: v1::ProfileStarted,
    /// Events published up to this hub number came before the window.
    pub before_seq: u64,
    /// The cgroups the workload's events carry (empty: any).
    pub event_cgroups: BTreeSet<u64>,
    /// Fires once the session has ended in the agent loop.
    pub ended: oneshot::Receiver<Ended>,
}

/// A session the agent loop ended: every event of the window is in the hub up to `last_seq`.
#[derive(Debug)]
pub struct Ended {
    pub message: v1::ProfileEnded,
    pub last_seq: u64,
}

/// The API side's handle on the agent loop.
#[derive(Clone, Debug)]
pub struct ProfileControl(mpsc::UnboundedSender<Control>);

impl ProfileControl {
    /// A handle and the receiving end the agent loop polls ([`ProfileDesk`](crate::profile::desk::ProfileDesk)).
    pub(crate) fn channel() -> (ProfileControl, mpsc::UnboundedReceiver<Control>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (ProfileControl(tx), rx)
    }

    fn send(&self, c: Control) -> Result<(), Status> {
        self.0.send(c).map_err(|_| Status::unavailable("the agent is stopping"))
    }
}

/// A `ProfileRequest` as a target and a window, or why not.
pub(crate) fn request_to_spec(req: &v1::ProfileRequest) -> Result<(TargetSpec, Duration), Status> {
    use v1::profile_request::Target as T;
    let spec = match &req.target {
        Some(T::Pid(p)) if *p > 0 => TargetSpec::Pid(*p),
        Some(T::Cgroup(c)) if !c.is_empty() => TargetSpec::Cgroup(c.clone()),
        Some(T::Pod(p)) => TargetSpec::pod(&format!("{}/{}", p.namespace, p.name), Some(&p.container))
            .map_err(Status::invalid_argument)?,
        _ => return Err(Status::invalid_argument("no target: give a pid, a cgroup or a pod")),
    };
    let duration = Duration::from_millis(req.duration_ms);
    if duration.is_zero() || duration > MAX_DURATION {
        return Err(Status::invalid_argument(format!(
            "duration_ms {}: give 1..={}",
            req.duration_ms,
            MAX_DURATION.as_millis()
        )));
    }
    Ok((spec, duration))
}

fn response(r: v1::profile_response::Response) -> EncodedSubscribeResponse {
    EncodedSubscribeResponse(v1::ProfileResponse { response: Some(r) }.encode_to_vec().into())
}

/// Ends the session in the agent loop when the stream is dropped before its end (the client
/// went away: Ctrl-C, SIGKILL, a network failure).
struct EndOnDrop {
    control: ProfileControl,
    id: u64,
    armed: bool,
}

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.control.send(Control::End { id: self.id, reason: "client" });
        }
    }
}

enum Phase {
    Recording { deadline: tokio::time::Instant, ended: oneshot::Receiver<Ended> },
    Ending { last_seq: u64, message: Option<v1::ProfileEnded> },
    Done,
}

/// Events taken out of the hub per wake-up.
const BATCH: usize = 256;

/// How often a session's stream looks for a new NVML sample in the agent's latest snapshot.
const NVML_CHECK: Duration = Duration::from_millis(250);

/// One session's response stream.
pub(crate) struct ProfileStream {
    sub: Subscription,
    /// The agent's latest snapshot: its NVML sample goes to the session when new.
    serve: std::sync::Arc<crate::export::http::ServeState>,
    nvml_sent: u64,
    nvml_tick: tokio::time::Interval,
    before_seq: u64,
    event_cgroups: BTreeSet<u64>,
    pending: VecDeque<EncodedSubscribeResponse>,
    phase: Phase,
    guard: EndOnDrop,
}

impl ProfileStream {
    /// Subscribe, start the session in the agent loop, and return its stream (the first message
    /// is `started`).
    pub async fn open(
        hub: &std::sync::Arc<EventHub>,
        serve: &std::sync::Arc<crate::export::http::ServeState>,
        control: &ProfileControl,
        req: &v1::ProfileRequest,
    ) -> Result<ProfileStream, Status> {
        let (spec, duration) = request_to_spec(req)?;
        // Subscribed first: nothing the window publishes can be missed.
        let mut sub = hub.subscribe().map_err(|e| Status::resource_exhausted(e.to_string()))?;
        sub.history.clear();
        let (tx, rx) = oneshot::channel();
        control.send(Control::Start { spec, duration, reply: tx })?;
        let started = rx.await.map_err(|_| Status::unavailable("the agent is stopping"))??;
        let guard = EndOnDrop { control: control.clone(), id: started.id, armed: true };
        let mut pending = VecDeque::new();
        pending.push_back(response(v1::profile_response::Response::Started(started.message)));
        let mut nvml_tick = tokio::time::interval(NVML_CHECK);
        nvml_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Ok(ProfileStream {
            sub,
            serve: serve.clone(),
            nvml_sent: 0,
            nvml_tick,
            before_seq: started.before_seq,
            event_cgroups: started.event_cgroups,
            pending,
            phase: Phase::Recording { deadline: tokio::time::Instant::now() + duration, ended: started.ended },
            guard,
        })
    }

    /// The agent's newest NVML sample, if not sent yet.
    fn nvml(&mut self) {
        let Some(sample) = self.serve.latest().and_then(|s| s.nvml.sample.clone()) else { return };
        if sample.taken_mono_ns > self.nvml_sent {
            self.nvml_sent = sample.taken_mono_ns;
            let gpus = tracer_core::profile::gpus::gpu_samples(&sample);
            self.pending.push_back(response(v1::profile_response::Response::Nvml(v1::NvmlSamples { gpus })));
        }
    }

    fn take(&mut self, r: Received) {
        match r {
            Received::Events(events) => {
                for p in events {
                    if p.seq > self.before_seq
                        && (self.event_cgroups.is_empty() || self.event_cgroups.contains(&p.key.cgroup_id))
                    {
                        self.pending.push_back(p.encoded);
                    }
                }
            }
            Received::Lost(n) => {
                self.pending.push_back(response(v1::profile_response::Response::LostEvents(v1::LostEvents {
                    count: n,
                    reason: "subscriber_behind".into(),
                })))
            }
            Received::Closed => {
                // The agent is stopping: no `ended` (the client says so).
                self.guard.armed = false;
                self.phase = Phase::Done;
            }
        }
    }

    /// The next response, or `None` at the end.
    pub async fn next(mut self) -> Option<(Result<EncodedSubscribeResponse, Status>, Self)> {
        loop {
            if let Some(r) = self.pending.pop_front() {
                return Some((Ok(r), self));
            }
            match &mut self.phase {
                Phase::Done => return None,
                Phase::Ending { last_seq, message } => {
                    if self.sub.cursor() > *last_seq {
                        let m = message.take();
                        self.nvml();
                        if let Some(m) = m {
                            self.pending.push_back(response(v1::profile_response::Response::Ended(m)));
                        }
                        self.phase = Phase::Done;
                        continue;
                    }
                    let r = self.sub.recv(BATCH).await;
                    self.take(r);
                }
                Phase::Recording { deadline, ended } => {
                    let deadline = *deadline;
                    tokio::select! {
                        r = self.sub.recv(BATCH) => self.take(r),
                        _ = self.nvml_tick.tick() => self.nvml(),
                        e = ended => {
                            self.guard.armed = false;
                            match e {
                                Ok(e) => self.phase = Phase::Ending { last_seq: e.last_seq, message: Some(e.message) },
                                Err(_) => self.phase = Phase::Done,
                            }
                        }
                        _ = tokio::time::sleep_until(deadline) => {
                            // Asked once; the `ended` answer moves the phase on.
                            if self.guard.control.send(Control::End { id: self.guard.id, reason: "duration" }).is_err() {
                                self.guard.armed = false;
                                self.phase = Phase::Done;
                            } else if let Phase::Recording { deadline, .. } = &mut self.phase {
                                *deadline += Duration::from_secs(3600);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `EndProfile`: end session `id` now (its stream then sends what is left and `ended`).
pub fn end(control: &ProfileControl, id: u64) -> Result<(), Status> {
    control.send(Control::End { id, reason: "client" })
}
