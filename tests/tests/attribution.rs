//! End-to-end tests of the NVML join and the attribution engine: the real eBPF probes, real
//! processes in real cgroup v2 directories named like Kubernetes pods, the fake NVIDIA driver over
//! FUSE and the fake `libnvidia-ml.so.1` whose scenario is derived from that driver's own state
//! ([`NvmlModel`]). Every test needs root and fails (never skips) without it.
//!
//! Each test checks the numbers a user would check by hand (a pod's memory is what it allocated, its
//! SM share is what it kept busy, its cost is its memory-time share of the interval's price) and the
//! identities every interval must satisfy exactly: memory lines sum to the device's total, compute
//! lines to 100 %, energy lines to the energy counter's delta, cost lines to the interval's price,
//! and the bill so far to its lines.
use std::{
    collections::BTreeMap,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use gpu_tracer_tests::{
    Answer, ChildGuard, FakeDriver, PodCgroup, Tracer, Workload, cgroup2_mount, config_for, fake_libcuda,
    nvml_model::{Busy, MigSpec, NvmlModel, Process, Scenario, gpu_uuid},
    require_root,
};
use tracer_agent::pipeline::Agent;
use tracer_core::{
    attribution::{
        AttributionSnapshot, GpuAttribution, SharingMode,
        gpu::{ComputeMethod, CostBasis, FULL, MemorySource},
    },
    config::{AttributionSettings, Config, Families, NvmlSettings, SourceMode},
    model::{AgentSnapshot, NvmlStatus, probes::ProbeMode},
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// What the model's driver keeps for itself on each GPU (NVML memory info v2 `reserved`).
const RESERVED: u64 = 512 * MIB;
/// 3600 per GPU-hour is one nano-unit per nanosecond: an interval's price is its length in ns.
const PRICE_PER_GPU_HOUR: f64 = 3600.0;
/// Between the two samples of an interval: long enough for a visible energy delta.
const INTERVAL: Duration = Duration::from_millis(150);

/// The probes are global kernel objects and the machine is small: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    require_root();
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A directory of this test's own under the temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        let p = std::env::temp_dir().join(format!("gt-attribution-{tag}-{}-{nanos:x}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A plain cgroup v2 directory that is not a pod's (a host service's), removed on drop after its
/// processes are killed.
struct HostCgroup {
    path: PathBuf,
}

impl HostCgroup {
    fn new() -> HostCgroup {
        let mut base = cgroup2_mount().expect("cgroup2 mount");
        if let Ok(b) = std::env::var("GPU_TRACER_TEST_CGROUP_BASE") {
            base = base.join(b.trim_start_matches('/'));
        }
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        let path = base.join(format!("gt-host-{}-{nanos:x}", std::process::id()));
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        HostCgroup { path }
    }

    fn id(&self) -> u64 {
        std::fs::metadata(&self.path).unwrap().ino()
    }
}

impl Drop for HostCgroup {
    fn drop(&mut self) {
        let procs = std::fs::read_to_string(self.path.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            // SAFETY: kill has no memory-safety preconditions; the pids are in our own cgroup.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let start = std::time::Instant::now();
        while std::fs::remove_dir(&self.path).is_err() && self.path.exists() && start.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The agent's configuration: the fake driver, the model's NVML, a price, and no automatic NVML
/// samples (the tests take them with `sample_now`, so each interval is exactly what they set up).
fn config(driver: &FakeDriver, model: &NvmlModel) -> Config {
    Config {
        nvml: NvmlSettings { mode: SourceMode::Required, library: Some(model.library().to_path_buf()) },
        attribution: AttributionSettings { price_per_gpu_hour: Some(PRICE_PER_GPU_HOUR), ..Default::default() },
        snapshot_interval_ms: 3_600_000,
        ..config_for(driver)
    }
}

fn ok(w: &mut Workload, cmd: &str) -> Answer {
    w.ok(cmd).unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

/// The display name the agent gives a pod's container without the API server.
fn pod_name(p: &PodCgroup) -> String {
    format!("pod {}/{}", &p.pod_uid()[..8], &p.container_id()[..8])
}

/// Settle the eBPF side, rewrite the NVML scenario from the driver's state now and `busy`, and take
/// an NVML sample (attributing the interval since the previous one). Returns the scenario written.
fn sample(t: &mut Tracer, model: &mut NvmlModel, driver: &FakeDriver, busy: &BTreeMap<u32, Busy>) -> Scenario {
    t.settle();
    let s = model.update(&driver.stats().unwrap(), busy).unwrap();
    t.agent.sample_now();
    s
}

/// One full interval: a sample at its start, `INTERVAL` later one at its end. Returns the two
/// scenarios and the snapshot after the second sample.
fn interval(
    t: &mut Tracer,
    model: &mut NvmlModel,
    driver: &FakeDriver,
    busy: &BTreeMap<u32, Busy>,
) -> (Scenario, Scenario, AgentSnapshot) {
    let a = sample(t, model, driver, busy);
    std::thread::sleep(INTERVAL);
    let b = sample(t, model, driver, busy);
    (a, b, t.settle())
}

fn attribution(s: &AgentSnapshot) -> &AttributionSnapshot {
    s.attribution.as_deref().unwrap_or_else(|| panic!("no attribution; nvml: {:?} {:?}", s.nvml.status, s.nvml.reason))
}

fn gpu<'a>(a: &'a AttributionSnapshot, uuid: &str) -> &'a GpuAttribution {
    a.gpus.iter().find(|g| g.uuid == uuid).unwrap_or_else(|| panic!("no GPU {uuid} in {:#?}", a.gpus))
}

fn line(g: &GpuAttribution, cgroup: u64) -> &tracer_core::attribution::gpu::ContainerLine {
    g.containers.iter().find(|l| l.container.0 == cgroup).unwrap_or_else(|| panic!("no line for {cgroup}: {g:#?}"))
}

/// `floor(total × w / sum)` and the part must be it or one more (largest remainder).
fn assert_share(what: &str, part: u64, total: u64, w: u64, sum: u64) {
    let floor = (total as u128 * w as u128 / sum as u128) as u64;
    assert!(part == floor || part == floor + 1, "{what}: {part} is not {total} × {w}/{sum} (floor {floor})");
}

/// The identities of one GPU's lines, exactly.
fn assert_lines_add_up(g: &GpuAttribution) {
    if let Some(m) = &g.memory {
        let sum: u64 = g.containers.iter().map(|l| l.memory_bytes).sum();
        assert_eq!(sum + m.driver_reserved + m.unattributed + m.free, m.total, "memory lines of {}: {m:?}", g.uuid);
        let d = m.unattributed_detail;
        assert_eq!(d.host_processes + d.mps_server + d.other, m.unattributed, "{m:?}");
    }
    let sm: u32 = g.containers.iter().map(|l| l.sm_millipct).sum();
    assert_eq!(sm + g.compute.unattributed + g.compute.idle, FULL, "compute lines of {}: {:?}", g.uuid, g.compute);
    if let Some(e) = &g.energy {
        let sum: u64 = g.containers.iter().map(|l| l.energy_mj.expect("energy per line")).sum();
        assert_eq!(sum + e.unattributed + e.idle, e.delta_mj, "energy lines of {}: {e:?}", g.uuid);
    }
    if let Some(c) = &g.cost {
        let sum: u64 = g.containers.iter().map(|l| l.cost_nano.expect("cost per line")).sum();
        assert_eq!(sum + c.idle + c.driver_reserved + c.unattributed, c.price_nano, "cost lines of {}: {c:?}", g.uuid);
    }
}

/// The bill so far equals its lines plus every container's cumulative cost.
fn assert_bill(a: &AttributionSnapshot) {
    let b = a.bill;
    let containers: u64 = a.containers.iter().map(|c| c.cumulative_cost_nano).sum();
    assert_eq!(containers + b.evicted + b.idle + b.driver_reserved + b.unattributed, b.total, "bill {b:?}");
}

/// The whole interval's price went to the GPUs: `price_nano` is the interval in ns at 3600/h.
fn assert_interval_price(a: &AttributionSnapshot, g: &GpuAttribution) {
    assert_eq!(g.cost.expect("cost").price_nano, a.interval_ns, "3600 per GPU-hour is 1 nano per ns");
}

fn nvml_used(s: &AgentSnapshot, pid: u32) -> Option<u64> {
    let sample = s.nvml.sample.as_ref()?;
    sample.devices.iter().flat_map(|d| &d.processes).find(|p| p.pid == pid).and_then(|p| p.used_bytes)
}

fn cg_vidmem(s: &AgentSnapshot, id: u64) -> u64 {
    s.state.cgroups.iter().find(|c| c.cgroup_id == id).map_or(0, |c| c.usage.vidmem_bytes)
}

/// Three pods time-slicing one GPU: memory per pod is exactly its allocation (NVML, the driver and
/// the eBPF ledger agree), the SM shares are the process samples, idle is the rest, energy follows
/// compute and cost follows memory-time, and every set of lines adds up.
#[test]
fn three_pods_time_slicing_one_gpu_add_up() {
    let _s = serial();
    let driver = FakeDriver::start(1).unwrap();
    let dir = TempDir::new("timeslice");
    let mut model = NvmlModel::install(&dir.0, &driver.stats().unwrap(), RESERVED).unwrap();
    let mut t = Tracer::start(config(&driver, &model));
    let pods: Vec<PodCgroup> = (0..3).map(|_| PodCgroup::new().unwrap()).collect();
    let mut w: Vec<Workload> = pods.iter().map(|p| Workload::spawn(driver.dev_dir(), Some(p)).unwrap()).collect();
    let alloc = [GIB, 2 * GIB, 3 * GIB];
    let sm = [30u32, 20, 10];
    for (wl, bytes) in w.iter_mut().zip(alloc) {
        ok(wl, "init 0");
        ok(wl, &format!("alloc-rm {bytes}"));
    }
    let busy: BTreeMap<u32, Busy> =
        w.iter().zip(sm).map(|(wl, p)| (wl.pid(), Busy { sm_pct: p, mem_pct: 5 })).collect();
    let (before, after, s) = interval(&mut t, &mut model, &driver, &busy);
    let a = attribution(&s);
    let g = gpu(a, &gpu_uuid(0));
    assert_lines_add_up(g);
    assert_bill(a);
    assert_interval_price(a, g);
    assert_eq!(g.sharing, SharingMode::TimeSlicing, "{}", g.sharing_reason);
    assert_eq!(g.minor, Some(0));

    // Memory: each pod exactly what it allocated, from NVML, matching the driver and the ledger.
    let stats = driver.stats().unwrap();
    let by_pid = NvmlModel::memory_by_pid(&stats);
    for ((p, wl), bytes) in pods.iter().zip(&w).zip(alloc) {
        let l = line(g, p.id());
        assert_eq!(l.memory_bytes, bytes, "{}", p.relative_path());
        assert_eq!(l.pids, vec![wl.pid()]);
        assert_eq!(l.memory_source, MemorySource::Nvml);
        assert_eq!(nvml_used(&s, wl.pid()), Some(bytes), "NVML's per-process figure");
        assert_eq!(by_pid.get(&(0, wl.pid())), Some(&bytes), "the driver's objects");
        assert_eq!(cg_vidmem(&s, p.id()), bytes, "the eBPF driver ledger");
        assert_eq!(l.ledgers.driver_bytes, Some(bytes));
        assert_eq!(l.name.as_deref(), Some(pod_name(p).as_str()));
    }
    let m = g.memory.expect("memory lines");
    assert_eq!(m.total, 80 * GIB);
    assert_eq!(m.driver_reserved, RESERVED);
    assert_eq!(m.unattributed, 0, "{m:?}");
    assert_eq!(m.free, 80 * GIB - RESERVED - 6 * GIB);
    assert!(!m.scaled_down && !m.inconsistent, "{m:?}");
    // Largest first.
    let order: Vec<u64> = g.containers.iter().map(|l| l.container.0).collect();
    assert_eq!(order, vec![pods[2].id(), pods[1].id(), pods[0].id()]);

    // Compute: the process samples, idle the rest of the device.
    assert_eq!(g.compute.method, ComputeMethod::ProcessSamples);
    for (p, pct) in pods.iter().zip(sm) {
        assert_eq!(line(g, p.id()).sm_millipct, pct * 1000);
    }
    assert_eq!((g.compute.unattributed, g.compute.idle), (0, 40_000));
    assert_eq!(g.compute.device_activity_pct, Some(60));

    // Energy: the counter's delta between the two samples, split like compute.
    let e = g.energy.expect("energy lines");
    let delta = after.devices[0].energy_mj.unwrap() - before.devices[0].energy_mj.unwrap();
    assert!(delta > 0);
    assert_eq!(e.delta_mj, delta);
    for (p, pct) in pods.iter().zip(sm) {
        assert_share("energy", line(g, p.id()).energy_mj.unwrap(), delta, pct as u64 * 1000, FULL as u64);
    }
    assert_share("idle energy", e.idle, delta, 40_000, FULL as u64);

    // Cost: memory-time over the device's bytes; the pods 1:2:3.
    let c = g.cost.expect("cost lines");
    assert_eq!(c.basis, CostBasis::MemoryTime);
    for (p, bytes) in pods.iter().zip(alloc) {
        assert_share("cost", line(g, p.id()).cost_nano.unwrap(), c.price_nano, bytes, m.total);
    }
    assert_share("free memory's cost", c.idle, c.price_nano, m.free, m.total);
    assert_share("reserved memory's cost", c.driver_reserved, c.price_nano, RESERVED, m.total);
    assert_eq!(c.unattributed, 0);
    let costs: Vec<u64> = pods.iter().map(|p| line(g, p.id()).cost_nano.unwrap()).collect();
    assert!(costs[0] < costs[1] && costs[1] < costs[2], "{costs:?}");
    assert!(costs[2].abs_diff(3 * costs[0]) <= 3 && costs[1].abs_diff(2 * costs[0]) <= 2, "1:2:3 {costs:?}");
    // The summaries carry the same numbers.
    for p in &pods {
        let sum = a.containers.iter().find(|c| c.container.0 == p.id()).expect("summary");
        assert_eq!(sum.cost_nano, line(g, p.id()).cost_nano.unwrap());
        assert_eq!(sum.gpus, vec![gpu_uuid(0)]);
    }
}

/// MPS: the server's memory is nobody's (unattributed, `mps_server`), the clients get theirs.
#[test]
fn mps_server_memory_is_unattributed_and_clients_are_containers() {
    let _s = serial();
    let driver = FakeDriver::start(1).unwrap();
    let dir = TempDir::new("mps");
    let mut model = NvmlModel::install(&dir.0, &driver.stats().unwrap(), RESERVED).unwrap();
    let mut t = Tracer::start(config(&driver, &model));
    // The MPS control daemon runs in a pod of its own (as the device plugin deploys it): its
    // server is still nobody's container line.
    let daemon_pod = PodCgroup::new().unwrap();
    let server_bin = dir.0.join("nvidia-cuda-mps-server");
    std::fs::copy("/bin/sleep", &server_bin).unwrap();
    let server = ChildGuard::new(Command::new(&server_bin).arg("600").spawn().unwrap());
    let server_pid = server.pid();
    daemon_pod.add_process(server_pid).unwrap();
    assert_eq!(std::fs::read_to_string(format!("/proc/{server_pid}/comm")).unwrap().trim(), "nvidia-cuda-mps");
    const SERVER_BYTES: u64 = 256 * MIB;
    model.mps_gpus.insert(0);
    model.extra_processes.insert(0, vec![Process::new(server_pid, SERVER_BYTES)]);

    let pods: Vec<PodCgroup> = (0..2).map(|_| PodCgroup::new().unwrap()).collect();
    let mut w: Vec<Workload> = pods.iter().map(|p| Workload::spawn(driver.dev_dir(), Some(p)).unwrap()).collect();
    let alloc = [GIB, 512 * MIB];
    for (wl, bytes) in w.iter_mut().zip(alloc) {
        ok(wl, "init 0");
        ok(wl, &format!("alloc-vidheap {bytes}"));
    }
    let busy: BTreeMap<u32, Busy> =
        [(w[0].pid(), Busy { sm_pct: 25, mem_pct: 0 }), (w[1].pid(), Busy { sm_pct: 15, mem_pct: 0 })].into();
    let (_, _, s) = interval(&mut t, &mut model, &driver, &busy);
    let a = attribution(&s);
    let g = gpu(a, &gpu_uuid(0));
    assert_lines_add_up(g);
    assert_bill(a);
    assert_eq!(g.sharing, SharingMode::Mps, "{}", g.sharing_reason);
    assert!(g.sharing_reason.contains(&server_pid.to_string()), "{}", g.sharing_reason);
    // NVML listed the clients as MPS processes and the server as a compute process.
    let dev = &s.nvml.sample.as_ref().unwrap().devices[0];
    assert!(dev.processes.iter().filter(|p| p.pid != server_pid).all(|p| p.mps), "{:?}", dev.processes);

    assert_eq!(g.containers.len(), 2, "the server is no container line: {:#?}", g.containers);
    assert!(g.containers.iter().all(|l| l.container.0 != daemon_pod.id()));
    for ((p, wl), bytes) in pods.iter().zip(&w).zip(alloc) {
        let l = line(g, p.id());
        assert_eq!((l.memory_bytes, l.pids.clone()), (bytes, vec![wl.pid()]));
    }
    let m = g.memory.unwrap();
    assert_eq!(m.unattributed_detail.mps_server, SERVER_BYTES);
    assert_eq!((m.unattributed_detail.host_processes, m.unattributed_detail.other), (0, 0));
    assert_eq!(m.unattributed, SERVER_BYTES);
    assert_eq!(m.driver_reserved, RESERVED);
    assert_eq!(m.free, 80 * GIB - RESERVED - SERVER_BYTES - GIB - 512 * MIB);
    assert_eq!(g.compute.method, ComputeMethod::ProcessSamples);
    assert_eq!(line(g, pods[0].id()).sm_millipct, 25_000);
    assert_eq!(line(g, pods[1].id()).sm_millipct, 15_000);
    assert_eq!((g.compute.unattributed, g.compute.idle), (0, 60_000));
    // The server's memory-time is billed as unattributed, not to a client.
    let c = g.cost.unwrap();
    assert_share("server's cost", c.unattributed, c.price_nano, SERVER_BYTES, m.total);
    drop(server);
}

/// MIG: each instance is its own set of lines with its own memory; with no utilization reading on
/// MIG, compute is split by the eBPF kernel-launch counts of the interval.
#[test]
fn mig_instances_are_attributed_separately_by_launch_counts() {
    let _s = serial();
    let lib = fake_libcuda(fake_libcuda::PLAIN);
    let driver = FakeDriver::start(1).unwrap();
    let dir = TempDir::new("mig");
    let mut model = NvmlModel::install(&dir.0, &driver.stats().unwrap(), RESERVED).unwrap();
    let mut cfg = config(&driver, &model);
    cfg.families.cuda = true;
    cfg.cuda_libraries = vec![lib.clone()];
    let mut t = Tracer::start(cfg);
    let pods: Vec<PodCgroup> = (0..3).map(|_| PodCgroup::new().unwrap()).collect();
    let mut w: Vec<Workload> =
        pods.iter().map(|p| Workload::builder(driver.dev_dir()).cgroup(p).libcuda(&lib).spawn().unwrap()).collect();
    let alloc = [2 * GIB, 8 * GIB, 4 * GIB];
    for (wl, bytes) in w.iter_mut().zip(alloc) {
        ok(wl, "init 0");
        ok(wl, &format!("alloc-rm {bytes}"));
        ok(wl, "cuda-init");
    }
    let small = "MIG-00000000-aaaa-4e57-8a11-000000000001";
    let big = "MIG-00000000-bbbb-4e57-8a11-000000000002";
    model.mig.insert(
        0,
        vec![
            MigSpec {
                uuid: small.into(),
                profile: "1g.10gb".into(),
                gpu_instance_id: 9,
                compute_instance_id: 0,
                total_bytes: 10 * GIB,
                pids: vec![w[0].pid()],
            },
            MigSpec {
                uuid: big.into(),
                profile: "3g.40gb".into(),
                gpu_instance_id: 2,
                compute_instance_id: 0,
                total_bytes: 40 * GIB,
                pids: vec![w[1].pid(), w[2].pid()],
            },
        ],
    );
    let busy = BTreeMap::new();
    // The interval's start; then the launches, which must fall inside it.
    sample(&mut t, &mut model, &driver, &busy);
    ok(&mut w[0], "cuda-launch 100");
    ok(&mut w[1], "cuda-launch 300");
    ok(&mut w[2], "cuda-launch 100");
    std::thread::sleep(INTERVAL);
    sample(&mut t, &mut model, &driver, &busy);
    let s = t.settle();
    let a = attribution(&s);
    for g in &a.gpus {
        assert_lines_add_up(g);
    }
    assert_bill(a);
    let (gs, gb) = (gpu(a, small), gpu(a, big));
    for (g, profile) in [(gs, "1g.10gb"), (gb, "3g.40gb")] {
        assert_eq!(g.sharing, SharingMode::Mig, "{}", g.sharing_reason);
        assert_eq!(g.parent_uuid.as_deref(), Some(gpu_uuid(0).as_str()));
        assert_eq!(g.mig_profile.as_deref(), Some(profile));
    }
    // Memory per instance, against the instance's own total.
    let ms = gs.memory.unwrap();
    assert_eq!((ms.total, ms.free, ms.driver_reserved, ms.unattributed), (10 * GIB, 8 * GIB, 0, 0));
    assert_eq!(gs.containers.len(), 1);
    assert_eq!(line(gs, pods[0].id()).memory_bytes, 2 * GIB);
    let mb = gb.memory.unwrap();
    assert_eq!((mb.total, mb.free, mb.unattributed), (40 * GIB, 28 * GIB, 0));
    assert_eq!(line(gb, pods[1].id()).memory_bytes, 8 * GIB);
    assert_eq!(line(gb, pods[2].id()).memory_bytes, 4 * GIB);
    // Compute: launches in the interval, per instance; no activity reading, so no idle figure.
    for g in [gs, gb] {
        assert_eq!(g.compute.method, ComputeMethod::LaunchCounts, "{:?}", g.compute);
        assert_eq!((g.compute.device_activity_pct, g.compute.idle, g.compute.unattributed), (None, 0, 0));
    }
    assert_eq!(line(gs, pods[0].id()).launches, 100);
    assert_eq!(line(gs, pods[0].id()).sm_millipct, FULL);
    assert_eq!((line(gb, pods[1].id()).launches, line(gb, pods[2].id()).launches), (300, 100));
    assert_eq!((line(gb, pods[1].id()).sm_millipct, line(gb, pods[2].id()).sm_millipct), (75_000, 25_000));
    // The GPU's price and energy are split by slices (1/7, 3/7, and the 3/7 nobody partitioned).
    let rest = a.gpus.iter().find(|g| g.mig_profile.as_deref() == Some("unpartitioned")).expect("unpartitioned");
    let prices: Vec<u64> = [gs, gb, rest].iter().map(|g| g.cost.unwrap().price_nano).collect();
    // A slice is 1/7 of the GPU in whole parts per million: 142 857 ppm.
    assert_share("1g slice's price", prices[0], a.interval_ns, 142_857, 1_000_000);
    assert_share("3g slice's price", prices[1], a.interval_ns, 3 * 142_857, 1_000_000);
    // Each slice's bill is rounded down over its own history, so each interval is within 1 of exact.
    assert!(a.interval_ns.abs_diff(prices.iter().sum::<u64>()) <= 3, "{prices:?} of {}", a.interval_ns);
    let energy: Vec<u64> = [gs, gb, rest].iter().map(|g| g.energy.unwrap().delta_mj).collect();
    assert!(energy[0] > 0 && energy[1] > 2 * energy[0], "{energy:?}");
}

/// A process in a cgroup that is not a pod's is a host process: its memory and SM time are
/// `unattributed`, never a container line.
#[test]
fn a_process_outside_any_pod_is_unattributed() {
    let _s = serial();
    let driver = FakeDriver::start(1).unwrap();
    let dir = TempDir::new("host");
    let mut model = NvmlModel::install(&dir.0, &driver.stats().unwrap(), RESERVED).unwrap();
    let mut t = Tracer::start(config(&driver, &model));
    let host = HostCgroup::new();
    let pod = PodCgroup::new().unwrap();
    let mut hw = Workload::builder(driver.dev_dir()).cgroup_dir(&host.path).spawn().unwrap();
    let mut pw = Workload::spawn(driver.dev_dir(), Some(&pod)).unwrap();
    ok(&mut hw, "init 0");
    ok(&mut hw, "alloc-rm 805306368");
    ok(&mut pw, "init 0");
    ok(&mut pw, "alloc-rm 1073741824");
    let busy: BTreeMap<u32, Busy> =
        [(hw.pid(), Busy { sm_pct: 10, mem_pct: 0 }), (pw.pid(), Busy { sm_pct: 20, mem_pct: 0 })].into();
    let (_, _, s) = interval(&mut t, &mut model, &driver, &busy);
    // The eBPF side saw the host process in its own cgroup.
    assert_eq!(cg_vidmem(&s, host.id()), 768 * MIB);
    let a = attribution(&s);
    let g = gpu(a, &gpu_uuid(0));
    assert_lines_add_up(g);
    assert_bill(a);
    assert_eq!(g.containers.len(), 1, "{:#?}", g.containers);
    assert!(a.containers.iter().all(|c| c.container.0 != host.id()), "no summary for the host cgroup");
    assert_eq!(line(g, pod.id()).memory_bytes, GIB);
    assert_eq!(g.sharing, SharingMode::TimeSlicing, "{}", g.sharing_reason);
    assert!(g.sharing_reason.contains("host"), "{}", g.sharing_reason);
    let m = g.memory.unwrap();
    assert_eq!(m.unattributed_detail.host_processes, 768 * MIB);
    assert_eq!(m.unattributed, 768 * MIB);
    assert_eq!(line(g, pod.id()).sm_millipct, 20_000);
    assert_eq!((g.compute.unattributed, g.compute.idle), (10_000, 70_000));
    let c = g.cost.unwrap();
    assert_share("host memory's cost", c.unattributed, c.price_nano, 768 * MIB, m.total);
    drop((hw, pw));
}

/// A restart under running workloads (issue 13, item 8): memory allocated before the agent started
/// never reaches the ledger, so the ledger rows say "from before the agent" instead of passing for
/// exact zeros, and the attribution takes each process's memory from NVML (memory_source nvml), so
/// the pods' memory and bill are right from the first interval.
#[test]
fn workloads_running_before_the_agent_get_their_memory_from_nvml_and_are_marked() {
    let _s = serial();
    let driver = FakeDriver::start(1).unwrap();
    let dir = TempDir::new("restart");
    let mut model = NvmlModel::install(&dir.0, &driver.stats().unwrap(), RESERVED).unwrap();
    let (pa, pb) = (PodCgroup::new().unwrap(), PodCgroup::new().unwrap());
    let mut wa = Workload::spawn(driver.dev_dir(), Some(&pa)).unwrap();
    let mut wb = Workload::spawn(driver.dev_dir(), Some(&pb)).unwrap();
    ok(&mut wa, "init 0");
    ok(&mut wa, "alloc-rm 1610612736");
    ok(&mut wb, "init 0");
    ok(&mut wb, "alloc-rm 2147483648");
    // The agent starts only now.
    let mut t = Tracer::start(config(&driver, &model));
    let busy: BTreeMap<u32, Busy> =
        [(wa.pid(), Busy { sm_pct: 10, mem_pct: 0 }), (wb.pid(), Busy { sm_pct: 10, mem_pct: 0 })].into();
    let (_, _, s) = interval(&mut t, &mut model, &driver, &busy);
    for (pod, w) in [(&pa, &wa), (&pb, &wb)] {
        // The ledger cannot know the 1.5 / 2 GiB, and says so.
        assert_eq!(cg_vidmem(&s, pod.id()), 0);
        let row = s.state.cgroups.iter().find(|c| c.cgroup_id == pod.id()).expect("cgroup row");
        assert_eq!(row.completeness.from_before_agent, 1, "{:?}", row.completeness);
        assert!(s.state.processes.iter().any(|p| p.tgid == w.pid() && p.completeness.from_before_agent == 1));
    }
    let a = attribution(&s);
    let g = gpu(a, &gpu_uuid(0));
    assert_lines_add_up(g);
    assert_bill(a);
    for (pod, bytes) in [(&pa, 1536 * MIB), (&pb, 2 * GIB)] {
        let l = line(g, pod.id());
        println!(
            "reliability: allocated_before_agent_mib={} ledger_mib={} attributed_mib={} source={:?} cost_nano={}",
            bytes / MIB,
            cg_vidmem(&s, pod.id()) / MIB,
            l.memory_bytes / MIB,
            l.memory_source,
            l.cost_nano.unwrap_or(0)
        );
        assert_eq!(l.memory_bytes, bytes, "{l:?}");
        assert_eq!(l.memory_source, MemorySource::Nvml);
        assert!(l.cost_nano.unwrap_or(0) > 0, "{l:?}");
        // The ledger rows carry NVML's figure beside their own zero (and `top` prints it).
        let row = s.state.cgroups.iter().find(|c| c.cgroup_id == pod.id()).expect("cgroup row");
        println!(
            "reliability: ledger_row_nvml_mib={:?}",
            row.completeness.nvml_bytes_from_before_agent.map(|b| b / MIB)
        );
        assert_eq!(row.completeness.nvml_bytes_from_before_agent, Some(bytes), "{:?}", row.completeness);
        assert!(row.completeness.describe().contains("(NVML: "), "{}", row.completeness.describe());
    }
    let total = s.state.totals.completeness.nvml_bytes_from_before_agent;
    assert_eq!(total, Some(1536 * MIB + 2 * GIB), "{:?}", s.state.totals.completeness);
    drop((wa, wb));
}

/// NVML failing mid-run (every call on the GPU answers GPU_IS_LOST) does not stop the agent or the
/// eBPF side; the sample marks the GPU lost and the attribution has no per-container numbers for
/// it; when NVML answers again, so do the numbers.
#[test]
fn nvml_losing_the_gpu_mid_run_is_survived_and_reported() {
    let _s = serial();
    let driver = FakeDriver::start(1).unwrap();
    let dir = TempDir::new("lost");
    let mut model = NvmlModel::install(&dir.0, &driver.stats().unwrap(), RESERVED).unwrap();
    let mut t = Tracer::start(config(&driver, &model));
    let pod = PodCgroup::new().unwrap();
    let mut w = Workload::spawn(driver.dev_dir(), Some(&pod)).unwrap();
    ok(&mut w, "init 0");
    ok(&mut w, "alloc-rm 1073741824");
    let busy: BTreeMap<u32, Busy> = [(w.pid(), Busy { sm_pct: 40, mem_pct: 0 })].into();
    let (_, _, s) = interval(&mut t, &mut model, &driver, &busy);
    let g = gpu(attribution(&s), &gpu_uuid(0));
    assert_eq!(line(g, pod.id()).memory_bytes, GIB);

    // The GPU falls off the bus, for NVML.
    let mut lost = model.update(&driver.stats().unwrap(), &busy).unwrap();
    lost.devices[0].errors.insert("*".into(), 15);
    fake_nvml::write_scenario(&dir.0, &lost).unwrap();
    std::thread::sleep(INTERVAL);
    t.agent.sample_now();
    // The eBPF side goes on: a new allocation is traced.
    ok(&mut w, "alloc-rm 268435456");
    let s = t.settle();
    assert_eq!(cg_vidmem(&s, pod.id()), GIB + 256 * MIB);
    let dev = &s.nvml.sample.as_ref().unwrap().devices[0];
    assert!(dev.lost, "the sample marks the GPU lost: {dev:?}");
    assert_eq!(dev.uuid, gpu_uuid(0), "a lost GPU keeps its identity");
    assert!(dev.memory.is_none() && dev.processes.is_empty(), "{dev:?}");
    assert!(s.nvml.failed_readings.get("gpu_lost").copied().unwrap_or(0) >= 1, "{:?}", s.nvml.failed_readings);
    assert_eq!(s.nvml.status, NvmlStatus::Ready);
    let a = attribution(&s);
    let g = gpu(a, &gpu_uuid(0));
    assert_lines_add_up(g);
    assert_bill(a);
    // Nothing is made up for a GPU NVML cannot read: no memory lines, no container lines.
    assert!(g.memory.is_none(), "{:?}", g.memory);
    assert!(g.containers.is_empty(), "{:#?}", g.containers);
    assert_eq!(g.compute.device_activity_pct, None);
    assert_eq!(g.compute.method, ComputeMethod::None);
    assert!(a.containers.iter().all(|c| c.gpus.is_empty()), "no container was on a GPU nobody can read");
    // ... and the lost interval is not shown as idle, nor its energy estimated, nor billed as idle.
    assert!(g.lost && g.sharing_reason.contains("lost"), "{}", g.sharing_reason);
    assert!(g.energy.is_none(), "{:?}", g.energy);
    assert_eq!((g.compute.idle, g.compute.unattributed), (0, 100_000));
    if let Some(c) = &g.cost {
        assert_eq!(c.idle, 0, "{c:?}");
        assert_eq!(c.unattributed, c.price_nano, "{c:?}");
    }

    // NVML answers again: the numbers come back.
    std::thread::sleep(INTERVAL);
    sample(&mut t, &mut model, &driver, &busy);
    let s = t.settle();
    assert!(!s.nvml.sample.as_ref().unwrap().devices[0].lost);
    let a = attribution(&s);
    let g = gpu(a, &gpu_uuid(0));
    assert_lines_add_up(g);
    assert_bill(a);
    assert_eq!(line(g, pod.id()).memory_bytes, GIB + 256 * MIB);
    assert_eq!(line(g, pod.id()).sm_millipct, 40_000);
    assert_eq!(g.memory.unwrap().unattributed, 0);
}

/// A node without the NVIDIA kernel module (no `/proc/driver/nvidia`), NVML left to the loader's
/// search (which finds Debian's real libnvidia-ml1 here): NVML is not initialised, since NVIDIA's
/// library would create `/dev/nvidiactl` as root (tests/tests/nvml_host.rs). In `auto` mode the agent
/// runs on eBPF alone and says why NVML is not used; in `required` mode it does not start, and says why.
#[test]
fn nvml_without_the_kernel_module_is_reported_not_fatal_in_auto_mode() {
    let _s = serial();
    assert!(!Path::new("/proc/driver/nvidia").exists(), "this test is for a node without the NVIDIA driver");
    let driver = FakeDriver::start(1).unwrap();
    let cfg = |mode| Config {
        nvml: NvmlSettings { mode, library: None },
        attribution: AttributionSettings { price_per_gpu_hour: Some(PRICE_PER_GPU_HOUR), ..Default::default() },
        ..config_for(&driver)
    };
    let mut t = Tracer::start(cfg(SourceMode::Auto));
    let pod = PodCgroup::new().unwrap();
    let mut w = Workload::spawn(driver.dev_dir(), Some(&pod)).unwrap();
    ok(&mut w, "init 0");
    ok(&mut w, "alloc-rm 1073741824");
    t.agent.sample_now();
    let s = t.settle();
    assert_eq!(s.nvml.status, NvmlStatus::Unavailable);
    let reason = s.nvml.reason.as_deref().unwrap_or_default();
    assert!(reason.contains("NVML not initialised") && reason.contains("(/proc/driver/nvidia missing)"), "{reason}");
    assert!(reason.contains("modprobe nvidia") && reason.contains("nvml.mode"), "names the fix: {reason}");
    assert!(s.nvml.sample.is_none() && s.attribution.is_none());
    assert_eq!(cg_vidmem(&s, pod.id()), GIB, "the eBPF numbers are there without NVML");
    assert!(s.accounting.exact && s.accounting.dropped == 0, "{:?}", s.accounting);
    drop((w, t));

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _g = rt.enter();
    let err = match Agent::start(cfg(SourceMode::Required)) {
        Ok(_) => panic!("the agent started with nvml.mode = required and no NVIDIA kernel module"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("required") && err.contains("NVML not initialised"), "{err}");
}

/// NVML-only mode (every probe family off): no eBPF at all, and per-container memory and SM share
/// still come out of NVML and `/proc` (each PID's cgroup).
#[test]
fn nvml_only_mode_attributes_from_nvml_and_proc() {
    let _s = serial();
    let driver = FakeDriver::start(1).unwrap();
    let dir = TempDir::new("nvmlonly");
    let mut model = NvmlModel::install(&dir.0, &driver.stats().unwrap(), RESERVED).unwrap();
    let mut cfg = config(&driver, &model);
    cfg.families = Families { lifecycle: false, driver: false, cuda: false };
    let mut t = Tracer::start(cfg);
    assert!(!t.agent.has_probes());
    assert_eq!(t.agent.report().attach_mode, ProbeMode::NvmlOnly);
    assert_eq!(t.agent.report().attach_mode.as_str(), "none (nvml-only)");
    let pods: Vec<PodCgroup> = (0..2).map(|_| PodCgroup::new().unwrap()).collect();
    let mut w: Vec<Workload> = pods.iter().map(|p| Workload::spawn(driver.dev_dir(), Some(p)).unwrap()).collect();
    let alloc = [GIB, 3 * GIB];
    for (wl, bytes) in w.iter_mut().zip(alloc) {
        ok(wl, "init 0");
        ok(wl, &format!("alloc-rm {bytes}"));
    }
    let busy: BTreeMap<u32, Busy> =
        [(w[0].pid(), Busy { sm_pct: 35, mem_pct: 0 }), (w[1].pid(), Busy { sm_pct: 5, mem_pct: 0 })].into();
    let (_, _, s) = interval(&mut t, &mut model, &driver, &busy);
    assert_eq!(s.attach_mode, ProbeMode::NvmlOnly);
    assert!(s.state.processes.is_empty() && s.state.cgroups.is_empty(), "no eBPF, no ledger");
    assert_eq!(s.accounting.seen, 0);
    let a = attribution(&s);
    let g = gpu(a, &gpu_uuid(0));
    assert_lines_add_up(g);
    assert_bill(a);
    assert_eq!(g.sharing, SharingMode::TimeSlicing);
    for ((p, wl), (bytes, pct)) in pods.iter().zip(&w).zip(alloc.into_iter().zip([35u32, 5])) {
        let l = line(g, p.id());
        assert_eq!((l.memory_bytes, l.sm_millipct), (bytes, pct * 1000), "{}", p.relative_path());
        assert_eq!(l.memory_source, MemorySource::Nvml);
        assert_eq!(l.ledgers.driver_bytes, None, "no driver ledger without eBPF");
        assert_eq!(l.pids, vec![wl.pid()]);
        assert_eq!(l.name.as_deref(), Some(pod_name(p).as_str()));
    }
    let m = g.memory.unwrap();
    assert_eq!((m.unattributed, m.driver_reserved, m.free), (0, RESERVED, 80 * GIB - RESERVED - 4 * GIB));
    assert_eq!((g.compute.unattributed, g.compute.idle), (0, 60_000));
}
