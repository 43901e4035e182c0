//! Section 13: profiling sessions on a running agent (`gpu-tracer profile --connect`): how long
//! until a session records, how soon a launch reaches the client, how long ending takes; beside
//! it, in the same run, a standalone `gpu-tracer profile`, which loads (and unloads) its own
//! probes for every session.
use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use gpu_tracer_proto::v1;
use gpu_tracer_tests::{AgentProcess, FakeDriver, Workload, fake_libcuda, gpu_tracer_binary};
use tracer_client::api::{self, ConnectSettings};

use crate::progress;

/// Sessions on the agent (a third with --quick).
const ROUNDS: usize = 9;
/// Standalone sessions (their start-up takes seconds).
const STANDALONE_ROUNDS: usize = 3;

pub struct Measured {
    /// Per agent session: request → `started`, a launch → its event at the client, `EndProfile` →
    /// `ended`, ms.
    start_ms: Vec<f64>,
    first_event_ms: Vec<f64>,
    end_ms: Vec<f64>,
    /// Per standalone session: the command started → recording, and the window's end → exit, ms.
    standalone_start_ms: Vec<f64>,
    standalone_end_ms: Vec<f64>,
    /// Launch events after a session ended (0: per-event mode was off), and the launches the
    /// kernel's counts reported for them (launch batches; 5 expected).
    events_after_end: u64,
    counted_after_end: u64,
    /// Timed-call probes: per call and configuration, CPU ns per call (median of rounds).
    timed: Vec<TimedRow>,
    /// In the per-event session: call events received, lost, and calls made.
    timed_events: (u64, u64, u64),
}

/// One timed entry point's cost per call under each configuration.
pub struct TimedRow {
    call: &'static str,
    none: f64,
    timed_off: f64,
    count: f64,
    per_event: f64,
}

/// The calls measured: (workload's name, entry point).
const CALLS: [(&str, &str); 2] = [("event-query", "cuEventQuery"), ("stream-sync", "cuStreamSynchronize")];
/// Calls per loop (a tenth with --quick), and loops per configuration.
const LOOP_CALLS: u64 = 20_000;
const LOOPS: usize = 3;

/// The configurations the timed calls are measured under, in order.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TimedConfig {
    None,
    TimedOff,
    Count,
    PerEvent,
}

pub struct SessionSection {
    pub result: Result<Measured, String>,
}

impl SessionSection {
    pub fn skipped(why: &str) -> Self {
        Self { result: Err(why.into()) }
    }
}

pub fn section(quick: bool) -> SessionSection {
    SessionSection { result: measure(quick).map_err(|e| format!("{e:#}")) }
}

/// How long an agent may take to serve its API.
const AGENT_START: Duration = Duration::from_secs(120);

/// `gpu-tracer agent` on `driver` (`extra` before the command), its API on `api`, once it serves
/// it: stopped (SIGTERM) when dropped.
fn start_agent(tracer: &Path, driver: &FakeDriver, extra: &[&std::ffi::OsStr], api: &str) -> Result<AgentProcess> {
    let mut agent = AgentProcess::spawn(
        Command::new(tracer)
            .arg("--dev-dir")
            .arg(driver.dev_dir())
            .args(extra)
            .args([
                "--simulated-devices",
                "agent",
                "--listen",
                "127.0.0.1:0",
                "--duration",
                "900",
                "--grpc-listen",
                api,
            ])
            .stdout(Stdio::null()),
    )
    .context("starting gpu-tracer agent")?
    .patience(AGENT_START);
    agent.grpc_addr().with_context(|| format!("the agent did not serve {api}"))?;
    Ok(agent)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(f64::NAN)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NAN, f64::max)
}

fn measure(quick: bool) -> Result<Measured> {
    let tracer = gpu_tracer_binary().context("gpu-tracer (cargo xtask build)")?;
    let driver = FakeDriver::start(1).context("the fake driver")?;
    let lib = fake_libcuda("thunk");
    let mut w = Workload::builder(driver.dev_dir()).libcuda(&lib).spawn().context("the workload")?;
    w.ok("cuda-init").context("cuda-init")?;
    let dir = tempfile::tempdir()?;
    let sock = dir.path().join("api.sock");
    let api = format!("unix://{}", sock.display());
    let agent = start_agent(&tracer, &driver, &["--libcuda".as_ref(), lib.as_ref()], &api)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let conn =
        ConnectSettings { addr: api.parse().map_err(anyhow::Error::msg)?, token: None, tls_ca: None, tls_domain: None };
    let mut grpc = rt.block_on(api::connect(&conn)).with_context(|| format!("connecting to {api}"))?;
    let rounds = if quick { ROUNDS / 3 } else { ROUNDS };
    let mut m = Measured {
        start_ms: vec![],
        first_event_ms: vec![],
        end_ms: vec![],
        standalone_start_ms: vec![],
        standalone_end_ms: vec![],
        events_after_end: 0,
        counted_after_end: 0,
        timed: vec![],
        timed_events: (0, 0, 0),
    };
    let event = w.ok("cuda-event-create")?.number("event").context("an event handle")?;
    w.ok(&format!("cuda-event-record {event:#x}"))?;
    let n = if quick { LOOP_CALLS / 10 } else { LOOP_CALLS };
    let mut cost: Vec<[Vec<f64>; 4]> = CALLS.iter().map(|_| Default::default()).collect();
    let mut measure_calls = |w: &mut Workload, config: TimedConfig| -> Result<()> {
        for _ in 0..LOOPS {
            for (i, (call, _)) in CALLS.iter().enumerate() {
                let a = w.ok(&format!("cuda-call-loop {call} {n} {event:#x}"))?;
                let ns = a.number("cpu_ns").context("cpu_ns")? as f64 / n as f64;
                cost[i][config as usize].push(ns);
            }
        }
        Ok(())
    };
    progress("13: timed calls without an agent");
    measure_calls(&mut w, TimedConfig::None)?;
    progress("13: timed calls with the agent (cuda_timed_calls off)");
    measure_calls(&mut w, TimedConfig::TimedOff)?;
    let pid = w.pid();
    for round in 0..rounds {
        progress(&format!("13: session {} of {rounds} on the agent", round + 1));
        let t0 = Instant::now();
        let mut stream = rt
            .block_on(grpc.profile(v1::ProfileRequest {
                target: Some(v1::profile_request::Target::Pid(pid)),
                duration_ms: 60_000,
            }))
            .context("Profile")?
            .into_inner();
        let started = match rt.block_on(stream.message())? {
            Some(v1::ProfileResponse { response: Some(v1::profile_response::Response::Started(s)) }) => s,
            other => bail!("no `started`: {other:?}"),
        };
        m.start_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        let t1 = Instant::now();
        w.ok("cuda-launch 1").context("cuda-launch")?;
        loop {
            match rt.block_on(stream.message())? {
                Some(v1::ProfileResponse { response: Some(v1::profile_response::Response::Event(ev)) })
                    if matches!(ev.payload, Some(v1::event::Payload::CudaLaunch(_))) =>
                {
                    break;
                }
                Some(_) => {}
                None => bail!("the stream ended before the launch"),
            }
        }
        m.first_event_ms.push(t1.elapsed().as_secs_f64() * 1e3);
        let t2 = Instant::now();
        rt.block_on(grpc.end_profile(v1::EndProfileRequest { session_id: started.session_id }))
            .context("EndProfile")?;
        loop {
            match rt.block_on(stream.message())? {
                Some(v1::ProfileResponse { response: Some(v1::profile_response::Response::Ended(_)) }) => break,
                Some(_) => {}
                None => bail!("the stream ended without `ended`"),
            }
        }
        m.end_ms.push(t2.elapsed().as_secs_f64() * 1e3);
        // Off after the end: a launch now is counted in the kernel only (a subscriber sees none).
        drop(stream);
    }
    (m.events_after_end, m.counted_after_end) = launches_after_end(&rt, &conn, &mut w)?;
    drop(agent);

    // An agent that probes the timed entry points (entry and return uprobes).
    let config = dir.path().join("timed.toml");
    std::fs::write(&config, "cuda_timed_calls = true\n")?;
    let sock2 = dir.path().join("api-timed.sock");
    let api2 = format!("unix://{}", sock2.display());
    let agent2 = start_agent(
        &tracer,
        &driver,
        &["--config".as_ref(), config.as_ref(), "--libcuda".as_ref(), lib.as_ref()],
        &api2,
    )
    .context("gpu-tracer agent (cuda_timed_calls)")?;
    let conn2 = ConnectSettings {
        addr: api2.parse().map_err(anyhow::Error::msg)?,
        token: None,
        tls_ca: None,
        tls_domain: None,
    };
    progress("13: timed calls with the agent (cuda_timed_calls, count mode)");
    measure_calls(&mut w, TimedConfig::Count)?;
    // A session on the workload, read on a thread of its own while the calls run.
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = {
        let conn2 = conn2.clone();
        std::thread::spawn(move || -> Result<(u64, u64)> {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(async {
                let mut grpc = api::connect(&conn2).await?;
                let mut stream = grpc
                    .profile(v1::ProfileRequest {
                        target: Some(v1::profile_request::Target::Pid(pid)),
                        duration_ms: 600_000,
                    })
                    .await?
                    .into_inner();
                let (mut calls, mut lost) = (0u64, 0u64);
                while let Some(r) = stream.message().await? {
                    match r.response {
                        Some(v1::profile_response::Response::Started(s)) => tx.send(s.session_id)?,
                        Some(v1::profile_response::Response::Event(ev)) => {
                            if matches!(ev.payload, Some(v1::event::Payload::CudaCall(_))) {
                                calls += 1;
                            }
                        }
                        Some(v1::profile_response::Response::LostEvents(l)) => lost += l.count,
                        Some(v1::profile_response::Response::Ended(_)) => break,
                        _ => {}
                    }
                }
                Ok((calls, lost))
            })
        })
    };
    let session = rx.recv_timeout(Duration::from_secs(30)).context("the timed session did not start")?;
    progress("13: timed calls in a profiling session (per-event)");
    measure_calls(&mut w, TimedConfig::PerEvent)?;
    let mut grpc2 = rt.block_on(api::connect(&conn2))?;
    rt.block_on(grpc2.end_profile(v1::EndProfileRequest { session_id: session }))?;
    let (calls, lost) = reader.join().map_err(|_| anyhow::anyhow!("the session reader panicked"))??;
    m.timed_events = (calls, lost, n * (LOOPS * CALLS.len()) as u64);
    drop(agent2);
    m.timed = CALLS
        .iter()
        .zip(&cost)
        .map(|((_, entry), c)| TimedRow {
            call: entry,
            none: median(&c[TimedConfig::None as usize]),
            timed_off: median(&c[TimedConfig::TimedOff as usize]),
            count: median(&c[TimedConfig::Count as usize]),
            per_event: median(&c[TimedConfig::PerEvent as usize]),
        })
        .collect();

    for round in 0..(if quick { 1 } else { STANDALONE_ROUNDS }) {
        progress(&format!("13: standalone session {} of {}", round + 1, if quick { 1 } else { STANDALONE_ROUNDS }));
        let (start, end) = standalone(&tracer, driver.dev_dir(), pid, dir.path())?;
        m.standalone_start_ms.push(start);
        m.standalone_end_ms.push(end);
    }
    Ok(m)
}

/// For 5 launches made after every session ended: the launch events a plain subscriber receives
/// (0 when per-event mode is off), and the launches the kernel's counts report (launch batches).
fn launches_after_end(rt: &tokio::runtime::Runtime, conn: &ConnectSettings, w: &mut Workload) -> Result<(u64, u64)> {
    let mut sub = rt.block_on(api::subscribe_raw(conn, v1::SubscribeRequest { follow: true, ..Default::default() }))?;
    w.ok("cuda-launch 5")?;
    let (mut events, mut counted) = (0, 0);
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    rt.block_on(async {
        while let Ok(Ok(Some(api::Received::Event(e)))) = tokio::time::timeout_at(until, sub.message()).await {
            match e.event().and_then(|ev| ev.payload) {
                Some(v1::event::Payload::CudaLaunch(_)) => events += 1,
                Some(v1::event::Payload::CudaLaunchBatch(b)) => counted += b.launches,
                _ => {}
            }
        }
    });
    Ok((events, counted))
}

/// One standalone `gpu-tracer profile --duration 1`: (started → recording, window end → exit), ms.
fn standalone(tracer: &Path, dev: &Path, pid: u32, dir: &Path) -> Result<(f64, f64)> {
    let out: PathBuf = dir.join("standalone.pftrace");
    let t0 = Instant::now();
    let mut child = AgentProcess::spawn(
        Command::new(tracer)
            .args(["--log", "info", "--dev-dir"])
            .arg(dev)
            .args(["--simulated-devices", "profile", "--pid", &pid.to_string(), "--duration", "1", "-o"])
            .arg(&out)
            .stdout(Stdio::null()),
    )?;
    child.wait_log("recording").context("gpu-tracer profile did not start recording")?;
    let start = t0.elapsed();
    let status = child.wait()?;
    if !status.success() {
        bail!("gpu-tracer profile: {status}");
    }
    let end = t0.elapsed().saturating_sub(start).saturating_sub(Duration::from_secs(1));
    Ok((start.as_secs_f64() * 1e3, end.as_secs_f64() * 1e3))
}

impl SessionSection {
    pub fn render(&self, s: &mut String) {
        let _ = writeln!(s, "## 13. Profiling sessions on a running agent: start and stop\n");
        let _ = writeln!(
            s,
            "**Method.** `gpu-tracer agent` runs with the cuda family on the fake libcuda (`thunk`) and its API on a \
             Unix socket; a fake-libcuda workload is idle between commands. {ROUNDS} sessions are opened through the \
             API as `profile --connect` does (`Profile`, 60 s window) and ended early (`EndProfile`): **start** is \
             the request until `started` (the agent resolved the process, took the lock, drained and sent the \
             window's edge, switched per-event mode on); **first event** is from asking the workload for one \
             `cuLaunchKernel` (its command round trip included) until the launch's event arrives at the client; \
             **end** is `EndProfile` until `ended` (mode off, ring drained, counts sent). Then a plain subscriber \
             checks that launches made after the sessions are not sent one by one. Baseline in the same run: a \
             standalone `gpu-tracer profile --pid … --duration 1` ({STANDALONE_ROUNDS} runs): its start is the \
             command until it logs `recording` (probes loaded and attached), its end is the window's end until \
             it exits (outputs written, probes detached). Goal (issue 12): start-to-first-event and stop < 1 s. \
             Run alone with `cargo xtask bench --only 13`.\n"
        );
        match &self.result {
            Err(e) => {
                let _ = writeln!(s, "Not measured: {e}\n");
            }
            Ok(m) => {
                let _ =
                    writeln!(s, "| session | start (median / max) | first event (median / max) | end (median / max) |");
                let _ = writeln!(s, "|---|---:|---:|---:|");
                let _ = writeln!(
                    s,
                    "| on the agent ({} sessions) | {:.1} / {:.1} ms | {:.1} / {:.1} ms | {:.1} / {:.1} ms |",
                    m.start_ms.len(),
                    median(&m.start_ms),
                    max(&m.start_ms),
                    median(&m.first_event_ms),
                    max(&m.first_event_ms),
                    median(&m.end_ms),
                    max(&m.end_ms)
                );
                let _ = writeln!(
                    s,
                    "| baseline: standalone ({} sessions) | {:.0} / {:.0} ms | — | {:.0} / {:.0} ms |\n",
                    m.standalone_start_ms.len(),
                    median(&m.standalone_start_ms),
                    max(&m.standalone_start_ms),
                    median(&m.standalone_end_ms),
                    max(&m.standalone_end_ms)
                );
                let _ = writeln!(
                    s,
                    "Starting a session on the agent takes {:.3}× the standalone start, ending it {:.3}× the standalone \
                     end (medians). For 5 launches after every session ended, a plain subscriber received {} launch \
                     events (per-event mode off) and launch batches counting {} of them (count mode on). The agent's \
                     latencies are about one pass of its loop (it serves sessions between steps; the ring buffer is \
                     drained at least every 10 ms).\n",
                    median(&m.start_ms) / median(&m.standalone_start_ms),
                    median(&m.end_ms) / median(&m.standalone_end_ms),
                    m.events_after_end,
                    m.counted_after_end
                );
                let _ = writeln!(
                    s,
                    "**Timed calls' probes.** The same workload calls `cuEventQuery` (on a recorded event: it returns at \
                     once) and `cuStreamSynchronize` (nothing queued: it returns at once) {LOOP_CALLS} times per loop, \
                     {LOOPS} loops each, timed on the thread's CPU clock (`cuda-call-loop`): with no agent; with the agent \
                     as it runs by default (`cuda_timed_calls` off: these entry points are not probed); with an agent \
                     that has `cuda_timed_calls = true` (an entry and a return uprobe per call, counted); and with that \
                     agent recording a profiling session of the workload (per-event: each call also timed entry to \
                     return and sent as a record). Median CPU ns per call:\n"
                );
                let _ = writeln!(
                    s,
                    "| call | no agent | agent (timed calls off) | agent, timed calls counted | Δ | in a session (per-event) | Δ | per-event ÷ counted (Δ) |"
                );
                let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|");
                for r in &m.timed {
                    let (dc, dp) = (r.count - r.none, r.per_event - r.none);
                    let _ = writeln!(
                        s,
                        "| `{}` | {:.0} | {:.0} | {:.0} | +{:.0} | {:.0} | +{:.0} | {:.2}× |",
                        r.call,
                        r.none,
                        r.timed_off,
                        r.count,
                        dc,
                        r.per_event,
                        dp,
                        dp / dc
                    );
                }
                let (got, lost, made) = m.timed_events;
                let _ = writeln!(
                    s,
                    "\nIn the session the client received {got} call events and was told of {lost} lost, for {made} calls \
                     made ({}).\n",
                    if got + lost == made { "all accounted for" } else { "NOT all accounted for" }
                );
            }
        }
    }
}
