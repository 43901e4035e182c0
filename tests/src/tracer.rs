//! The tracer in-process, for root tests: an [`Agent`] on its own tokio runtime, with helpers that
//! wait until every record the kernel emitted has been received and applied.
use std::time::{Duration, Instant};

use tracer_agent::pipeline::Agent;
use tracer_core::{
    config::{Config, Families},
    model::AgentSnapshot,
    state::snapshot::Usage,
};

use crate::{FakeDriver, eventually};

/// A running agent.
pub struct Tracer {
    pub agent: Agent,
    _rt: tokio::runtime::Runtime,
}

/// The configuration the tests use against `driver`: its device directory (trusted as simulated
/// devices), the fake's driver
/// version, and the cuda family off (uprobes on libcuda take seconds to detach; the CUDA tests
/// turn it on with their own libraries).
pub fn config_for(driver: &FakeDriver) -> Config {
    Config {
        dev_dir: driver.dev_dir().to_path_buf(),
        // The fake driver's files are regular files on FUSE, not NVIDIA character devices.
        simulated_devices: true,
        driver_version: Some("535.261.03".into()),
        families: Families { cuda: false, ..Default::default() },
        ..Config::default()
    }
}

impl Tracer {
    /// Load and attach the probes with `cfg` (panics with the reason if that fails).
    pub fn start(cfg: Config) -> Tracer {
        // One worker thread: the agent stays on the test's thread, while the tasks it spawns (the
        // pod watcher, the pod-resources poller) run in the background between test steps.
        let rt =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("tokio runtime");
        let agent = {
            let _g = rt.enter();
            Agent::start(cfg).unwrap_or_else(|e| panic!("agent starts: {e}"))
        };
        Tracer { agent, _rt: rt }
    }

    /// Start the Kubernetes side (pod watcher, pod-resources poller) as the binary does.
    pub fn start_kubernetes(&mut self) {
        let _g = self._rt.enter();
        self._rt.block_on(self.agent.start_kubernetes()).unwrap_or_else(|e| panic!("kubernetes starts: {e}"));
    }

    /// Run a future on the agent's runtime (e.g. `agent.refresh_allocations()`).
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self._rt.block_on(f)
    }

    /// Drain until every record the kernel emitted has been received and applied. Records of a
    /// completed syscall are in the ring buffer before the workload answers, so this is immediate
    /// except for asynchronous events (process exit).
    pub fn settle(&mut self) -> AgentSnapshot {
        let mut last = None;
        let r = eventually("tracer quiescent", Duration::from_secs(10), || {
            self.agent.drain(&mut |_, _| {});
            let s = self.agent.snapshot();
            let done = s.accounting.exact;
            last = Some(s.clone());
            done.then_some(s)
        });
        r.unwrap_or_else(|e| panic!("{e}: accounting {:?}", last.map(|s| s.accounting)))
    }

    /// Settle, then wait until `pred` holds (for asynchronous effects such as a process exit).
    pub fn wait_for(&mut self, what: &str, pred: impl Fn(&AgentSnapshot) -> bool) -> AgentSnapshot {
        let start = Instant::now();
        loop {
            let s = self.settle();
            if pred(&s) {
                return s;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "timed out waiting for {what}: {:#?}", s.state.totals);
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

/// A cgroup's usage in a snapshot (zero when the cgroup has no row).
pub fn cg_usage(s: &AgentSnapshot, id: u64) -> Usage {
    s.state.cgroups.iter().find(|c| c.cgroup_id == id).map(|c| c.usage).unwrap_or_default()
}

/// The accounting identity, per probe and in total, with nothing lost and nothing undecodable:
/// what a root test on a quiet machine expects after every step.
pub fn assert_accounting(s: &AgentSnapshot) {
    let a = &s.accounting;
    assert!(a.exact, "seen {} != received {} + dropped {} ({:?})", a.seen, a.received, a.dropped, s.kernel);
    for (name, c) in &s.kernel.probes {
        assert_eq!(c.seen, c.emitted + c.aggregated + c.dropped(), "probe {name}: {c:?}");
    }
    assert_eq!(a.dropped, 0, "nothing should be dropped at this rate: {:?}", s.kernel);
    assert!(s.pipeline.decode_errors.is_empty(), "decode errors: {:?}", s.pipeline.decode_errors);
}
