//! `Profile`: a profiling session served by the agent (`gpu-tracer profile --connect`), on the
//! agent's own probes.
//!
//! Two halves meet through a channel of `Control` messages: the API side
//! (`crate::export::api::profiles`) and the agent loop's side here ([`ProfileDesk`], polled every
//! step): it resolves the target, takes the session lock (the same files a standalone `profile`
//! takes, so the two exclude each other), and keeps the kernel's per-event selections the union
//! of the live sessions, each with its deadline.
use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use gpu_tracer_proto::{tonic::Status, v1};
use tokio::sync::{mpsc, oneshot};

use crate::export::api::{
    hub::EventHub,
    profiles::{Control, Ended, ProfileControl, Started},
};
use crate::{
    pipeline::{Agent, PerEventSelection, deadline_after},
    profile::{
        session::{DEADLINE_GRACE, SessionLock},
        target::{self, ResolveError},
    },
};
use tracer_core::profile::TargetSpec;

/// One live session in the agent loop.
struct Active {
    selections: Vec<PerEventSelection>,
    until: u64,
    _locks: Vec<SessionLock>,
    dropped_before: u64,
    ended: oneshot::Sender<Ended>,
}

/// The agent loop's side: the live sessions and the requests to serve.
pub(crate) struct ProfileDesk {
    rx: mpsc::UnboundedReceiver<Control>,
    sessions: BTreeMap<u64, Active>,
    next_id: u64,
    lock_dir: PathBuf,
    timed_calls: bool,
}

impl ProfileDesk {
    /// The desk and the handle the API side sends to it; sessions lock in `lock_dir`.
    /// `timed_calls`: the agent probes the synchronisation, copy and memset entry points.
    pub fn new(lock_dir: PathBuf, timed_calls: bool) -> (ProfileDesk, ProfileControl) {
        let (control, rx) = ProfileControl::channel();
        (ProfileDesk { rx, sessions: BTreeMap::new(), next_id: 1, lock_dir, timed_calls }, control)
    }

    /// Serve what the API side asked since the last call (cheap when nothing was: one channel
    /// poll), and end the sessions past their deadline. `flush` drains the ring buffer and sends
    /// the launch counts into the hub (so the window's edges are exact); it returns nothing.
    pub fn serve(&mut self, agent: &mut Agent, hub: &EventHub, flush: &mut dyn FnMut(&mut Agent)) {
        let now = tracer_core::clock::monotonic_ns();
        let expired: Vec<u64> = self.sessions.iter().filter(|(_, a)| a.until <= now).map(|(id, _)| *id).collect();
        for id in expired {
            self.end(agent, hub, flush, id, "duration");
        }
        while let Ok(c) = self.rx.try_recv() {
            match c {
                Control::Start { spec, duration, reply } => {
                    let r = self.start(agent, hub, flush, &spec, duration);
                    if let Ok(s) = &r {
                        tracing::info!(session = s.id, target = %s.message.description, duration_s = duration.as_secs_f64(), "profile session started");
                    }
                    if let Err(Ok(s)) = reply.send(r) {
                        // The client went away meanwhile.
                        self.end(agent, hub, flush, s.id, "client");
                    }
                }
                Control::End { id, reason } => self.end(agent, hub, flush, id, reason),
            }
        }
    }

    fn start(
        &mut self,
        agent: &mut Agent,
        hub: &EventHub,
        flush: &mut dyn FnMut(&mut Agent),
        spec: &TargetSpec,
        duration: Duration,
    ) -> Result<Started, Status> {
        if agent.report().cuda.error().is_some() || agent.report().cuda_libraries.is_empty() {
            return Err(Status::failed_precondition(
                "the agent's cuda probe family is not attached (families.cuda off, or no libcuda.so.1 found): it \
                 cannot record launches; see `gpu-tracer api get-status`",
            ));
        }
        let r = target::resolve(agent, spec).map_err(|e| match e {
            ResolveError::NotFound(m) => Status::not_found(m),
            ResolveError::Precondition(m) => Status::failed_precondition(m),
        })?;
        let locks =
            SessionLock::take(&self.lock_dir, &r.locks).map_err(|e| Status::already_exists(format!("{e:#}")))?;
        // What was counted before the window goes out now, numbered before it.
        flush(agent);
        hub.flush();
        let before_seq = hub.newest_seq();
        // Everything before the window is in the ledgers now (flushed above).
        let held_at_start = agent.held_memory(&r.tgids, &r.cgroups);
        let start = tracer_core::clock::monotonic_ns();
        let until = deadline_after(duration + DEADLINE_GRACE);
        let selections: Vec<PerEventSelection> =
            PerEventSelection::all(&r.cgroups, &r.tgids, until).into_iter().map(|(s, _)| s).collect();
        let id = self.next_id;
        self.next_id += 1;
        let (ended_tx, ended_rx) = oneshot::channel();
        self.sessions.insert(
            id,
            Active { selections, until, _locks: locks, dropped_before: agent.accounting().1.dropped, ended: ended_tx },
        );
        if let Err(e) = self.apply(agent) {
            self.sessions.remove(&id);
            let _ = self.apply(agent);
            return Err(Status::internal(format!("switching per-event mode on: {e}")));
        }
        Ok(Started {
            id,
            message: v1::ProfileStarted {
                cgroup_ids: r.cgroups.clone(),
                pids: r.tgids.clone(),
                description: r.description,
                start_ktime_ns: start,
                deadline_ktime_ns: until,
                timed_calls: self.timed_calls,
                session_id: id,
                held_at_start,
            },
            before_seq,
            event_cgroups: r.event_cgroups,
            ended: ended_rx,
        })
    }

    fn end(
        &mut self,
        agent: &mut Agent,
        hub: &EventHub,
        flush: &mut dyn FnMut(&mut Agent),
        id: u64,
        reason: &'static str,
    ) {
        let Some(a) = self.sessions.remove(&id) else { return };
        if let Err(e) = self.apply(agent) {
            // The deadline in the kernel still ends it.
            tracing::warn!(session = id, error = %e, "switching per-event mode off failed; the kernel's deadline ends it");
        }
        let end = tracer_core::clock::monotonic_ns();
        flush(agent);
        hub.flush();
        let dropped = agent.accounting().1.dropped.saturating_sub(a.dropped_before);
        tracing::info!(session = id, reason, "profile session ended");
        let _ = a.ended.send(Ended {
            message: v1::ProfileEnded { reason: reason.to_string(), end_ktime_ns: end, tracer_dropped: dropped },
            last_seq: hub.newest_seq(),
        });
    }

    /// The kernel's selections: those of the live sessions.
    fn apply(&self, agent: &mut Agent) -> Result<(), aya::maps::MapError> {
        agent.set_per_event_until(&union(self.sessions.values().map(|a| (a.selections.as_slice(), a.until))))
    }
}

/// The union of sessions' selections (each with its deadline): every selection once, with the
/// latest deadline of the sessions that have it.
pub fn union<'a>(sessions: impl IntoIterator<Item = (&'a [PerEventSelection], u64)>) -> Vec<(PerEventSelection, u64)> {
    let mut until: BTreeMap<PerEventSelection, u64> = BTreeMap::new();
    for (selections, deadline) in sessions {
        for s in selections {
            let u = until.entry(*s).or_insert(0);
            *u = (*u).max(deadline);
        }
    }
    until.into_iter().collect()
}
