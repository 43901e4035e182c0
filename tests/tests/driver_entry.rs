//! Root end-to-end tests of driver-entry mode: the `driver` family on the NVIDIA driver's own file
//! operations (`nvidia_open`, `nvidia_close`, `nvidia_unlocked_ioctl`, `uvm_*_entry`), against the
//! kernel-module double (tests/kmod, served by `fake-nvidia-driver --kmod`): real character
//! devices with major 195, real entry points, the workloads' real ioctls. The numbers asserted are
//! the driver family's exact bytes per cgroup, the same as agent.rs asserts in the syscall modes;
//! the comparisons run the same scene in btf-tracepoint mode on the same double.
//!
//! Every scene runs twice, under `auto` both times: on the double built with module BTF (as
//! Debian's own modules are), where driver-entry mode takes fentry/fexit, and on the same double
//! without it (as NVIDIA's DKMS builds usually are), where it takes kprobes. A kernel that loads no
//! module BTF (5.10: `CONFIG_DEBUG_INFO_BTF_MODULES` is 5.11+) has only the second: there each scene
//! runs once, on kprobes, and the reason `auto` gives is the missing BTF.
//!
//! kprobes and the module double need a Debian kernel the double is built for (this machine's 6.18
//! has no kprobes and cannot load modules built for another kernel): every test is `#[ignore]`d
//! (allowed in `cargo xtask test`, xtask/src/test/mod.rs) and runs in a guest: `cargo xtask
//! kernel-matrix [--kernel 5.10] --test driver_entry` builds the modules and passes
//! `--include-ignored`. Anywhere else with `--include-ignored`, each test fails naming what is
//! missing.
use std::{
    process::Command,
    sync::{Mutex, MutexGuard},
};

use gpu_tracer_tests::{
    Answer, FakeDriver, PodCgroup, Tracer, Workload, assert_accounting, cg_usage, config_for, require_root,
};
use tracer_core::{
    config::{AttachMode, Config},
    decode::Event,
    model::{
        AgentSnapshot,
        probes::{FamilyStatus, ProbeMode},
    },
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// One server at a time, global probes, two vCPUs: the tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

/// The double (one GPU) with the turn held; dropped before the turn is given up.
struct Scene {
    w: Vec<Workload>,
    pods: Vec<PodCgroup>,
    t: Tracer,
    d: FakeDriver,
    _turn: MutexGuard<'static, ()>,
}

/// The mechanism driver-entry mode is expected to take: which build of the double is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Probes {
    /// The double with module BTF: fentry/fexit.
    Fentry,
    /// The double without: kprobe/kretprobe.
    Kprobe,
}

/// The builds of the double this kernel can load, the one with module BTF first: both from 5.11,
/// before only the one without.
fn mechanisms() -> Vec<Probes> {
    if gpu_tracer_tests::harness::kmod::kernel_loads_module_btf() {
        vec![Probes::Fentry, Probes::Kprobe]
    } else {
        println!("this kernel loads no module BTF (5.11+): driver-entry on kprobes only");
        vec![Probes::Kprobe]
    }
}

/// The double the syscall-mode baselines run on: the first of [`mechanisms`].
fn baseline() -> Probes {
    mechanisms()[0]
}

impl Probes {
    /// What the driver family lists for the nvidia ioctl (its return: on trampolines the entry is
    /// there only with `ioctl_durations`).
    fn ioctl_probe(self) -> &'static str {
        match self {
            Probes::Fentry => "fexit/nvidia_unlocked_ioctl",
            Probes::Kprobe => "kretprobe/nvidia_unlocked_ioctl",
        }
    }
}

fn double(p: Probes) -> (MutexGuard<'static, ()>, FakeDriver) {
    require_root();
    let turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = FakeDriver::builder()
        .gpus(1)
        .module_btf(p == Probes::Fentry)
        .binary(env!("CARGO_BIN_EXE_fake-nvidia-driver"))
        .start_kmod()
        .unwrap_or_else(|e| panic!("the kernel-module double starts: {e}"));
    (turn, d)
}

/// The agent on the double's real character devices (no simulated devices) in `mode`; in
/// driver-entry mode, checked to be on the mechanism `p` expects.
fn agent(d: &FakeDriver, mode: AttachMode, p: Probes) -> Tracer {
    agent_with(Config { attach_mode: mode, simulated_devices: false, ..config_for(d) }, p)
}

fn agent_with(cfg: Config, p: Probes) -> Tracer {
    let mode = cfg.attach_mode;
    let t = Tracer::start(cfg);
    if mode == AttachMode::DriverEntry {
        let r = t.agent.report();
        let FamilyStatus::Attached { programs } = &r.driver else { panic!("driver family: {:?}", r.driver) };
        assert!(programs.iter().any(|x| x == p.ioctl_probe()), "{p:?}: {programs:?}");
    }
    t
}

fn workload(d: &FakeDriver, pod: &PodCgroup) -> Workload {
    Workload::builder(d.dev_dir())
        .binary(env!("CARGO_BIN_EXE_nv-workload"))
        .cgroup(pod)
        .spawn()
        .expect("nv-workload starts")
}

/// `pods` pods with one initialised workload each, under an agent in `mode`.
fn scene(mode: AttachMode, p: Probes, pods: usize) -> Scene {
    let (turn, d) = double(p);
    let t = agent(&d, mode, p);
    let pods: Vec<PodCgroup> = (0..pods).map(|_| PodCgroup::new().unwrap()).collect();
    let mut w: Vec<Workload> = pods.iter().map(|p| workload(&d, p)).collect();
    for wl in w.iter_mut() {
        ok(wl, "init 0");
    }
    Scene { w, pods, t, d, _turn: turn }
}

fn ok(w: &mut Workload, cmd: &str) -> Answer {
    let line = w.cmd(cmd).unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(line.starts_with("ok"), "{cmd} answered {line}");
    Answer::parse(&line)
}

fn handle(w: &mut Workload, cmd: &str) -> u32 {
    ok(w, cmd).handle("handle").unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

/// The three-pods scene (agent.rs's, phase for phase): bytes per cgroup after allocations, frees
/// and whole-client frees; the bytes per phase are returned for comparison between modes.
fn three_pods(mode: AttachMode, p: Probes) -> Vec<[u64; 3]> {
    let mut s = scene(mode, p, 3);
    let id = |s: &Scene, i: usize| s.pods[i].id();
    let snap0 = s.t.settle();
    let ioctls0: Vec<u64> = (0..3).map(|i| cg_usage(&snap0, id(&s, i)).ioctls).collect();
    assert!(ioctls0.iter().all(|n| *n > 0), "init issued ioctls in every pod: {ioctls0:?}");
    let a1 = handle(&mut s.w[0], "alloc-rm 1073741824");
    handle(&mut s.w[0], "alloc-vidheap 268435456");
    let b1 = handle(&mut s.w[1], "alloc-rm21 536870912");
    let c1 = handle(&mut s.w[2], "alloc-vidheap 2147483648");
    handle(&mut s.w[2], "alloc-rm 67108864 sysmem");
    let s1 = s.t.settle();
    let phase = |snap: &AgentSnapshot, s: &Scene| -> [u64; 3] {
        [
            cg_usage(snap, id(s, 0)).vidmem_bytes,
            cg_usage(snap, id(s, 1)).vidmem_bytes,
            cg_usage(snap, id(s, 2)).vidmem_bytes,
        ]
    };
    let p1 = phase(&s1, &s);
    assert_eq!(p1, [GIB + 256 * MIB, 512 * MIB, 2 * GIB], "{mode:?}");
    assert_eq!(cg_usage(&s1, id(&s, 2)).sysmem_bytes, 64 * MIB);
    assert_eq!(cg_usage(&s1, id(&s, 0)).ioctls, ioctls0[0] + 2);
    assert_eq!(cg_usage(&s1, id(&s, 1)).ioctls, ioctls0[1] + 1);
    let gpu0: u64 = s1.state.gpus.iter().filter(|g| g.minor == Some(0)).map(|g| g.usage.vidmem_bytes).sum();
    assert_eq!(gpu0, s1.state.totals.usage.vidmem_bytes, "every byte on GPU 0");
    ok(&mut s.w[0], &format!("free {a1:#x}"));
    ok(&mut s.w[1], &format!("free {b1:#x}"));
    ok(&mut s.w[2], &format!("free-vidheap {c1:#x}"));
    let s2 = s.t.settle();
    let p2 = phase(&s2, &s);
    assert_eq!(p2, [256 * MIB, 0, 0], "{mode:?}");
    ok(&mut s.w[0], "free-client");
    ok(&mut s.w[2], "free-client");
    let s3 = s.t.settle();
    assert_eq!(s3.state.totals.usage.vidmem_bytes, 0);
    assert_eq!(s3.state.totals.usage.sysmem_bytes, 0);
    let by_op = &s3.state.counters.ioctls_by_op;
    assert_eq!(by_op.get("vid_heap_alloc"), Some(&2), "{by_op:?}");
    assert_eq!(by_op.get("vid_heap_free"), Some(&1), "{by_op:?}");
    assert_accounting(&s3);
    // The driver's own ledger agrees: nothing of the freed clients is left in the double.
    let left = s.d.stats().expect("driver stats").used_bytes(0);
    assert_eq!(left, s3.state.totals.usage.vidmem_bytes, "the double's ledger and ours");
    println!("driver-entry: {mode:?} ({p:?}): phases {p1:?} {p2:?}; the double holds {left} bytes at the end");
    drop(s.w);
    vec![p1, p2]
}

#[test]
#[ignore = "runs in the Debian 6.1 and 5.10 guests: cargo xtask kernel-matrix --test driver_entry"]
fn auto_chooses_driver_entry_and_probes_only_the_drivers_entry_points() {
    for p in mechanisms() {
        let (_turn, d) = double(p);
        let t = agent(&d, AttachMode::Auto, p);
        let r = t.agent.report();
        assert_eq!(r.attach_mode, ProbeMode::Attached(AttachMode::DriverEntry), "{}", r.attach_reason);
        let FamilyStatus::Attached { programs } = &r.driver else { panic!("driver family: {:?}", r.driver) };
        let (entry, ret) = match p {
            Probes::Fentry => ("fentry", "fexit"),
            Probes::Kprobe => ("kprobe", "kretprobe"),
        };
        // On trampolines the ioctls' entries are left out unless durations are asked for (below).
        let timed = p == Probes::Kprobe;
        for (kind, func) in [
            (ret, "nvidia_unlocked_ioctl"),
            (entry, "nvidia_open"),
            (ret, "nvidia_open"),
            (entry, "nvidia_close"),
            (ret, "uvm_unlocked_ioctl_entry"),
            (entry, "uvm_open_entry"),
            (entry, "uvm_release_entry"),
            (entry, "uvm_mmap_entry"),
            (ret, "uvm_mmap_entry"),
            (entry, "uvm_vm_close_managed_entry"),
        ] {
            let want = format!("{kind}/{func}");
            assert!(programs.contains(&want), "{p:?}: {want} not in {programs:?}");
        }
        for func in ["nvidia_unlocked_ioctl", "uvm_unlocked_ioctl_entry"] {
            let want = format!("{entry}/{func}");
            assert_eq!(programs.contains(&want), timed, "{p:?}: {want} in {programs:?}");
        }
        // Nothing on the syscall path: other processes' syscalls run no program of ours.
        assert!(!programs.iter().any(|x| x.contains("sys_enter") || x.contains("sys_exit")), "{programs:?}");
        // Why this mechanism, in the list `doctor` shows.
        let why = programs.last().unwrap();
        match p {
            Probes::Fentry => assert!(why.contains("fentry/fexit: the modules have BTF"), "{why}"),
            Probes::Kprobe => assert!(why.contains("not fentry: nvidia.ko has no BTF"), "{why}"),
        }
        println!("driver-entry ({p:?}): attached {programs:?} ({})", r.attach_reason);
    }
}

/// The `duration_ns` of the NVIDIA ioctl events of one allocation by a fresh workload.
fn ioctl_durations(t: &mut Tracer, d: &FakeDriver) -> Vec<u64> {
    let pod = PodCgroup::new().unwrap();
    let mut w = workload(d, &pod);
    ok(&mut w, "init 0");
    handle(&mut w, "alloc-rm 1048576");
    let mut seen = Vec::new();
    // Every record of a completed call is in the ring buffer before the workload answers.
    t.agent.drain(&mut |ev, _| {
        if let Event::Ioctl(io) = ev {
            seen.push(io.duration_ns);
        }
    });
    assert!(seen.len() >= 3, "init and the allocation are NVIDIA ioctls: {seen:?}");
    assert_accounting(&t.settle());
    seen
}

/// On trampolines the ioctls are timed only with `ioctl_durations` (an fentry each); with
/// kprobes always (the entry probe runs anyway). A duration is measured or it is 0, never made up.
#[test]
#[ignore = "runs in the Debian 6.1 and 5.10 guests: cargo xtask kernel-matrix --test driver_entry"]
fn ioctl_durations_are_measured_where_the_entry_runs() {
    let cases = [(Probes::Fentry, false), (Probes::Fentry, true), (Probes::Kprobe, false)];
    for (p, durations) in cases.into_iter().filter(|(p, _)| mechanisms().contains(p)) {
        let (_turn, d) = double(p);
        let cfg = Config {
            attach_mode: AttachMode::DriverEntry,
            simulated_devices: false,
            ioctl_durations: durations,
            ..config_for(&d)
        };
        let mut t = agent_with(cfg, p);
        let why = t.agent.report().driver.clone();
        let got = ioctl_durations(&mut t, &d);
        let timed = durations || p == Probes::Kprobe;
        if timed {
            assert!(got.iter().all(|ns| *ns > 0), "{p:?} durations {durations}: {got:?} ({why:?})");
        } else {
            assert!(got.iter().all(|ns| *ns == 0), "{p:?} durations {durations}: {got:?} ({why:?})");
        }
        println!("{p:?}, ioctl_durations = {durations}: ioctl durations {got:?}");
    }
}

#[test]
#[ignore = "runs in the Debian 6.1 and 5.10 guests: cargo xtask kernel-matrix --test driver_entry"]
fn three_pods_one_gpu_give_the_same_bytes_in_driver_entry_and_btf_tracepoint_mode() {
    let btf = three_pods(AttachMode::BtfTracepoint, baseline());
    for p in mechanisms() {
        let entry = three_pods(AttachMode::DriverEntry, p);
        assert_eq!(entry, btf, "driver-entry ({p:?}) and btf-tracepoint disagree on the same double");
    }
}

#[test]
#[ignore = "runs in the Debian 6.1 and 5.10 guests: cargo xtask kernel-matrix --test driver_entry"]
fn a_killed_process_releases_its_memory_at_exit_in_driver_entry_mode() {
    mechanisms().into_iter().for_each(killed);
}

fn killed(p: Probes) {
    let mut s = scene(AttachMode::DriverEntry, p, 1);
    handle(&mut s.w[0], "alloc-rm 2147483648");
    handle(&mut s.w[0], "alloc-vidheap 1073741824");
    let snap = s.t.settle();
    assert_eq!(cg_usage(&snap, s.pods[0].id()).vidmem_bytes, 3 * GIB);
    let pid = s.w[0].pid();
    drop(s.w.pop()); // SIGKILL: no frees, no closes
    let snap = s.t.wait_for("process exit", |x| !x.state.processes.iter().any(|p| p.tgid == pid));
    assert_eq!(cg_usage(&snap, s.pods[0].id()).vidmem_bytes, 0);
    assert_eq!(snap.state.totals.usage.vidmem_bytes, 0);
    assert_accounting(&snap);
}

/// dup and close are not driver calls: the driver sees one file, and releases it (and the clients
/// allocated through it) when its last fd is closed. So does the ledger, through the release probe.
#[test]
#[ignore = "runs in the Debian 6.1 and 5.10 guests: cargo xtask kernel-matrix --test driver_entry"]
fn a_dup_fd_is_the_same_file_and_its_release_frees_the_clients() {
    mechanisms().into_iter().for_each(dup);
}

fn dup(p: Probes) {
    let mut s = scene(AttachMode::DriverEntry, p, 1);
    ok(&mut s.w[0], "dup ctl");
    ok(&mut s.w[0], "close-orig ctl");
    let h = handle(&mut s.w[0], "alloc-rm 805306368");
    let snap = s.t.settle();
    assert_eq!(cg_usage(&snap, s.pods[0].id()).vidmem_bytes, 768 * MIB, "allocation through the dup is seen");
    ok(&mut s.w[0], &format!("free {h:#x}"));
    handle(&mut s.w[0], "alloc-vidheap 134217728");
    let snap = s.t.settle();
    assert_eq!(cg_usage(&snap, s.pods[0].id()).vidmem_bytes, 128 * MIB);
    ok(&mut s.w[0], "close-all");
    let snap = s.t.settle();
    assert_eq!(cg_usage(&snap, s.pods[0].id()).vidmem_bytes, 0);
    assert_eq!(snap.state.counters.released_by.get("fd_release"), Some(&1), "{:?}", snap.state.counters.released_by);
    assert_accounting(&snap);
}

#[test]
#[ignore = "runs in the Debian 6.1 and 5.10 guests: cargo xtask kernel-matrix --test driver_entry"]
fn bad_ioctl_arguments_are_malformed_events_in_driver_entry_mode() {
    mechanisms().into_iter().for_each(bad_arguments);
}

fn bad_arguments(p: Probes) {
    let mut s = scene(AttachMode::DriverEntry, p, 1);
    let s0 = s.t.settle();
    for cmd in ["bad-null", "bad-unmapped", "bad-guard", "bad-size", "bad-unknown", "bad-nested-null", "bad-race 300"] {
        let line = s.w[0].cmd(cmd).unwrap_or_else(|e| panic!("{cmd}: {e}"));
        assert!(line.starts_with("ok"), "{cmd}: {line}");
    }
    let snap = s.t.settle();
    let m = &snap.state.counters.malformed_by_reason;
    let before: u64 = s0.state.counters.malformed_by_reason.values().sum();
    let total: u64 = m.values().sum();
    assert!(total - before >= 4, "malformed by reason: {m:?}");
    assert!(m.keys().any(|k| k.contains("fault")), "{m:?}");
    assert_accounting(&snap);
    let u = cg_usage(&snap, s.pods[0].id());
    assert_eq!(u.vidmem_bytes, snap.state.totals.usage.vidmem_bytes);
    handle(&mut s.w[0], "alloc-rm 1048576");
    let snap = s.t.settle();
    assert_eq!(cg_usage(&snap, s.pods[0].id()).vidmem_bytes, u.vidmem_bytes + MIB);
}

/// A workload that opened the devices before the agent started: its files are registered at their
/// first call (the driver's open was before the probes), and its new allocations are counted.
#[test]
#[ignore = "runs in the Debian 6.1 and 5.10 guests: cargo xtask kernel-matrix --test driver_entry"]
fn files_opened_before_the_agent_are_registered_at_their_first_call() {
    mechanisms().into_iter().for_each(opened_before);
}

fn opened_before(p: Probes) {
    let (_turn, d) = double(p);
    let pod = PodCgroup::new().unwrap();
    let mut w = workload(&d, &pod);
    ok(&mut w, "init 0");
    let mut t = agent(&d, AttachMode::DriverEntry, p);
    handle(&mut w, "alloc-rm 536870912");
    let snap = t.settle();
    assert_eq!(cg_usage(&snap, pod.id()).vidmem_bytes, 512 * MIB);
    ok(&mut w, "close-all");
    let snap = t.settle();
    assert_eq!(cg_usage(&snap, pod.id()).vidmem_bytes, 0, "the release of the file frees what was counted");
    assert_accounting(&snap);
}

/// Under exactly the chart's capabilities (no CAP_SYS_ADMIN), `doctor` with the defaults: kprobes
/// are perf events of the kprobe PMU, so where `kernel.perf_event_paranoid` is 3 or more (Debian's
/// default, and this guest's unless `--sysctl` lowers it) `auto` finds driver-entry refused, falls
/// back to btf-tracepoint with the driver family attached, and the reason names the sysctl and the
/// fix; below 3, CAP_PERFMON is enough and driver-entry attaches.
#[test]
#[ignore = "runs in the Debian 6.1 and 5.10 guests: cargo xtask kernel-matrix --test driver_entry"]
fn under_the_charts_capabilities_auto_takes_driver_entry_only_where_perf_events_are_allowed() {
    // The double with BTF where the kernel loads it: fentry needs CAP_SYS_ADMIN to open the
    // module's BTF, so even there the chart's capabilities leave driver-entry mode with kprobes only.
    let (_turn, _d) = double(baseline());
    let gpu_tracer = gpu_tracer_tests::gpu_tracer();
    // Before 5.11 the chart needs `memlockCapability=true` (SYS_RESOURCE: map memory is charged to
    // RLIMIT_MEMLOCK there; least_privilege.rs checks both sides).
    let memlock = if gpu_tracer_tests::kernel_at_least(5, 11) { "" } else { ",+sys_resource" };
    let out = Command::new("setpriv")
        .arg("--bounding-set")
        .arg(format!("-all,+bpf,+perfmon,+sys_ptrace,+dac_read_search{memlock}"))
        .args(["--inh-caps", "-all", "--"])
        .arg(gpu_tracer)
        .args(["--log", "error", "doctor", "--json"])
        .output()
        .expect("setpriv (util-linux) runs gpu-tracer");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor --json: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    let probes = &v["probes"];
    assert_eq!(probes["driver"]["state"], "attached", "{probes:#}");
    let paranoid: i32 =
        std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid").unwrap().trim().parse().unwrap();
    let why = probes["attach_reason"].as_str().unwrap_or_default();
    let perf =
        v["checks"].as_array().unwrap().iter().find(|c| c["name"] == "perf events").expect("a perf events check");
    if paranoid >= 3 {
        assert_eq!(probes["attach_mode"], "btf-tracepoint", "{probes:#}");
        assert!(why.contains("driver-entry did not attach") && why.contains("kprobe/nvidia_"), "{why}");
        if baseline() == Probes::Fentry {
            assert!(why.contains("not fentry") && why.contains("CAP_SYS_ADMIN"), "{why}");
        } else {
            assert!(why.contains("not fentry: nvidia.ko has no BTF"), "{why}");
        }
        assert!(why.contains(&format!("perf_event_paranoid is {paranoid}")) && why.contains("fix:"), "{why}");
        let detail = perf["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("driver-entry mode's kprobes are refused"), "{perf:#}");
    } else {
        assert_eq!(probes["attach_mode"], "driver-entry", "{probes:#}");
        let programs = probes["driver"]["programs"].to_string();
        let not_fentry = if baseline() == Probes::Fentry { "CAP_SYS_ADMIN" } else { "nvidia.ko has no BTF" };
        assert!(programs.contains("kprobe/nvidia_unlocked_ioctl") && programs.contains(not_fentry), "{programs}");
    }
    println!("perf_event_paranoid {paranoid}: attach mode {} ({why})", probes["attach_mode"]);
}

/// Managed memory (`cudaMallocManaged`'s mappings of `/dev/nvidia-uvm`): in driver-entry mode seen
/// at the driver's `uvm_mmap_entry` (its return) and the managed VMA's close
/// (`uvm_vm_close_managed_entry`), not at the mmap/munmap syscalls; the bytes per cgroup after two
/// mappings, an munmap and the process's exit are the same as btf-tracepoint mode's on the same
/// double.
fn managed(mode: AttachMode, p: Probes) -> [u64; 3] {
    let mut s = scene(mode, p, 1);
    let id = s.pods[0].id();
    let a = ok(&mut s.w[0], "managed-mmap 33554432").number("addr").unwrap();
    ok(&mut s.w[0], "managed-mmap 67108864");
    let s1 = s.t.settle();
    let u1 = cg_usage(&s1, id);
    assert_eq!((u1.managed_bytes, u1.managed_mappings), (96 * MIB, 2), "{mode:?}: {u1:?}");
    ok(&mut s.w[0], &format!("managed-munmap {a:#x}"));
    let s2 = s.t.settle();
    let u2 = cg_usage(&s2, id);
    assert_eq!((u2.managed_bytes, u2.managed_mappings), (64 * MIB, 1), "{mode:?}: {u2:?}");
    let pid = s.w[0].pid();
    drop(s.w.pop()); // SIGKILL: the mapping goes with the process
    let s3 = s.t.wait_for("process exit", |x| !x.state.processes.iter().any(|p| p.tgid == pid));
    assert_eq!(s3.state.totals.usage.managed_bytes, 0, "{mode:?}");
    assert_accounting(&s3);
    println!("{mode:?} ({p:?}): managed bytes {} -> {} -> 0", u1.managed_bytes, u2.managed_bytes);
    [u1.managed_bytes, u2.managed_bytes, s3.state.totals.usage.managed_bytes]
}

#[test]
#[ignore = "runs in the Debian 6.1 and 5.10 guests: cargo xtask kernel-matrix --test driver_entry"]
fn managed_mappings_give_the_same_bytes_in_driver_entry_and_btf_tracepoint_mode() {
    let btf = managed(AttachMode::BtfTracepoint, baseline());
    for p in mechanisms() {
        assert_eq!(managed(AttachMode::DriverEntry, p), btf, "{p:?}");
    }
}
