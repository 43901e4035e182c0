//! End-to-end tests of the `cuda` family: real uprobes on the fake libcuda (three prologue variants)
//! and on the real libcuda, workloads in pod cgroups, exact counts. Needs root.
use std::{sync::Mutex, time::Duration};

use gpu_tracer_tests::{
    FakeDriver, PodCgroup, Tracer, Workload, auto_cuda_method, config_for, eventually, fake_libcuda,
    fake_libcuda::{PLAIN, PROTECTED},
    kernel_at_least, require_root,
};
use tracer_core::{
    config::{CudaAttach, CudaEntryPrograms},
    cuda::ledger::CudaUsage,
    model::{
        AgentSnapshot,
        probes::{FamilyStatus, Method},
    },
};

const MIB: u64 = 1 << 20;

static SERIAL: Mutex<()> = Mutex::new(());

/// The agent on `driver` with the cuda family probing `libs`.
fn tracer(driver: &FakeDriver, libs: Vec<std::path::PathBuf>) -> Tracer {
    let mut cfg = config_for(driver);
    cfg.families.cuda = true;
    cfg.cuda_libraries = libs;
    Tracer::start(cfg)
}

fn cg(s: &AgentSnapshot, id: u64) -> CudaUsage {
    s.cuda.cgroups.iter().find(|c| c.cgroup_id == id).map(|c| c.usage).unwrap_or_default()
}

fn proc_(s: &AgentSnapshot, tgid: u32) -> CudaUsage {
    s.cuda.processes.iter().find(|p| p.tgid == tgid).map(|p| p.usage).unwrap_or_default()
}

fn ok(w: &mut Workload, cmd: &str) -> gpu_tracer_tests::Answer {
    w.ok(cmd).unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

/// Launch counts and live CUDA bytes per cgroup are exact, in every prologue variant, with the
/// uprobes attached by `method` (`cuda_attach`).
fn counts_and_ledger(variant: &str, method: CudaAttach) {
    counts_and_ledger_with(variant, method, CudaEntryPrograms::Auto);
}

/// [`counts_and_ledger`] with the entry programs `entries` (`cuda_entry_programs`). Before 5.15
/// (no attach cookies) `auto` is one program per entry point, and the report says so.
fn counts_and_ledger_with(variant: &str, method: CudaAttach, entries: CudaEntryPrograms) {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lib = fake_libcuda(variant);
    let driver = FakeDriver::start(1).unwrap();
    let mut cfg = config_for(&driver);
    cfg.families.cuda = true;
    cfg.cuda_libraries = vec![lib.clone()];
    cfg.cuda_attach = method;
    cfg.cuda_entry_programs = entries;
    // The timed entry points too (every entry point placed in every prologue variant), except with
    // perf events, whose detach takes an RCU grace period per uprobe.
    cfg.cuda_timed_calls = method != CudaAttach::PerfEvent && entries != CudaEntryPrograms::PerEntry;
    let expected = tracer_common::cuda_entry::ALL
        .iter()
        .filter(|(_, _, a)| cfg.cuda_timed_calls || *a != tracer_common::cuda_entry::Action::Timed)
        .count();
    let mut t = Tracer::start(cfg);
    let r = t.agent.report();
    assert!(matches!(r.cuda, FamilyStatus::Attached { .. }), "{:?}", r.cuda);
    // `auto` picks multi-uprobe links where the kernel has them (6.6+), perf events before.
    let want = match (method, entries) {
        (_, CudaEntryPrograms::PerEntry) | (CudaAttach::PerfEvent, _) => Method::PerfEvent,
        (CudaAttach::UprobeMulti, _) => Method::UprobeMulti,
        (CudaAttach::Auto, _) => auto_cuda_method(),
    };
    assert!(r.cuda_libraries.iter().all(|l| l.method == want), "{:#?}", r.cuda_libraries);
    // One program per entry point where asked, and wherever perf events are used before 5.15.
    let per_entry = entries == CudaEntryPrograms::PerEntry || (want != Method::UprobeMulti && !kernel_at_least(5, 15));
    assert!(
        r.cuda_libraries.iter().all(|l| l.method_detail.contains("one program per entry point") == per_entry),
        "per entry point: {per_entry}: {:#?}",
        r.cuda_libraries
    );
    let attached: usize = r.cuda_libraries.iter().map(|l| l.attached()).sum();
    assert_eq!(attached, expected, "{:#?}", r.cuda_libraries);

    let pods: Vec<PodCgroup> = (0..2).map(|_| PodCgroup::new().unwrap()).collect();
    let mut w: Vec<Workload> =
        pods.iter().map(|p| Workload::builder(driver.dev_dir()).cgroup(p).libcuda(&lib).spawn().unwrap()).collect();
    for wl in w.iter_mut() {
        ok(wl, "cuda-init");
    }
    ok(&mut w[0], "cuda-launch 1000");
    ok(&mut w[0], "cuda-launch-ptsz 250");
    ok(&mut w[0], "cuda-graph-launch 7");
    ok(&mut w[1], "cuda-launch-ex 300");
    ok(&mut w[1], "cuda-launch-threads 2 500");
    let p0 = ok(&mut w[0], "cuda-alloc 268435456").number("ptr").unwrap();
    let _p1 = ok(&mut w[0], "cuda-alloc-async 67108864").number("ptr").unwrap();
    let _m = ok(&mut w[1], "cuda-alloc-managed 33554432").number("ptr").unwrap();
    let s = t.settle();
    let (a, b) = (cg(&s, pods[0].id()), cg(&s, pods[1].id()));
    assert_eq!((a.launches, a.graph_launches), (1250, 7), "{a:?}");
    assert_eq!((b.launches, b.graph_launches), (1300, 0), "{b:?}");
    assert_eq!(a.device_bytes, 256 * MIB + 64 * MIB);
    assert_eq!(b.managed_bytes, 32 * MIB);
    assert_eq!(proc_(&s, w[0].pid()).launches, 1250);
    assert_eq!(s.cuda.calls_by_entry.get("cuLaunchKernel_ptsz"), Some(&250));

    ok(&mut w[0], &format!("cuda-free {p0:#x}"));
    let s = t.settle();
    assert_eq!(cg(&s, pods[0].id()).device_bytes, 64 * MIB);

    // A process that exits with live allocations releases them; its launches stay with the pod.
    let pid1 = w[1].pid();
    drop(w.pop());
    let s = eventually("cuda process exit", Duration::from_secs(30), || {
        t.agent.drain(&mut |_, _| {});
        let s = t.agent.snapshot();
        (!s.cuda.processes.iter().any(|p| p.tgid == pid1)).then_some(s)
    })
    .unwrap();
    let b = cg(&s, pods[1].id());
    assert_eq!((b.launches, b.managed_bytes), (1300, 0), "{b:?}");
    // Accounting: every call was either aggregated in the kernel or sent; nothing dropped.
    assert_eq!(s.accounting.dropped, 0);
    for (name, c) in &s.kernel.probes {
        assert_eq!(c.seen, c.emitted + c.aggregated + c.dropped(), "probe {name}: {c:?}");
    }
    let calls = s.kernel.get("cuda_call");
    assert_eq!(calls.aggregated, calls.seen, "{calls:?}");
    assert!(s.accounting.aggregated >= 2550 + 7, "{:?}", s.accounting);
}

#[test]
fn cuda_counts_and_ledger_push_prologue() {
    counts_and_ledger(PLAIN, CudaAttach::Auto);
}

#[test]
fn cuda_counts_and_ledger_endbr64_prologue() {
    // Multi links explicitly where the kernel has them; before 6.6 the setting fails the family.
    counts_and_ledger(PROTECTED, if kernel_at_least(6, 6) { CudaAttach::UprobeMulti } else { CudaAttach::Auto });
}

/// The fallback for kernels before 6.6 (and `cuda_attach = "perf-event"`): the same numbers.
#[test]
fn cuda_counts_and_ledger_push_prologue_perf_events() {
    counts_and_ledger(PLAIN, CudaAttach::PerfEvent);
}

/// One program per entry point, without attach cookies (what 5.10–5.14 get), on any kernel: the
/// same numbers.
#[test]
fn cuda_counts_and_ledger_one_program_per_entry_point() {
    counts_and_ledger_with(PROTECTED, CudaAttach::Auto, CudaEntryPrograms::PerEntry);
}

#[test]
fn cuda_counts_and_ledger_thunk_prologue() {
    counts_and_ledger("thunk", CudaAttach::Auto);
}

#[test]
fn real_libcuda_entry_points_attach_past_the_thunks() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let real = std::path::PathBuf::from(fake_libcuda::REAL_LIBCUDA);
    assert!(real.exists(), "the real libcuda is missing: `cargo xtask setup` installs Debian's libcuda1");
    let driver = FakeDriver::start(1).unwrap();
    let mut cfg = config_for(&driver);
    cfg.families.cuda = true;
    cfg.cuda_libraries = vec![real];
    cfg.cuda_timed_calls = true;
    let t = Tracer::start(cfg);
    let r = t.agent.report();
    assert!(matches!(r.cuda, FamilyStatus::Attached { .. }), "{:?}", r.cuda);
    let lib = &r.cuda_libraries[0];
    assert_eq!(lib.method, auto_cuda_method(), "{}", lib.method_detail);
    // Every entry point of the real 535 library, the timed ones included, is placed and attached.
    let not: Vec<String> =
        lib.entries.iter().filter(|e| e.status != "attached").map(|e| format!("{}: {}", e.symbol, e.detail)).collect();
    assert!(not.is_empty(), "{not:#?}");
    assert_eq!(lib.entries.len(), tracer_common::cuda_entry::COUNT as usize);
    for name in
        ["cuLaunchKernel", "cuMemAlloc_v2", "cuMemFree_v2", "cuGraphLaunch", "cuStreamSynchronize", "cuMemcpyAsync"]
    {
        let e = lib.entries.iter().find(|e| e.symbol == name).unwrap();
        assert_eq!(e.status, "attached", "{name}: {}", e.detail);
        // x86-64: past the thunk, at the implementation. arm64: at the symbol, on the thunk's
        // `adrp`, which the kernel simulates (cuda::placement::aarch64).
        #[cfg(not(target_arch = "aarch64"))]
        assert!(e.detail.to_lowercase().contains("thunk"), "{name} placed past the thunk: {}", e.detail);
        #[cfg(target_arch = "aarch64")]
        assert!(e.detail.contains("first insn `adrp`"), "{name} placed on the thunk's adrp: {}", e.detail);
    }
}

/// A container brings its own libcuda (another file, another inode): it is found in the process's
/// mappings when the process opens the GPU, and probed from then on.
#[test]
fn a_second_libcuda_copy_in_a_process_is_found_and_probed() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("gt-libcuda-copy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("libcuda.so.1");
    std::fs::copy(fake_libcuda("thunk"), &copy).unwrap();
    let driver = FakeDriver::start(1).unwrap();
    // The agent knows only the host's library (here: the fake push variant).
    let mut t = tracer(&driver, vec![fake_libcuda(PLAIN)]);
    let pod = PodCgroup::new().unwrap();
    let mut w = Workload::builder(driver.dev_dir()).cgroup(&pod).libcuda(&copy).spawn().unwrap();
    ok(&mut w, "cuda-init");
    ok(&mut w, "cuda-launch 10"); // before the process touched the GPU: not seen
    ok(&mut w, "init 0"); // opens /dev/nvidiactl: the agent reads its mappings
    t.settle();
    assert_eq!(t.agent.stats.cuda_libraries_found, 1, "errors: {}", t.agent.stats.cuda_library_errors);
    assert!(t.agent.cuda_late_libraries()[0].path.ends_with("libcuda.so.1"));
    // Through /proc/PID/root, too.
    assert_eq!(t.agent.cuda_late_libraries()[0].method, auto_cuda_method());
    ok(&mut w, "cuda-launch 400");
    let s = t.settle();
    assert_eq!(cg(&s, pod.id()).launches, 400);
    // When the last process known to map the copy exits, its probes are detached.
    let pid = w.pid();
    drop(w);
    eventually("copy detached", Duration::from_secs(20), || {
        t.agent.drain(&mut |_, _| {});
        (t.agent.stats.cuda_libraries_detached == 1).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}: pid {pid} exit not seen or not detached"));
    // The copy's uprobes are unregistered on a thread of their own (seconds); a process mapping
    // the copy right away gets it probed again once that is done, and every launch counted once.
    let mut w2 = Workload::builder(driver.dev_dir()).cgroup(&pod).libcuda(&copy).spawn().unwrap();
    ok(&mut w2, "cuda-init");
    ok(&mut w2, "init 0");
    t.settle();
    assert_eq!(t.agent.stats.cuda_libraries_found, 2, "errors: {}", t.agent.stats.cuda_library_errors);
    ok(&mut w2, "cuda-launch 50");
    let s = t.settle();
    assert_eq!(cg(&s, pod.id()).launches, 450);
    drop(w2);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A uprobe on a library inode covers processes that mapped it before the agent started.
#[test]
fn a_cuda_process_running_before_the_agent_is_counted() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lib = fake_libcuda(PROTECTED);
    let driver = FakeDriver::start(1).unwrap();
    let pod = PodCgroup::new().unwrap();
    let mut w = Workload::builder(driver.dev_dir()).cgroup(&pod).libcuda(&lib).spawn().unwrap();
    ok(&mut w, "cuda-init");
    ok(&mut w, "cuda-launch 50"); // before the agent: not seen
    let mut t = tracer(&driver, vec![lib]);
    ok(&mut w, "cuda-launch 321");
    let p = ok(&mut w, "cuda-alloc 4194304").number("ptr").unwrap();
    let s = t.settle();
    let u = cg(&s, pod.id());
    assert_eq!((u.launches, u.device_bytes), (321, 4 << 20), "{u:?}");
    ok(&mut w, &format!("cuda-free {p:#x}"));
    let s = t.settle();
    assert_eq!(cg(&s, pod.id()).device_bytes, 0);
}

/// Drain until quiescent, keeping the per-event launches (with the names the agent resolved).
fn launches(t: &mut Tracer) -> Vec<(tracer_core::decode::Event, Option<String>)> {
    let mut out = Vec::new();
    eventually("tracer quiescent", Duration::from_secs(10), || {
        t.agent.drain(&mut |ev, id| {
            if matches!(ev, tracer_core::decode::Event::CudaLaunch { .. }) {
                out.push((ev.clone(), id.kernel_name.clone()));
            }
        });
        t.agent.snapshot().accounting.exact.then_some(())
    })
    .unwrap();
    out
}

#[test]
fn per_event_mode_switches_on_and_off_while_the_workload_runs() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lib = fake_libcuda("thunk");
    let driver = FakeDriver::start(1).unwrap();
    let mut t = tracer(&driver, vec![lib.clone()]);
    let pod = PodCgroup::new().unwrap();
    let mut w = Workload::builder(driver.dev_dir()).cgroup(&pod).libcuda(&lib).spawn().unwrap();
    let func = ok(&mut w, "cuda-init").number("func").unwrap();
    ok(&mut w, "cuda-launch 5");
    assert!(launches(&mut t).is_empty(), "count mode sends no launch events");

    t.agent.set_per_event(&[pod.id()], &[]).unwrap();
    ok(&mut w, "cuda-launch 7");
    ok(&mut w, "cuda-launch-ex 2");
    let got = launches(&mut t);
    assert_eq!(got.len(), 9, "{got:#?}");
    for (ev, name) in &got {
        let tracer_core::decode::Event::CudaLaunch { function, grid, block, shared_mem_bytes, stream, .. } = ev else {
            unreachable!()
        };
        assert_eq!((*grid, *block, *shared_mem_bytes), ([128, 2, 1], [32, 4, 2], 4096), "{ev:?}");
        assert_eq!(*function, func);
        assert_ne!(*stream, 0);
        assert_eq!(name.as_deref(), Some("fake_kernel"));
    }

    t.agent.set_per_event(&[], &[]).unwrap();
    ok(&mut w, "cuda-launch 3");
    assert!(launches(&mut t).is_empty(), "switched off again");
    let s = t.settle();
    assert_eq!(cg(&s, pod.id()).launches, 17, "every launch is counted in every mode");
}

/// A per-event selection carries a deadline the kernel programs check: past it, launches are
/// counted again but no longer sent one by one, though nothing in user space switched it off
/// (what keeps a killed profiler or a lost `--connect` client from leaving per-event mode on).
#[test]
fn per_event_mode_ends_by_itself_at_its_deadline() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lib = fake_libcuda("thunk");
    let driver = FakeDriver::start(1).unwrap();
    let mut t = tracer(&driver, vec![lib.clone()]);
    let pod = PodCgroup::new().unwrap();
    let mut w = Workload::builder(driver.dev_dir()).cgroup(&pod).libcuda(&lib).spawn().unwrap();
    ok(&mut w, "cuda-init");
    let window = Duration::from_millis(1500);
    let switched = std::time::Instant::now();
    t.agent.set_per_event_for(&[], &[w.pid()], window).unwrap();
    ok(&mut w, "cuda-launch 6");
    assert!(switched.elapsed() < window, "the launches ran inside the window (a slow machine: rerun)");
    assert_eq!(launches(&mut t).len(), 6);
    std::thread::sleep(window.saturating_sub(switched.elapsed()) + Duration::from_millis(50));
    ok(&mut w, "cuda-launch 4");
    assert!(launches(&mut t).is_empty(), "the selection expired in the kernel");
    let s = t.settle();
    assert_eq!(cg(&s, pod.id()).launches, 10, "every launch is counted in every mode");
}

/// Synchronisation, event, copy and memset calls: counted in count mode; in per-event mode each is
/// also reported with its entry and return time, so the host time a synchronisation blocked is
/// measured (the fake's simulated GPU time: 2 ms a launch).
#[test]
fn timed_calls_are_counted_and_in_per_event_mode_timed() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lib = fake_libcuda("thunk");
    let driver = FakeDriver::start(1).unwrap();
    let mut cfg = config_for(&driver);
    cfg.families.cuda = true;
    cfg.cuda_libraries = vec![lib.clone()];
    cfg.cuda_timed_calls = true;
    let mut t = Tracer::start(cfg);
    let pod = PodCgroup::new().unwrap();
    // Each simulated kernel runs 2 ms (longer on a slower host: the event must still be pending
    // when the test queries it, a few commands after the launches).
    let kernel_ns = 2_000_000 * u64::from(gpu_tracer_tests::time_scale());
    let mut w = Workload::builder(driver.dev_dir())
        .cgroup(&pod)
        .libcuda(&lib)
        .env("FAKE_LIBCUDA_KERNEL_NS", &kernel_ns.to_string())
        .spawn()
        .unwrap();
    let stream = ok(&mut w, "cuda-init").number("stream").unwrap();
    let ptr = ok(&mut w, "cuda-alloc 1048576").number("ptr").unwrap();
    ok(&mut w, &format!("cuda-memcpy-htod {ptr:#x} 4096"));
    ok(&mut w, "cuda-stream-sync");
    let timed = |t: &mut Tracer| {
        let mut out = Vec::new();
        eventually("tracer quiescent", Duration::from_secs(10), || {
            t.agent.drain(&mut |ev, _| {
                if let tracer_core::decode::Event::CudaTimed { entry, start_ktime_ns, header, args, result } = ev {
                    out.push((*entry, header.ktime_ns - start_ktime_ns, *args, *result));
                }
            });
            t.agent.snapshot().accounting.exact.then_some(())
        })
        .unwrap();
        out
    };
    assert!(timed(&mut t).is_empty(), "count mode sends no timed calls");

    t.agent.set_per_event(&[], &[w.pid()]).unwrap();
    ok(&mut w, "cuda-launch 10"); // 10 kernels of simulated GPU work on the stream
    let blocked = ok(&mut w, "cuda-stream-sync").number("ns").unwrap();
    let event = ok(&mut w, "cuda-event-create").number("event").unwrap();
    ok(&mut w, "cuda-launch 5");
    ok(&mut w, &format!("cuda-event-record {event:#x}"));
    assert_eq!(ok(&mut w, &format!("cuda-event-query {event:#x}")).number("ready").unwrap(), 0);
    let event_blocked = ok(&mut w, &format!("cuda-event-sync {event:#x}")).number("ns").unwrap();
    ok(&mut w, &format!("cuda-memcpy-dtoh {ptr:#x} 8192"));
    ok(&mut w, &format!("cuda-memset-d32-async {ptr:#x} 100"));
    ok(&mut w, "cuda-ctx-sync");
    let got = timed(&mut t);
    let entries: Vec<u32> = got.iter().map(|g| g.0).collect();
    use tracer_common::cuda_entry as ce;
    assert_eq!(
        entries,
        vec![
            ce::STREAM_SYNCHRONIZE,
            ce::EVENT_RECORD,
            ce::EVENT_QUERY,
            ce::EVENT_SYNCHRONIZE,
            ce::MEMCPY_DTOH,
            ce::MEMSET_D32_ASYNC,
            ce::CTX_SYNCHRONIZE
        ],
        "{got:#?}"
    );
    let (_, d, args, _) = got[0];
    assert_eq!(args[0], stream);
    assert!(blocked >= kernel_ns * 15 / 2, "the fake blocked for the simulated work: {blocked} ns");
    assert!(
        d >= blocked * 9 / 10 && d <= blocked + kernel_ns * 5 / 2,
        "the probe's duration {d} vs the workload's {blocked}"
    );
    assert_eq!(got[2].3, 600, "the query found the event not ready (CUDA_ERROR_NOT_READY)");
    // The probes' own traps (entry and return) fall inside the workload's clock but outside the
    // probe's window: about a microsecond each here, far more under QEMU's TCG (time_scale).
    let traps = gpu_tracer_tests::scaled(Duration::from_micros(100)).as_nanos() as u64;
    assert!(got[3].1 + traps >= event_blocked * 9 / 10, "{} vs {event_blocked}", got[3].1);
    assert_eq!((got[4].2[1], got[4].2[2]), (ptr, 8192));

    t.agent.set_per_event(&[], &[]).unwrap();
    let s = t.settle();
    let calls = |symbol: &str| s.cuda.calls_by_entry.get(symbol).copied();
    assert_eq!(calls("cuStreamSynchronize"), Some(2), "{:?}", s.cuda.calls_by_entry);
    assert_eq!(calls("cuMemcpyHtoD_v2"), Some(1), "counted in count mode too");
    assert_eq!(calls("cuEventQuery"), Some(1));
    assert_eq!(calls("cuCtxSynchronize"), Some(1));
}

/// Without `cuda_timed_calls` (the default) the timed entry points are not probed at all: the
/// node's synchronisations and copies pay nothing.
#[test]
fn timed_entry_points_are_not_probed_by_default() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lib = fake_libcuda("thunk");
    let driver = FakeDriver::start(1).unwrap();
    let t = tracer(&driver, vec![lib.clone()]);
    let report = &t.agent.report().cuda_libraries[0];
    let symbols: Vec<&str> = report.entries.iter().map(|e| e.symbol).collect();
    assert!(symbols.contains(&"cuLaunchKernel") && symbols.contains(&"cuMemAlloc_v2"), "{symbols:?}");
    for timed in ["cuStreamSynchronize", "cuCtxSynchronize", "cuEventQuery", "cuMemcpyAsync", "cuMemsetD8_v2"] {
        assert!(!symbols.contains(&timed), "{timed} probed by default: {symbols:?}");
    }
}

/// The CUDA ledger is reported beside the driver ledger for processes both see.
#[test]
fn cuda_and_driver_ledgers_are_cross_checked_per_process() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lib = fake_libcuda(PLAIN);
    let driver = FakeDriver::start(1).unwrap();
    let mut t = tracer(&driver, vec![lib.clone()]);
    let pod = PodCgroup::new().unwrap();
    let mut w = Workload::builder(driver.dev_dir()).cgroup(&pod).libcuda(&lib).spawn().unwrap();
    ok(&mut w, "init 0");
    ok(&mut w, "alloc-rm 1073741824"); // what the driver backs (e.g. a caching allocator's pool)
    ok(&mut w, "cuda-init");
    ok(&mut w, "cuda-alloc 268435456"); // what the application asked libcuda for
    let s = t.settle();
    let c = s.ledger_check.iter().find(|c| c.tgid == w.pid()).expect("process in both ledgers");
    assert_eq!((c.cuda_device_bytes, c.driver_vidmem_bytes), (256 * MIB, 1024 * MIB));
    assert_eq!(c.driver_minus_cuda, 768 * MIB as i64);
    assert_eq!(c.cgroup_id, pod.id());
}
