//! A real [`Agent`] running in its own thread (its own current-thread tokio runtime), draining the
//! ring buffer as in production, until told to stop; then drained to quiescence and accounted.
use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow};
use tracer_agent::pipeline::Agent;
use tracer_core::{
    config::Config,
    decode::Event,
    model::{Accounting, EventContext, counters::ProbeCounters, probes::FamilyStatus},
};

use crate::sys;

/// What the agent reported once started.
#[derive(Clone, Debug)]
pub struct Started {
    pub attach_mode: String,
    /// Why the driver family is not attached, if it is not.
    pub driver_problem: Option<String>,
    /// Why the cuda family is not attached, if it is not.
    pub cuda_problem: Option<String>,
}

/// What the agent saw, read after the last drain.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Ioctl events handed to the sink.
    pub ioctl_events: u64,
    pub accounting: Accounting,
    /// The ioctl probe's kernel counters.
    pub ioctl: ProbeCounters,
    /// The libcuda count probe's kernel counters (`cuda_call`).
    pub cuda: ProbeCounters,
    /// `cuLaunchKernel` calls the agent counted (all processes, exited ones included).
    pub cuda_launches: u64,
    pub decode_errors: u64,
    /// CPU time of the agent thread from "started" to the end of the last drain.
    pub cpu_ns: u64,
    pub wall_ns: u64,
    /// `VmRSS` of the process just before the agent was dropped (kB).
    pub rss_end_kb: u64,
    /// `(RssAnon, RssFile, RssShmem)` at the same moment (kB).
    pub rss_end_parts: (u64, u64, u64),
}

/// Work run on the agent's thread, between two steps, with the agent and its sink.
type Job = Box<dyn FnOnce(&mut Agent, &mut dyn FnMut(&Event, &EventContext)) + Send>;

pub struct Running {
    pub started: Started,
    stop: Arc<AtomicBool>,
    join: JoinHandle<Result<Outcome>>,
    jobs: mpsc::Sender<Job>,
    /// Per-event launch records the sink received, per tgid.
    pub launch_events: Arc<Mutex<HashMap<u32, u64>>>,
}

/// Start an agent with `cfg` in a new thread; the sink busy-waits `spin_ns` per event (a slow
/// consumer). Returns once the probes are attached.
pub fn start(cfg: Config, spin_ns: u64) -> Result<Running> {
    let (ready_tx, ready_rx) = mpsc::channel::<Result<Started, String>>();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let (jobs, jobs_rx) = mpsc::channel::<Job>();
    let launch_events: Arc<Mutex<HashMap<u32, u64>>> = Arc::default();
    let launches = launch_events.clone();
    let join = std::thread::Builder::new()
        .name("agent".into())
        .spawn(move || -> Result<Outcome> {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(async move {
                let mut agent = match Agent::start(cfg) {
                    Ok(a) => a,
                    Err(e) => {
                        let msg = format!("{:#}", anyhow::Error::from(e));
                        let _ = ready_tx.send(Err(msg.clone()));
                        return Err(anyhow!(msg));
                    }
                };
                let driver_problem = match &agent.report().driver {
                    FamilyStatus::Attached { .. } => None,
                    FamilyStatus::Disabled => Some("driver family disabled".to_string()),
                    FamilyStatus::Failed { error } | FamilyStatus::NothingToProbe { error } => Some(error.clone()),
                };
                let cuda_problem = match &agent.report().cuda {
                    FamilyStatus::Attached { .. } => None,
                    FamilyStatus::Disabled => Some("cuda family disabled".to_string()),
                    FamilyStatus::Failed { error } | FamilyStatus::NothingToProbe { error } => Some(error.clone()),
                };
                let _ = ready_tx.send(Ok(Started {
                    attach_mode: agent.report().attach_mode.to_string(),
                    driver_problem,
                    cuda_problem,
                }));
                let cpu0 = sys::thread_cpu_ns();
                let t0 = Instant::now();
                let mut ioctl_events = 0u64;
                let mut sink = |ev: &Event, _id: &EventContext| {
                    match ev {
                        Event::Ioctl(_) => ioctl_events += 1,
                        Event::CudaLaunch { header, .. } => {
                            if let Ok(mut m) = launches.lock() {
                                *m.entry(header.tgid).or_default() += 1;
                            }
                        }
                        _ => {}
                    }
                    if spin_ns > 0 {
                        let until = sys::mono_ns() + spin_ns;
                        while sys::mono_ns() < until {
                            std::hint::spin_loop();
                        }
                    }
                };
                while !stop2.load(Ordering::Acquire) {
                    while let Ok(job) = jobs_rx.try_recv() {
                        job(&mut agent, &mut sink);
                    }
                    agent.step(&mut sink).await;
                }
                // Drain until everything emitted has been received (or give up after 3 s).
                let deadline = Instant::now() + Duration::from_secs(3);
                loop {
                    agent.drain(&mut sink);
                    let (_, acc) = agent.accounting();
                    if acc.in_flight <= 0 || Instant::now() > deadline {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                let cpu_ns = sys::thread_cpu_ns() - cpu0;
                let wall_ns = t0.elapsed().as_nanos() as u64;
                let (kc, accounting) = agent.accounting();
                let cuda_launches = agent.snapshot().cuda.calls_by_entry.get("cuLaunchKernel").copied().unwrap_or(0);
                Ok(Outcome {
                    ioctl_events,
                    accounting,
                    ioctl: kc.get("ioctl"),
                    cuda: kc.get(tracer_common::probe::NAMES[tracer_common::probe::CUDA_CALL as usize]),
                    cuda_launches,
                    decode_errors: agent.stats.decode_errors.values().sum(),
                    cpu_ns,
                    wall_ns,
                    rss_end_kb: sys::status_kb("VmRSS").unwrap_or(0),
                    rss_end_parts: sys::rss_parts(),
                })
            })
        })
        .context("spawning the agent thread")?;
    match ready_rx.recv() {
        Ok(Ok(started)) => Ok(Running { started, stop, join, jobs, launch_events }),
        Ok(Err(msg)) => {
            let _ = join.join();
            Err(anyhow!(msg))
        }
        Err(_) => match join.join() {
            Ok(Err(e)) => Err(e),
            _ => Err(anyhow!("the agent thread ended before starting")),
        },
    }
}

impl Running {
    /// Run `f` on the agent's thread (between two steps) and return its result.
    pub fn with_agent<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Agent, &mut dyn FnMut(&Event, &EventContext)) -> R + Send + 'static,
    ) -> Result<R> {
        let (tx, rx) = mpsc::channel();
        self.jobs
            .send(Box::new(move |a, sink| {
                let _ = tx.send(f(a, sink));
            }))
            .map_err(|_| anyhow!("the agent thread has ended"))?;
        rx.recv_timeout(Duration::from_secs(60)).map_err(|_| anyhow!("the agent thread did not answer"))
    }

    /// Stop the agent, drain what is left, and return what it saw.
    pub fn finish(self) -> Result<Outcome> {
        self.stop.store(true, Ordering::Release);
        self.join.join().map_err(|_| anyhow!("the agent thread panicked"))?
    }
}
