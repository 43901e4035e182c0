//! `profile --connect`: a session recorded by a running agent on its own probes (no second set
//! is attached here). The agent resolves the target, switches per-event mode on with a deadline,
//! and streams the workload's events; this side records them exactly as a standalone session
//! does and writes the same outputs.
use crate::api;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use gpu_tracer_proto::{tonic::Code, v1};

use super::output::{Options, Outcome, Shown, create_output, write_outputs};
use crate::api::ConnectSettings;
use tracer_core::profile::{HeldAtStart, Recorder, Target, TargetSpec};

/// How long the agent may take to send the end of a session once asked (the rest of the window
/// is already in its hub).
const END_TIMEOUT: Duration = Duration::from_secs(10);

fn request(target: &TargetSpec, duration: Duration) -> v1::ProfileRequest {
    use v1::profile_request::Target as T;
    let target = match target {
        TargetSpec::Pid(p) => T::Pid(*p),
        TargetSpec::Cgroup(c) => T::Cgroup(c.clone()),
        TargetSpec::Pod { namespace, name, container } => T::Pod(v1::PodRef {
            namespace: namespace.clone(),
            name: name.clone(),
            container: container.clone().unwrap_or_default(),
        }),
    };
    v1::ProfileRequest { target: Some(target), duration_ms: duration.as_millis().min(u64::MAX as u128) as u64 }
}

/// Record a session served by the agent at `conn`.
pub async fn run(conn: &ConnectSettings, opts: Options) -> Result<Outcome> {
    let file = create_output(&opts)?;
    let mut grpc = api::connect(conn).await?;
    let mut stream = match grpc.profile(request(&opts.target, opts.duration)).await {
        Ok(s) => s.into_inner(),
        Err(s) => {
            let hint = match s.code() {
                Code::Unimplemented => " (the agent is older than profile --connect: run profile on the node instead)",
                _ => "",
            };
            bail!(
                "the agent at {} refused the session on {}: {}{hint}",
                conn.addr,
                opts.target.describe(),
                s.message()
            );
        }
    };
    let started =
        match stream.message().await.with_context(|| format!("the agent's session stream at {}", conn.addr))? {
            Some(v1::ProfileResponse { response: Some(v1::profile_response::Response::Started(s)) }) => s,
            other => bail!("the agent at {} did not start the session (first message: {other:?})", conn.addr),
        };
    let target = match (started.pids.first(), started.cgroup_ids.is_empty()) {
        (Some(p), true) => Target::Pid(*p),
        _ => Target::Cgroups(started.cgroup_ids.iter().copied().collect()),
    };
    tracing::info!(target = %started.description, agent = %conn.addr, duration_s = opts.duration.as_secs_f64(), "recording");
    let mut recorder = Recorder::new(target.clone(), opts.limits, started.start_ktime_ns);
    let mut shown = Shown::new(&opts);
    let mut lost = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    // Why this side asked the agent to end early, if it did.
    let mut asked: Option<&'static str> = None;
    let mut end_by: Option<tokio::time::Instant> = None;
    let ended = loop {
        let until_end = async {
            match end_by {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        let mut stop = None;
        tokio::select! {
            m = stream.message() => {
                match m.with_context(|| format!("the agent's session stream at {}", conn.addr))? {
                    Some(v1::ProfileResponse { response: Some(r) }) => match r {
                        v1::profile_response::Response::Event(ev) => recorder.event(&ev),
                        v1::profile_response::Response::LostEvents(l) => lost += l.count,
                        v1::profile_response::Response::Ended(e) => break Some(e),
                        v1::profile_response::Response::Nvml(n) => recorder.nvml(&n.gpus),
                        v1::profile_response::Response::Started(_) => {}
                    },
                    Some(_) => {}
                    // The agent stopped before the end.
                    None => break None,
                }
            }
            _ = tick.tick() => {
                shown.show(recorder.recording(), None);
                if recorder.target_exited() {
                    stop = Some("workload exited");
                } else if recorder.limit_reached() {
                    stop = Some("event limit");
                }
            }
            _ = tracer_core::stop::wait(), if asked.is_none() => stop = Some("signal"),
            _ = until_end => bail!("the agent at {} did not end the session within {END_TIMEOUT:?} of being asked", conn.addr),
        }
        if let (Some(why), None) = (stop, asked) {
            asked = Some(why);
            end_by = Some(tokio::time::Instant::now() + END_TIMEOUT);
            grpc.end_profile(v1::EndProfileRequest { session_id: started.session_id })
                .await
                .with_context(|| format!("asking the agent at {} to end the session", conn.addr))?;
        }
    };
    shown.finish();
    let (end, reason, dropped) = match &ended {
        Some(e) => (e.end_ktime_ns, asked.unwrap_or("duration"), e.tracer_dropped),
        None => (recorder.recording().end_ktime_ns, "agent stopped", 0),
    };
    let mut rec = recorder.finish(end, reason, dropped);
    rec.source = format!("agent {}", conn.addr);
    rec.workload = started.description.clone();
    rec.held_at_start = Some(
        started
            .held_at_start
            .iter()
            .map(|h| (h.pid, HeldAtStart { driver_bytes: h.driver_bytes, cuda_bytes: h.cuda_bytes }))
            .collect(),
    );
    if ended.is_none() {
        rec.notes.push("the agent stopped before the window's end: the recording ends at its last event, and the tracer's drops are not known".into());
    }
    if lost > 0 {
        rec.notes.push(format!("{lost} events were lost between the agent and this client (it read too slowly)"));
        rec.tracer_dropped += lost;
    }
    if !started.timed_calls {
        rec.notes.push(
            "the agent does not probe synchronisation, copy and memset calls (its cuda_timed_calls is off): \
             launches and memory calls only; set cuda_timed_calls: true in the agent's config for them"
                .into(),
        );
    }
    write_outputs(&rec, &target, &opts, file)
}
