//! Churn (issue 13, "keep them fixed"): pod cgroups created and removed in a loop while GPU
//! workloads start in them, allocate and exit. Real cgroup v2 directories named like Kubernetes
//! pods' containers, real processes, the real eBPF probes (driver, lifecycle and cuda families, the
//! last on the fake libcuda), the fake NVIDIA driver over FUSE. Needs root; fails (never skips)
//! without it.
//!
//! * [`cgroup_churn_leaves_no_rows_and_names_every_pod`]: the pipeline in this process. Every pod
//!   is named by its path while it lives; once its processes have exited and its directory is gone,
//!   nothing of it stays: no ledger row, no process, no byte, no kernel map entry, and this
//!   process's RSS does not grow.
//! * [`the_agent_binary_holds_steady_under_churn`]: the `gpu-tracer agent` binary on a simulated
//!   node (fake driver, NVML following it, an API server and a kubelet pod-resources socket that
//!   list the churned pods) for `GPU_TRACER_SOAK_SECONDS` (default 15 s), sampled every
//!   `GPU_TRACER_SOAK_SAMPLE_SECONDS`: its RSS, fds, table sizes from `/metrics` and the occupancy
//!   of its kernel maps, printed as `soak-sample:` lines. `cargo xtask reliability` runs it for
//!   longer (the "one-hour soak" row) and fits a slope to each series; the test itself checks that
//!   once the churn stops everything is back to where it was before it started.
//!
//! Both print their figures as `reliability: key=value` lines.
use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    path::PathBuf,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use gpu_tracer_tests::http::get as http_get;
use gpu_tracer_tests::{
    AgentProcess, FakeDriver, PodCgroup, Qos, Runtime, Tracer, Workload, config_for, eventually, fake_libcuda,
    gpu_tracer, require_root,
};
use tracer_core::model::AgentSnapshot;

/// The probes are global kernel objects and the machine is small: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    require_root();
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The kernel maps user space keeps in step with the processes it tracks: their occupancy must come
/// back to where it was once the churned processes are gone. (`UVM_MAPS` is checked on its own, as
/// a count that must not grow: the kernel removes an entry at its `munmap`, user space those of a
/// process that exits with a managed mapping.)
const CLEANED_MAPS: &[&str] = &["CUDA_COUNTS", "CUDA_INFLIGHT", "INFLIGHT", "LOST_RECORDS", "NV_FDS", "TRACKED_TGIDS"];

/// How a churned pod's process ends.
#[derive(Clone, Copy, Debug)]
enum Ending {
    /// `free-client`, then end of input: a clean exit holding nothing.
    FreeThenExit,
    /// `exit(0)` holding everything: the kernel closes the fds.
    ExitHolding,
    /// SIGKILL holding everything.
    Killed,
    /// Every device fd closed without a free (the driver releases the client), then end of input.
    CloseAll,
}

impl Ending {
    fn of(i: usize) -> Ending {
        [Ending::FreeThenExit, Ending::ExitHolding, Ending::Killed, Ending::CloseAll][i % 4]
    }

    /// End `w` this way and wait for it.
    fn end(self, mut w: Workload) {
        match self {
            Ending::FreeThenExit => {
                ok(&mut w, "free-client");
                w.finish().expect("the workload exits");
            }
            Ending::ExitHolding => {
                ok(&mut w, "exit");
                w.wait().expect("the workload exits");
            }
            Ending::Killed => drop(w),
            Ending::CloseAll => {
                ok(&mut w, "close-all");
                w.finish().expect("the workload exits");
            }
        }
    }
}

fn ok(w: &mut Workload, cmd: &str) -> gpu_tracer_tests::Answer {
    w.ok(cmd).unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

/// A pod's cgroup: QoS class and runtime vary with `i`, so every naming scheme churns.
fn pod_cgroup(i: usize) -> PodCgroup {
    let qos = [Qos::Burstable, Qos::Guaranteed, Qos::BestEffort][i % 3];
    let runtime = [Runtime::Containerd, Runtime::CriO, Runtime::Docker][(i / 3) % 3];
    PodCgroup::create(qos, runtime).unwrap_or_else(|e| panic!("pod cgroup {i}: {e}"))
}

/// A workload in `cg` with the fake libcuda loaded, on GPU `gpu`, that has allocated through the
/// driver (RM_ALLOC, VID_HEAP, sometimes a managed mapping) and through libcuda, and launched.
fn busy_workload(driver: &FakeDriver, cg: &PodCgroup, lib: &std::path::Path, gpu: u32, i: usize) -> Workload {
    let mut w = Workload::builder(driver.dev_dir()).cgroup(cg).libcuda(lib).spawn().expect("spawn nv-workload");
    ok(&mut w, &format!("init {gpu}"));
    ok(&mut w, "alloc-rm 64M");
    ok(&mut w, "alloc-vidheap 16M");
    if i.is_multiple_of(3) {
        ok(&mut w, "managed-mmap 8M");
    }
    ok(&mut w, "cuda-init");
    ok(&mut w, "cuda-launch 25");
    ok(&mut w, "cuda-alloc 4M");
    w
}

/// A churned pod: its cgroup, its processes, how they end.
struct Pod {
    cg: PodCgroup,
    workloads: Vec<Workload>,
    ending: Ending,
}

impl Pod {
    /// Its processes end, then its directory goes (leaf and pod slice).
    fn retire(self) -> u64 {
        let id = self.cg.id();
        for w in self.workloads {
            self.ending.end(w);
        }
        drop(self.cg);
        id
    }
}

/// This process's (or `pid`'s) resident set, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// What must be back where it was once churned pods are gone.
#[derive(Debug, PartialEq, Eq)]
struct Footprint {
    cgroups: BTreeSet<u64>,
    processes: BTreeSet<u32>,
    cuda_processes: BTreeSet<u32>,
    maps: BTreeMap<String, u64>,
}

impl Footprint {
    fn of(s: &AgentSnapshot) -> Footprint {
        let occupancy = bpf_maps::occupancy(std::process::id());
        Footprint {
            cgroups: s.state.cgroups.iter().map(|c| c.cgroup_id).collect(),
            processes: s.state.processes.iter().map(|p| p.tgid).collect(),
            cuda_processes: s.cuda.processes.iter().map(|p| p.tgid).collect(),
            maps: CLEANED_MAPS.iter().map(|m| (m.to_string(), occupancy.get(*m).copied().unwrap_or(0))).collect(),
        }
    }
}

/// Pods created and removed in a loop (a window of [`WINDOW`] alive at once), in batches; the
/// pipeline runs in this process.
///
/// Each pod gets one workload (every fifth pod two) that opens a GPU, allocates through the driver
/// and through libcuda, launches, then ends one of four ways ([`Ending`]); its cgroup is removed
/// right after, while the next pods start. While it lives, every pod's ledger row and CUDA row are
/// named by its path (never `id:N`) and its identity carries its pod UID. After each batch every
/// removed pod's rows are gone and the tables are back to the baseline (the cgroups and processes
/// live before the churn); at the end, the bytes are back to 0 with as many frees as allocations,
/// the kernel maps user space cleans are back to their baseline occupancy, nothing was lost, no
/// CUDA row, `UVM_MAPS` entry or /metrics series of a removed pod is left, and this process's RSS
/// after the warm-up batch has not grown by more than `RSS_GROWTH_MAX_KIB`.
#[test]
fn cgroup_churn_leaves_no_rows_and_names_every_pod() {
    /// Pods alive at once.
    const WINDOW: usize = 6;
    /// Batches, the first a warm-up (tables and allocator reach their working size).
    const BATCHES: usize = 4;
    const PODS_PER_BATCH: usize = 100;
    /// The most this process's RSS may grow after the warm-up batch. Nothing of a removed pod may
    /// be kept, so what is left is allocator noise (under 100 KiB here); a leak of 10 KiB per pod
    /// would be 3 MiB over the 300 pods measured.
    const RSS_GROWTH_MAX_KIB: u64 = 3 * 1024;

    let _s = serial();
    let started = Instant::now();
    let lib = fake_libcuda("thunk");
    let driver = FakeDriver::start(2).unwrap();
    let mut cfg = config_for(&driver);
    cfg.families.cuda = true;
    cfg.cuda_libraries = vec![lib.clone()];
    let mut t = Tracer::start(cfg);
    let me = std::process::id();
    let s0 = t.settle();
    let base = Footprint::of(&s0);
    let base_containers = s0.containers.len();
    let (allocs0, frees0) = (s0.state.counters.allocations, s0.state.counters.frees);
    let rss_start = rss_kib(me);
    let uvm_before = bpf_maps::occupancy(me).get("UVM_MAPS").copied().unwrap_or(0);

    let mut named = 0usize;
    let mut pods = 0usize;
    let mut workloads = 0usize;
    let mut removed: BTreeSet<u64> = BTreeSet::new();
    let mut removed_paths: BTreeSet<String> = BTreeSet::new();
    let mut rss_before = 0;
    let mut batch_rss = Vec::new();
    // The most entries each cleaned map held while pods lived: proof that the reading sees them.
    let mut peak: BTreeMap<String, u64> = BTreeMap::new();
    for batch in 0..BATCHES {
        let mut live: VecDeque<Pod> = VecDeque::new();
        for j in 0..PODS_PER_BATCH {
            let i = batch * PODS_PER_BATCH + j;
            let cg = pod_cgroup(i);
            let mut ws = vec![busy_workload(&driver, &cg, &lib, (i % 2) as u32, i)];
            if i.is_multiple_of(5) {
                ws.push(busy_workload(&driver, &cg, &lib, ((i + 1) % 2) as u32, i + 1));
            }
            workloads += ws.len();
            pods += 1;
            // Named while it lives: the ledger's row, the CUDA row and the identity.
            let s = t.settle();
            let row = s.state.cgroups.iter().find(|c| c.cgroup_id == cg.id());
            let cuda_row = s.cuda.cgroups.iter().find(|c| c.cgroup_id == cg.id());
            let ident = s.containers.get(&cg.id());
            let by_path = row.is_some_and(|r| r.path.as_deref() == Some(cg.relative_path()))
                && cuda_row.is_some_and(|r| r.path.as_deref() == Some(cg.relative_path()))
                && ident.is_some_and(|c| c.pod_uid.as_deref() == Some(cg.pod_uid()));
            assert!(
                by_path,
                "pod {i} ({}) not named by its path while it lives: row {row:?}, cuda row {cuda_row:?}, identity {ident:?}",
                cg.relative_path()
            );
            named += 1;
            for (m, n) in bpf_maps::occupancy(me) {
                let p = peak.entry(m).or_default();
                *p = (*p).max(n);
            }
            removed_paths.insert(cg.relative_path().to_string());
            live.push_back(Pod { cg, workloads: ws, ending: Ending::of(i) });
            if live.len() > WINDOW {
                removed.insert(live.pop_front().unwrap().retire());
            }
        }
        while let Some(p) = live.pop_front() {
            removed.insert(p.retire());
        }
        // Every removed pod's rows go once its exits and its removal are in.
        let s = eventually("the churned pods' rows to go", Duration::from_secs(20), || {
            let s = t.settle();
            let cgroups: BTreeSet<u64> = s.state.cgroups.iter().map(|c| c.cgroup_id).collect();
            let processes: BTreeSet<u32> = s.state.processes.iter().map(|p| p.tgid).collect();
            (cgroups == base.cgroups && processes == base.processes).then_some(s)
        })
        .unwrap_or_else(|e| {
            let s = t.settle();
            panic!(
                "{e} after batch {batch}: cgroups left {:?}, processes left {:?}",
                s.state.cgroups.iter().filter(|c| removed.contains(&c.cgroup_id)).collect::<Vec<_>>(),
                s.state.processes.iter().filter(|p| !base.processes.contains(&p.tgid)).collect::<Vec<_>>()
            )
        });
        assert!(s.state.totals.usage.is_idle(), "batch {batch}: {:?}", s.state.totals.usage);
        let rss = rss_kib(me);
        batch_rss.push(rss / 1024);
        if batch == 0 {
            rss_before = rss;
        }
    }
    let churn_s = started.elapsed().as_secs_f64();

    // Everything of the churned pods is gone: ledger, CUDA ledger, identities, kernel maps.
    let s = t.settle();
    let end = Footprint::of(&s);
    let rss_after = rss_kib(me);
    let uvm_after = bpf_maps::occupancy(me).get("UVM_MAPS").copied().unwrap_or(0);
    let cuda_rows_after = s.cuda.cgroups.iter().filter(|c| removed.contains(&c.cgroup_id)).count();
    let rows_after = s.state.cgroups.iter().filter(|c| removed.contains(&c.cgroup_id)).count();
    let text = tracer_agent::export::metrics::MetricsRegistry::new()
        .encode(&Arc::new(s.clone()), tracer_agent::export::metrics::ExpositionFormat::Prometheus)
        .unwrap();
    let series_of_removed = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            label(l, "cgroup").is_some_and(|c| {
                removed_paths.contains(c)
                    || c.strip_prefix("id:").and_then(|id| id.parse().ok()).is_some_and(|id| removed.contains(&id))
            })
        })
        .count();
    let (allocs, frees) = (s.state.counters.allocations - allocs0, s.state.counters.frees - frees0);
    let maps = |f: &Footprint| f.maps.iter().map(|(k, v)| format!("{k}:{v}")).collect::<Vec<_>>().join(",");
    println!(
        "reliability: pods={pods} workloads={workloads} batches={BATCHES} window={WINDOW} named_by_path={named}/{pods} \
         named_by_path_ratio={:.3} paths_by_id={} walks={} churn_s={churn_s:.1}",
        named as f64 / pods as f64,
        s.pipeline.cgroup_paths_by_id,
        s.pipeline.cgroup_walks,
    );
    println!(
        "reliability: rows_after={rows_after} processes_after={} bytes_after={} allocations={allocs} frees={frees} \
         cuda_processes_after={} identities_after={} cuda_rows_after={cuda_rows_after} series_of_removed={series_of_removed}",
        end.processes.len() as i64 - base.processes.len() as i64,
        s.state.totals.usage.vidmem_bytes
            + s.state.totals.usage.sysmem_bytes
            + s.state.totals.usage.managed_bytes
            + s.state.totals.usage.va_reserved_bytes,
        end.cuda_processes.len(),
        s.containers.len() - base_containers.min(s.containers.len()),
    );
    println!(
        "reliability: maps_before={} maps_peak={} maps_after={} uvm_maps_before={uvm_before} uvm_maps_after={uvm_after} \
         lost={}",
        maps(&base),
        CLEANED_MAPS
            .iter()
            .map(|m| format!("{m}:{}", peak.get(*m).copied().unwrap_or(0)))
            .collect::<Vec<_>>()
            .join(","),
        maps(&end),
        s.accounting.dropped,
    );
    println!(
        "reliability: rss_start_mb={:.1} rss_before_mb={:.1} rss_after_mb={:.1} rss_growth_kib={} rss_by_batch_mb={:?}",
        rss_start as f64 / 1024.0,
        rss_before as f64 / 1024.0,
        rss_after as f64 / 1024.0,
        rss_after as i64 - rss_before as i64,
        batch_rss,
    );
    assert_eq!(named, pods);
    assert_eq!(rows_after, 0);
    assert_eq!(end.cgroups, base.cgroups, "the cgroup table is back to the live cgroups");
    assert_eq!(end.processes, base.processes, "the process table is back to the live processes");
    assert_eq!(end.cuda_processes, base.cuda_processes, "the CUDA ledger's processes");
    assert!(s.state.totals.usage.is_idle(), "{:?}", s.state.totals.usage);
    assert_eq!(allocs, frees, "every allocation was released: {:?}", s.state.counters.released_by);
    assert_eq!(s.cuda.totals.device_bytes + s.cuda.totals.managed_bytes + s.cuda.totals.host_bytes, 0);
    for m in ["NV_FDS", "TRACKED_TGIDS", "CUDA_COUNTS"] {
        assert!(peak.get(m).is_some_and(|n| *n > 0), "{m} never seen holding an entry: {peak:?}");
    }
    assert_eq!(end.maps, base.maps, "kernel maps user space cleans are back to their occupancy before the churn");
    assert!(s.containers.len() <= base_containers, "identities of removed cgroups: {}", s.containers.len());
    assert!(s.accounting.exact && s.accounting.dropped == 0, "{:?}", s.accounting);
    assert!(s.pipeline.decode_errors.is_empty(), "{:?}", s.pipeline.decode_errors);
    // What stays of removed pods, all named at once when something does.
    let mut stays = Vec::new();
    if series_of_removed > 0 {
        stays.push(format!("{series_of_removed} /metrics series of removed cgroups"));
    }
    if cuda_rows_after > 0 {
        let rows: Vec<String> = s
            .cuda
            .cgroups
            .iter()
            .filter(|c| removed.contains(&c.cgroup_id))
            .take(3)
            .map(|c| format!("{} {:?}: {:?}", c.cgroup_id, c.path, c.usage))
            .collect();
        stays.push(format!("{cuda_rows_after} CUDA ledger rows of removed cgroups (of {pods}), e.g. {rows:?}"));
    }
    if uvm_after > uvm_before {
        stays.push(format!(
            "{} UVM_MAPS entries of exited processes (managed mappings never unmapped: nothing removes them at exit)",
            uvm_after - uvm_before
        ));
    }
    if rss_after > rss_before + RSS_GROWTH_MAX_KIB {
        stays.push(format!(
            "RSS grew by {} KiB over {} pods after the warm-up",
            rss_after - rss_before,
            pods - PODS_PER_BATCH
        ));
    }
    assert!(stays.is_empty(), "after the churn, what stays of removed pods: {}", stays.join("; "));
}

/// The value of label `name` in one exposition line.
fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let start = line.find(&format!("{name}=\""))? + name.len() + 2;
    let len = line[start..].find('"')?;
    Some(&line[start..start + len])
}

// ----- the soak ------------------------------------------------------------------------------------

/// Where the soak's duration comes from (seconds; default [`SOAK_DEFAULT_S`]).
const SOAK_SECONDS_ENV: &str = "GPU_TRACER_SOAK_SECONDS";
/// How often the soak samples (seconds; default: the duration / 60, between 1 and 30).
const SOAK_SAMPLE_ENV: &str = "GPU_TRACER_SOAK_SAMPLE_SECONDS";
/// The soak's length when `cargo test` runs it (CI): long enough for a few hundred pods.
const SOAK_DEFAULT_S: f64 = 15.0;
/// A new pod this often; [`SOAK_WINDOW`] alive at once.
const SOAK_PACE: Duration = Duration::from_millis(250);
const SOAK_WINDOW: usize = 4;
/// The node name the fake API server binds the pods to.
const NODE: &str = "soak-node";

fn env_seconds(name: &str) -> Option<f64> {
    std::env::var(name).ok().and_then(|v| v.parse::<f64>().ok()).filter(|v| v.is_finite() && *v > 0.0)
}

/// The `gpu-tracer agent` process and the address it serves /metrics on; SIGTERM (then SIGKILL)
/// on drop ([`AgentProcess`]).
struct Agent {
    process: AgentProcess,
    addr: String,
}

impl Agent {
    fn start(args: &[String]) -> Agent {
        let mut process =
            AgentProcess::spawn(Command::new(gpu_tracer()).args(args).stdin(Stdio::null()).stdout(Stdio::null()))
                .expect("spawn gpu-tracer agent");
        let addr = process.metrics_addr().unwrap_or_else(|e| panic!("the agent never said where it serves: {e}"));
        Agent { process, addr }
    }

    fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The last lines of its log, for failure messages.
    fn log_tail(&self) -> String {
        let log = self.process.log();
        log[log.len().saturating_sub(40)..].join("\n")
    }

    fn running(&mut self) -> bool {
        self.process.running()
    }
}

/// One reading of the agent: name → value, in a stable order.
type Sample = Vec<(&'static str, f64)>;

/// Read the agent: its RSS, fds and threads from /proc, table sizes from `/metrics`, the occupancy
/// of its kernel maps. `None` when `/metrics` does not answer.
fn sample(agent: &Agent) -> Option<Sample> {
    let pid = agent.pid();
    let (status, text) = http_get(&agent.addr, "/metrics");
    if status != 200 {
        return None;
    }
    let value = |name: &str| {
        text.lines()
            .find(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with(' ')))
            .and_then(|l| l.rsplit_once(' '))
            .and_then(|(_, v)| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let series = |name: &str| text.lines().filter(|l| l.starts_with(&format!("{name}{{"))).count() as f64;
    let count_dir = |d: &str| std::fs::read_dir(format!("/proc/{pid}/{d}")).map_or(0, |r| r.count()) as f64;
    let maps = bpf_maps::occupancy(pid);
    let map = |m: &str| maps.get(m).copied().unwrap_or(0) as f64;
    Some(vec![
        ("rss_kib", rss_kib(pid) as f64),
        ("fds", count_dir("fd")),
        ("threads", count_dir("task")),
        ("processes", value("gpu_tracer_processes")),
        ("cgroup_rows", value("gpu_tracer_cgroups")),
        ("cuda_cgroup_rows", series("gpu_tracer_cgroup_cuda_launches_total")),
        ("attribution_containers", series("gpu_tracer_container_cost_total")),
        ("series", text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).count() as f64),
        ("metrics_kib", text.len() as f64 / 1024.0),
        ("NV_FDS", map("NV_FDS")),
        ("TRACKED_TGIDS", map("TRACKED_TGIDS")),
        ("INFLIGHT", map("INFLIGHT")),
        ("UVM_MAPS", map("UVM_MAPS")),
        ("CUDA_COUNTS", map("CUDA_COUNTS")),
        ("CUDA_INFLIGHT", map("CUDA_INFLIGHT")),
        ("LOST_RECORDS", map("LOST_RECORDS")),
    ])
}

fn get(s: &Sample, name: &str) -> f64 {
    s.iter().find(|(k, _)| *k == name).map_or(0.0, |(_, v)| *v)
}

/// A sample as the line `cargo xtask reliability` reads; `phase` is `baseline` (before the churn),
/// `churn` or `end` (after it, once the agent has caught up): only `churn` samples are fitted.
fn sample_line(t: f64, phase: &str, live: usize, s: &Sample) -> String {
    let fields: Vec<String> = s.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("soak-sample: t={t:.1} phase={phase} live_pods={live} {}", fields.join(" "))
}

/// The simulated node around the agent: an API server and a kubelet pod-resources socket that list
/// the live churned pods, NVML following the fake driver, the agent's config file.
struct Node {
    rt: tokio::runtime::Runtime,
    api: gpu_tracer_tests::kube_api::FakeApiServer,
    kubelet: gpu_tracer_tests::pod_resources::FakePodResources,
    dir: PathBuf,
    config: PathBuf,
    /// Cgroup directories whose processes NVML reports busy.
    busy: Arc<Mutex<Vec<PathBuf>>>,
    follower: Option<gpu_tracer_tests::nvml_model::Follower>,
}

impl Node {
    fn start(driver: &FakeDriver) -> Node {
        use gpu_tracer_proto::podresources::v1 as pr;
        use gpu_tracer_tests::{
            kube_api::FakeApiServer,
            nvml_model::{Busy, NvmlModel, gpu_uuid},
            pod_resources::FakePodResources,
        };
        let dir = std::env::temp_dir().join(format!("gpu-tracer-soak-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let api = rt.block_on(FakeApiServer::start()).expect("the fake API server");
        let kubelet = rt.block_on(FakePodResources::start()).expect("the fake pod-resources socket");
        kubelet.set_allocatable(pr::AllocatableResourcesResponse {
            devices: vec![pr::ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: (0..driver.gpus()).map(gpu_uuid).collect(),
                topology: None,
            }],
            ..Default::default()
        });
        let kubeconfig = dir.join("kubeconfig");
        api.write_kubeconfig(&kubeconfig).unwrap();
        let model = NvmlModel::install(&dir.join("nvml"), &driver.stats().unwrap(), 512 << 20).expect("fake NVML");
        let config = dir.join("gpu-tracer.toml");
        std::fs::write(
            &config,
            format!(
                "[nvml]\nmode = \"required\"\nlibrary = {:?}\n\n[attribution]\nprice_per_gpu_hour = 4.0\n\n\
                 [kubernetes]\nmode = \"required\"\nnode_name = {NODE:?}\nkubeconfig = {kubeconfig:?}\n\
                 pod_resources_socket = {:?}\n",
                model.library(),
                kubelet.socket()
            ),
        )
        .unwrap();
        let busy: Arc<Mutex<Vec<PathBuf>>> = Arc::default();
        let cgroups = busy.clone();
        let follower = model.follow(
            driver.path(gpu_tracer_tests::fake_driver::stats::STATS_FILE_NAME),
            Duration::from_millis(250),
            move || {
                let mut out = BTreeMap::new();
                for cg in cgroups.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                    let procs = std::fs::read_to_string(cg.join("cgroup.procs")).unwrap_or_default();
                    for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                        out.insert(pid, Busy { sm_pct: 20, mem_pct: 10 });
                    }
                }
                out
            },
        );
        Node { rt, api, kubelet, dir, config, busy, follower: Some(follower) }
    }

    /// List the pods of `live` (name, cgroup, GPU) in the API server and the kubelet, and make
    /// their processes busy in NVML.
    fn set_pods(&self, live: &[(String, &PodCgroup, u32)]) {
        use gpu_tracer_proto::podresources::v1 as pr;
        let _g = self.rt.enter();
        self.kubelet.set_pods(
            live.iter()
                .map(|(name, _, gpu)| pr::PodResources {
                    name: name.clone(),
                    namespace: "churn".into(),
                    containers: vec![pr::ContainerResources {
                        name: "main".into(),
                        devices: vec![pr::ContainerDevices {
                            resource_name: "nvidia.com/gpu".into(),
                            device_ids: vec![gpu_tracer_tests::nvml_model::gpu_uuid(*gpu)],
                            topology: None,
                        }],
                        ..Default::default()
                    }],
                })
                .collect(),
        );
        *self.busy.lock().unwrap_or_else(|e| e.into_inner()) =
            live.iter().map(|(_, cg, _)| cg.path().to_path_buf()).collect();
    }

    fn add_pod(&self, name: &str, cg: &PodCgroup) {
        use gpu_tracer_tests::kube_api::FakePod;
        let _g = self.rt.enter();
        let scheme = if cg.path().to_string_lossy().contains("crio-") { "cri-o" } else { "containerd" };
        self.api.apply(
            FakePod::new("churn", name, NODE)
                .uid(cg.pod_uid())
                .label("team", "churn")
                .owner("ReplicaSet", "churn-5d8f7")
                .container("main", 1, Some(&format!("{scheme}://{}", cg.container_id())))
                .build(),
        );
    }

    fn delete_pod(&self, name: &str) {
        let _g = self.rt.enter();
        self.api.delete("churn", name);
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        drop(self.follower.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `gpu-tracer agent` binary on a simulated node under steady churn (issue 13's soak): a new
/// pod every [`SOAK_PACE`], [`SOAK_WINDOW`] alive at once, each listed by the API server and the
/// kubelet while it lives, its processes allocating and launching then ending one of the
/// [`Ending`] ways, its cgroup removed; one steady pod holds memory throughout. Every sample
/// interval the agent is read ([`sample`]) and a `soak-sample:` line printed; `cargo xtask
/// reliability` fits the slopes. Once the churn stops, the agent's tables and the kernel maps it
/// cleans must come back to the baseline taken before it started, and the agent must still be
/// ready.
#[test]
fn the_agent_binary_holds_steady_under_churn() {
    let _s = serial();
    let seconds = env_seconds(SOAK_SECONDS_ENV).unwrap_or(SOAK_DEFAULT_S);
    let every = env_seconds(SOAK_SAMPLE_ENV).unwrap_or((seconds / 60.0).clamp(1.0, 30.0));
    let lib = fake_libcuda("thunk");
    let driver = FakeDriver::start(2).unwrap();
    let node = Node::start(&driver);
    let dev = driver.dev_dir().display().to_string();
    let args: Vec<String> = [
        "--config",
        &node.config.display().to_string(),
        "--log",
        "info",
        "--libcuda",
        &lib.display().to_string(),
        "--dev-dir",
        &dev,
        "--simulated-devices",
        "agent",
        "--listen",
        "127.0.0.1:0",
        "--grpc-listen",
        "off",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();

    // The steady pod, running before the agent (found by its /proc scan) and to the end.
    let steady_cg = pod_cgroup(0);
    let mut steady = Workload::builder(driver.dev_dir()).cgroup(&steady_cg).libcuda(&lib).spawn().unwrap();
    ok(&mut steady, "init 0");
    ok(&mut steady, "alloc-rm 1G");
    ok(&mut steady, "cuda-init");
    node.add_pod("steady", &steady_cg);
    node.set_pods(&[("steady".into(), &steady_cg, 0)]);

    let mut agent = Agent::start(&args);
    let ready = eventually("the agent ready", Duration::from_secs(30), || {
        (http_get(&agent.addr, "/readyz").0 == 200).then_some(())
    });
    ready.unwrap_or_else(|e| panic!("{e}; its log:\n{}", agent.log_tail()));
    // Baseline: the steady pod listed and its launches counted, before any churn.
    ok(&mut steady, "cuda-launch 100");
    let mut last = None;
    let base = eventually("the steady pod in /metrics", Duration::from_secs(20), || {
        let s = sample(&agent)?;
        last = Some(s.clone());
        (get(&s, "processes") >= 1.0 && get(&s, "cuda_cgroup_rows") >= 1.0).then_some(s)
    })
    .unwrap_or_else(|e| panic!("{e}; last sample {last:?}; its log:\n{}", agent.log_tail()));
    println!("{}", sample_line(0.0, "baseline", 0, &base));

    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let mut live: VecDeque<(String, Pod, u32)> = VecDeque::new();
    let (mut pods, mut workloads, mut samples) = (0usize, 0usize, 0usize);
    let mut next_sample = started + Duration::from_secs_f64(every);
    let mut next_pod = started;
    let publish = |live: &VecDeque<(String, Pod, u32)>| {
        let mut l: Vec<(String, &PodCgroup, u32)> = vec![("steady".into(), &steady_cg, 0)];
        l.extend(live.iter().map(|(n, p, g)| (n.clone(), &p.cg, *g)));
        node.set_pods(&l);
    };
    while Instant::now() < deadline {
        let now = Instant::now();
        if now >= next_sample {
            let s = sample(&agent).unwrap_or_else(|| panic!("/metrics did not answer; its log:\n{}", agent.log_tail()));
            println!("{}", sample_line(started.elapsed().as_secs_f64(), "churn", live.len(), &s));
            samples += 1;
            next_sample += Duration::from_secs_f64(every);
            ok(&mut steady, "cuda-launch 100");
        }
        if now < next_pod {
            std::thread::sleep((next_pod - now).min(next_sample.saturating_duration_since(now)));
            continue;
        }
        next_pod += SOAK_PACE;
        let i = pods + 1;
        let gpu = (i % 2) as u32;
        let name = format!("churn-{i}");
        let cg = pod_cgroup(i);
        node.add_pod(&name, &cg);
        let mut ws = vec![busy_workload(&driver, &cg, &lib, gpu, i)];
        if i.is_multiple_of(5) {
            ws.push(busy_workload(&driver, &cg, &lib, 1 - gpu, i + 1));
        }
        ok(&mut ws[0], "cuda-launch 200");
        workloads += ws.len();
        pods += 1;
        live.push_back((name, Pod { cg, workloads: ws, ending: Ending::of(i) }, gpu));
        publish(&live);
        if live.len() > SOAK_WINDOW {
            let (name, pod, _) = live.pop_front().unwrap();
            pod.retire();
            node.delete_pod(&name);
            publish(&live);
        }
        assert!(agent.running(), "the agent exited; its log:\n{}", agent.log_tail());
    }
    let churn_s = started.elapsed().as_secs_f64();
    while let Some((name, pod, _)) = live.pop_front() {
        pod.retire();
        node.delete_pod(&name);
    }
    publish(&live);

    // Back to the baseline once the agent has seen the exits and removals (its snapshot is
    // published once a second): its tables, the CUDA ledger's rows (the steady pod's only), and
    // every kernel map of the churned processes, `UVM_MAPS` included (their managed mappings were
    // never unmapped: the processes exited). The attribution keeps the cost of every container it
    // has seen, up to 4096, by design: not checked.
    const BACK: &[&str] = &[
        "processes",
        "cgroup_rows",
        "cuda_cgroup_rows",
        "NV_FDS",
        "TRACKED_TGIDS",
        "INFLIGHT",
        "UVM_MAPS",
        "CUDA_COUNTS",
        "CUDA_INFLIGHT",
        "LOST_RECORDS",
    ];
    let mut last = None;
    let back = eventually("the agent back to its baseline", Duration::from_secs(20), || {
        let s = sample(&agent)?;
        let done = BACK.iter().all(|k| get(&s, k) == get(&base, k));
        last = Some(s.clone());
        done.then_some(s)
    });
    let end = back.unwrap_or_else(|_| last.clone().unwrap_or_default());
    println!("{}", sample_line(started.elapsed().as_secs_f64(), "end", 0, &end));
    let leftover: Vec<String> = BACK
        .iter()
        .filter(|k| get(&end, k) != get(&base, k))
        .map(|k| format!("{k}:{}", get(&end, k) - get(&base, k)))
        .collect();
    let ready = http_get(&agent.addr, "/readyz").0;
    println!(
        "reliability: soak_s={churn_s:.0} pods={pods} workloads={workloads} pods_per_hour={:.0} samples={samples} \
         sample_every_s={every}",
        pods as f64 / churn_s * 3600.0
    );
    println!(
        "reliability: leftover={} attribution_containers_end={} rss_start_mb={:.1} rss_end_mb={:.1} \
         readyz_end={ready}",
        if leftover.is_empty() { "none".to_string() } else { leftover.join(",") },
        get(&end, "attribution_containers"),
        get(&base, "rss_kib") / 1024.0,
        get(&end, "rss_kib") / 1024.0,
    );
    assert!(agent.running(), "the agent exited; its log:\n{}", agent.log_tail());
    assert_eq!(ready, 200, "the agent is not ready at the end; its log:\n{}", agent.log_tail());
    assert!(leftover.is_empty(), "not back to the baseline after the churn: {leftover:?}");
    drop(steady);
}

/// The occupancy of a process's BPF maps, read through the `bpf(2)` system call (root): the
/// entries of each hash map, and the bytes set in each memory-mappable array (`TRACKED_TGIDS`: one
/// byte per tracked process). No BPF library is needed: map ids from `/proc/PID/fdinfo`, an fd
/// by id, `BPF_OBJ_GET_INFO_BY_FD` for the name, `BPF_MAP_GET_NEXT_KEY` to walk the keys.
mod bpf_maps {
    use std::{
        collections::{BTreeMap, BTreeSet},
        io,
        os::fd::{AsRawFd, FromRawFd, OwnedFd},
    };

    const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
    const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    const BPF_F_MMAPABLE: u32 = 1 << 10;
    /// Hash, per-CPU hash, LRU hash, LRU per-CPU hash.
    const HASH_TYPES: [u32; 4] = [1, 5, 9, 10];
    const ARRAY: u32 = 2;

    /// The part of `union bpf_attr` these commands use; the rest stays zero, as the kernel requires.
    type Attr = [u64; 8];

    fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<i64> {
        // SAFETY: `attr` is a buffer of the size passed, laid out as the command's part of `union
        // bpf_attr`; the pointers in it point at buffers that outlive the call.
        let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), size_of::<Attr>() as libc::c_uint) };
        if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
    }

    struct Info {
        kind: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        flags: u32,
        name: String,
    }

    fn info(fd: &OwnedFd) -> io::Result<Info> {
        // struct bpf_map_info up to its name: type, id, key_size, value_size, max_entries, map_flags, name[16].
        let mut buf = [0u8; 40];
        let mut a: Attr = [0; 8];
        a[0] = fd.as_raw_fd() as u64 | ((buf.len() as u64) << 32);
        a[1] = buf.as_mut_ptr() as u64;
        bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
        let u32_at = |o: usize| u32::from_ne_bytes(buf[o..o + 4].try_into().unwrap());
        let name = &buf[24..40];
        let name = String::from_utf8_lossy(&name[..name.iter().position(|b| *b == 0).unwrap_or(16)]).into_owned();
        Ok(Info {
            kind: u32_at(0),
            key_size: u32_at(8),
            value_size: u32_at(12),
            max_entries: u32_at(16),
            flags: u32_at(20),
            name,
        })
    }

    /// An fd of map `id`. Read-write, although nothing is written: a shared mapping of a read-only
    /// fd is not `VM_SHARED`, and the kernel refuses to map a BPF array any other way.
    fn open(id: u32) -> io::Result<OwnedFd> {
        let mut a: Attr = [0; 8];
        a[0] = id as u64;
        let fd = bpf(BPF_MAP_GET_FD_BY_ID, &mut a)?;
        // SAFETY: the kernel just returned this fd to us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }

    /// Keys in a hash map (a walk of a map changing under it may restart: capped at its size).
    fn count_keys(fd: &OwnedFd, key_size: u32, max_entries: u32) -> io::Result<u64> {
        let (mut key, mut next) = (vec![0u8; key_size as usize], vec![0u8; key_size as usize]);
        let mut n = 0u64;
        loop {
            let mut a: Attr = [0; 8];
            a[0] = fd.as_raw_fd() as u64;
            a[1] = if n == 0 { 0 } else { key.as_ptr() as u64 };
            a[2] = next.as_mut_ptr() as u64;
            match bpf(BPF_MAP_GET_NEXT_KEY, &mut a) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(n),
                Err(e) => return Err(e),
            }
            n += 1;
            std::mem::swap(&mut key, &mut next);
            if n >= u64::from(max_entries) {
                return Ok(n);
            }
        }
    }

    /// Non-zero bytes of a memory-mappable array.
    fn count_marked(fd: &OwnedFd, len: usize) -> io::Result<u64> {
        // SAFETY: a fresh read-only shared mapping of the map's `len` bytes, unmapped below.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let words = p as *const u64;
        let mut n = 0u64;
        for i in 0..len / 8 {
            // SAFETY: inside the mapping; volatile because the kernel and the agent write it.
            let w = unsafe { std::ptr::read_volatile(words.add(i)) };
            if w != 0 {
                n += w.to_ne_bytes().iter().filter(|b| **b != 0).count() as u64;
            }
        }
        // SAFETY: unmapping exactly what was mapped above.
        unsafe { libc::munmap(p, len) };
        Ok(n)
    }

    /// Map ids a process holds fds of.
    fn map_ids(pid: u32) -> BTreeSet<u32> {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return BTreeSet::new() };
        dir.flatten()
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .filter_map(|t| t.lines().find_map(|l| l.strip_prefix("map_id:")).and_then(|v| v.trim().parse().ok()))
            .collect()
    }

    /// Entries of each hash map and set bytes of each mappable array that `pid` holds, by map name
    /// (summed over maps of the same name). Panics when a map it holds cannot be read: a figure
    /// silently missing would read as an empty map.
    pub fn occupancy(pid: u32) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for id in map_ids(pid) {
            // A map whose last fd closed since the fdinfo was read is gone: nothing to count.
            let Ok(fd) = open(id) else { continue };
            let i = info(&fd).unwrap_or_else(|e| panic!("BPF_OBJ_GET_INFO_BY_FD on map {id}: {e}"));
            let n = if HASH_TYPES.contains(&i.kind) {
                count_keys(&fd, i.key_size, i.max_entries)
            } else if i.kind == ARRAY && i.flags & BPF_F_MMAPABLE != 0 {
                count_marked(&fd, i.value_size as usize * i.max_entries as usize)
            } else {
                continue;
            };
            let n = n.unwrap_or_else(|e| panic!("counting the entries of map {} ({id}): {e}", i.name));
            *out.entry(i.name).or_default() += n;
        }
        out
    }
}
