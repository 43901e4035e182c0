//! The agent under exactly the capability list the chart grants (docs/security.md: `BPF`, `PERFMON`,
//! `SYS_PTRACE`, `DAC_READ_SEARCH`, as uid 0), and with each of them removed in turn: which probe
//! families attach, that they count, and that `doctor` names what is missing. The list is dropped
//! from root's with `setpriv --bounding-set` (util-linux), as the container runtime does. Needs root.
use std::{
    process::{Command, Stdio},
    time::Duration,
};

use gpu_tracer_tests::{
    AgentProcess, FakeDriver, PodCgroup, Workload, fake_libcuda, gpu_tracer, kernel_at_least, require_root,
};
use serde_json::Value;

/// The chart's capabilities (`gpu-tracer.capabilities` in the chart's `_helpers.tpl`).
const CHART: [&str; 4] = ["bpf", "perfmon", "sys_ptrace", "dac_read_search"];

/// The chart's capabilities as a node with this kernel needs them: before 5.11 map memory is
/// charged to RLIMIT_MEMLOCK, and the chart's `memlockCapability=true` (docs/helm.md, docs/kernels.md)
/// adds SYS_RESOURCE so the agent can raise it.
fn chart() -> Vec<&'static str> {
    let mut caps = CHART.to_vec();
    if !kernel_at_least(5, 11) {
        caps.push("sys_resource");
    }
    caps
}

/// `gpu-tracer ARGS` holding exactly `caps` (uid 0, every other capability out of the bounding
/// set, nothing inheritable).
fn with_caps(caps: &[&str], args: &[&str]) -> Command {
    let mut c = Command::new("setpriv");
    c.args(setpriv_args(caps)).arg(gpu_tracer()).args(args);
    c
}

/// `setpriv`'s arguments that keep exactly `caps` (up to the `--` before the program).
fn setpriv_args(caps: &[&str]) -> Vec<String> {
    let bounding: Vec<String> =
        std::iter::once("-all".to_string()).chain(caps.iter().map(|c| format!("+{c}"))).collect();
    ["--bounding-set", &bounding.join(","), "--inh-caps", "-all", "--"].iter().map(|a| a.to_string()).collect()
}

fn doctor(caps: &[&str], args: &[&str]) -> (Option<i32>, Value) {
    let out = with_caps(caps, &[args, &["--log", "error", "doctor", "--json"]].concat())
        .output()
        .expect("setpriv (util-linux) runs gpu-tracer");
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor --json: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code(), v)
}

/// Debian's and Ubuntu's kernels refuse perf events (classic tracepoints, perf-event uprobes) without
/// CAP_SYS_ADMIN when `kernel.perf_event_paranoid` is 3 or more (a distribution patch; Debian's
/// kernel boots with 3).
fn paranoid_blocks_tracepoints() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|v| v.trim().parse::<i32>().ok())
        .is_some_and(|v| v >= 3)
}

fn check<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no {name}: {v:#}"))
}

/// The chart's list is enough for every family, the cuda family included (multi-uprobe links,
/// Linux 6.6+; before, its perf-event uprobes fail naming CAP_SYS_ADMIN); `doctor` finds nothing
/// missing among the capabilities.
#[test]
fn the_charts_capabilities_attach_every_family() {
    require_root();
    let (code, v) = doctor(&chart(), &[]);
    assert_eq!(v["probes"]["driver"]["state"], "attached", "{:#}", v["probes"]["driver"]);
    // The lifecycle family is on BTF tracepoints (bpf links, no perf event), which no
    // perf_event_paranoid setting refuses.
    assert_eq!(v["probes"]["features"]["btf"], true, "these tests need kernel BTF: {:#}", v["probes"]["features"]);
    assert_eq!(v["probes"]["lifecycle"]["state"], "attached", "{:#}", v["probes"]["lifecycle"]);
    let programs = v["probes"]["lifecycle"]["programs"].to_string();
    assert!(programs.contains("tp_btf/sched_process_exit"), "{programs}");
    // Its classic-tracepoint mode opens perf events: refused without CAP_SYS_ADMIN where the
    // sysctl is 3 or more (the error names it and the fix), attached otherwise.
    let (_, t) = doctor(&chart(), &["--lifecycle-attach", "tracepoint"]);
    if paranoid_blocks_tracepoints() {
        let why = t["probes"]["lifecycle"]["error"].as_str().unwrap_or_default();
        assert!(why.contains("perf_event_paranoid is 3") && why.contains("fix:"), "{:#}", t["probes"]["lifecycle"]);
    } else {
        assert_eq!(t["probes"]["lifecycle"]["state"], "attached", "{:#}", t["probes"]["lifecycle"]);
    }
    if !kernel_at_least(6, 6) {
        // No multi links: perf-event uprobes, refused by the uprobe PMU without SYS_ADMIN, then
        // made through tracefs — which a kernel with perf_event_paranoid >= 3 refuses too.
        if paranoid_blocks_tracepoints() {
            assert_eq!(v["probes"]["cuda"]["state"], "failed", "{:#}", v["probes"]["cuda"]);
            let why = v["probes"]["cuda"]["error"].as_str().unwrap();
            assert!(why.contains("CAP_SYS_ADMIN") && why.contains("cudaPerfEventUprobes"), "{why}");
            assert!(why.contains("through tracefs") && why.contains("perf_event_paranoid"), "{why}");
            assert_eq!(check(&v, "CAP_SYS_ADMIN")["status"], "warn", "{:#}", check(&v, "CAP_SYS_ADMIN"));
        } else {
            assert_eq!(v["probes"]["cuda"]["state"], "attached", "{:#}", v["probes"]["cuda"]);
            let libs = v["probes"]["cuda_libraries"].as_array().unwrap();
            assert!(libs.iter().all(|l| l["method"] == "tracefs"), "{libs:#?}");
        }
        assert_eq!(events_of_gone_agents(), Vec::<String>::new(), "doctor removed its uprobe events");
        return;
    }
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(v["probes"]["cuda"]["state"], "attached", "{:#}", v["probes"]["cuda"]);
    // The real libcuda (installed by `cargo xtask setup`) is found and probed with multi links.
    let libs = v["probes"]["cuda_libraries"].as_array().unwrap();
    assert!(!libs.is_empty() && libs.iter().all(|l| l["method"] == "uprobe-multi"), "{libs:#?}");
    for cap in ["CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH", "CAP_SYS_ADMIN"] {
        assert_eq!(check(&v, cap)["status"], "ok", "{:#}", check(&v, cap));
    }
    // Perf-event uprobes (what kernels before 6.6 get): the uprobe PMU refuses them without
    // SYS_ADMIN, and the agent makes them through tracefs instead, as bpftrace does. Where
    // perf_event_paranoid is 3 or more (Debian's and Ubuntu's patch) that is refused too, and the
    // error says why and what would do.
    let _one = TRACEFS.lock().unwrap_or_else(|e| e.into_inner());
    let (_, v) = doctor(&chart(), &["--cuda-attach", "perf-event"]);
    if paranoid_blocks_tracepoints() {
        assert_eq!(v["probes"]["cuda"]["state"], "failed", "{:#}", v["probes"]["cuda"]);
        let why = v["probes"]["cuda"]["error"].as_str().unwrap();
        assert!(why.contains("CAP_SYS_ADMIN") && why.contains("perf_event_paranoid"), "{why}");
    } else {
        assert_eq!(v["probes"]["cuda"]["state"], "attached", "{:#}", v["probes"]["cuda"]);
        let libs = v["probes"]["cuda_libraries"].as_array().unwrap();
        assert!(!libs.is_empty() && libs.iter().all(|l| l["method"] == "tracefs"), "{libs:#?}");
        assert!(libs.iter().all(|l| l["entries"].as_array().unwrap().iter().all(|e| e["status"] != "failed")));
    }
    assert_eq!(v["probes"]["driver"]["state"], "attached", "the other families are unaffected");
    assert_eq!(events_of_gone_agents(), Vec::<String>::new(), "doctor removed its uprobe events");
}

/// One test at a time makes uprobe events through tracefs (the other's stale event would fail
/// this one's check).
static TRACEFS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Our uprobe events in tracefs whose agent is gone (a `gpu_tracer/p<pid>_<n>` of a pid that does
/// not run): what an agent must remove when it stops, and the next one when it was killed.
fn events_of_gone_agents() -> Vec<String> {
    let text = std::fs::read_to_string("/sys/kernel/tracing/uprobe_events").expect("tracefs is mounted");
    text.lines()
        .filter_map(|l| l.split_whitespace().next()?.split_once(":gpu_tracer/").map(|(_, n)| n.to_string()))
        .filter(|n| {
            let pid = n.strip_prefix('p').and_then(|r| r.split('_').next()).unwrap_or("");
            !std::path::Path::new("/proc").join(pid).exists()
        })
        .collect()
}

/// Each capability of the list, removed: `doctor` says it is missing and what is lost, and the
/// families behave as docs/security.md says.
#[test]
fn each_capability_removed_is_named_by_doctor() {
    require_root();
    for removed in chart() {
        let caps: Vec<&str> = chart().into_iter().filter(|c| *c != removed).collect();
        let (code, v) = doctor(&caps, &[]);
        let name = format!("CAP_{}", removed.to_uppercase());
        let c = check(&v, &name);
        let detail = c["detail"].as_str().unwrap();
        assert!(detail.starts_with("missing:") && detail.contains("without it:"), "{name}: {c:#}");
        match removed {
            // Before 5.11: nothing loads under the 64 KiB memlock limit, and the error says so.
            "sys_resource" => {
                assert_eq!(c["status"], "fail", "{name}");
                assert_eq!(code, Some(1), "{name}: {v:#}");
                let probes = check(&v, "probes");
                let detail = probes["detail"].as_str().unwrap_or_default();
                assert!(detail.contains("RLIMIT_MEMLOCK") && detail.contains("memlockCapability=true"), "{probes:#}");
            }
            // Before 6.6 the cuda family needs SYS_ADMIN anyway (see above).
            _ if !kernel_at_least(6, 6) && !matches!(removed, "bpf" | "perfmon") => {}
            // Nothing loads without these: a failed check, doctor exits 1, the probes check says why.
            "bpf" | "perfmon" => {
                assert_eq!(c["status"], "fail", "{name}");
                assert_eq!(code, Some(1), "{name}: {v:#}");
                assert_eq!(check(&v, "probes")["status"], "fail", "{name}");
            }
            // These cost reads of other users' /proc entries, not the probes.
            _ => {
                assert_eq!(c["status"], "warn", "{name}");
                for family in ["driver", "lifecycle", "cuda"] {
                    assert_eq!(v["probes"][family]["state"], "attached", "{name}: {family}");
                }
            }
        }
    }
}

/// Under the chart's list the agent does not only attach: a workload's driver allocation and its
/// libcuda launches and allocation arrive, exact (the libcuda part on 6.6+, where the chart's list
/// attaches the cuda family).
#[test]
fn the_charts_capabilities_count_launches_and_allocations() {
    count_under_the_charts_capabilities(&[], kernel_at_least(6, 6));
}

/// The same with perf-event uprobes (`cuda_attach = "perf-event"`, what kernels before 6.6 get):
/// the uprobe PMU refuses them without CAP_SYS_ADMIN and they are made through tracefs, counting
/// the same; an event a killed agent left behind is removed at start, and the agent's own when it
/// stops.
#[test]
fn perf_event_uprobes_without_sys_admin_count_through_tracefs() {
    require_root();
    let _one = TRACEFS.lock().unwrap_or_else(|e| e.into_inner());
    // A stale event of a gpu-tracer that is gone (a pid that has exited).
    let mut gone = Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let stale = format!("p{dead}_0");
    let lib = fake_libcuda("thunk");
    std::fs::OpenOptions::new()
        .append(true)
        .open("/sys/kernel/tracing/uprobe_events")
        .and_then(|mut f| {
            use std::io::Write;
            // One write: tracefs parses each write as a command.
            f.write_all(format!("p:gpu_tracer/{stale} {}:0x1000\n", lib.display()).as_bytes())
        })
        .expect("write a stale uprobe event");
    count_under_the_charts_capabilities(&["--cuda-attach", "perf-event"], !paranoid_blocks_tracepoints());
    assert_eq!(events_of_gone_agents(), Vec::<String>::new(), "the stale event and the agent's own are gone");
}

/// `events` under the chart's capabilities (with `extra` global arguments) while a workload makes a
/// driver allocation, 300 launches and a CUDA allocation; with `cuda`, the libcuda part must arrive
/// too.
fn count_under_the_charts_capabilities(extra: &[&str], cuda: bool) {
    require_root();
    let driver = FakeDriver::start(1).unwrap();
    let pod = PodCgroup::new().unwrap();
    let lib = fake_libcuda("thunk");
    let dev = driver.dev_dir().to_str().unwrap().to_string();
    let args = [
        extra,
        &[
            "--log",
            "info",
            "--libcuda",
            lib.to_str().unwrap(),
            "--dev-dir",
            &dev,
            "--simulated-devices",
            "events",
            "--json",
            "--duration",
            "4",
        ],
    ]
    .concat();
    let mut child = AgentProcess::spawn(with_caps(&chart(), &args).stdout(Stdio::piped())).unwrap();
    child
        .wait_log_within("probes loaded", Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("gpu-tracer did not start: {e}"));
    let mut w = Workload::builder(driver.dev_dir()).cgroup(&pod).libcuda(&lib).spawn().unwrap();
    for cmd in ["init 0", "alloc-vidheap 134217728", "cuda-init", "cuda-launch 300", "cuda-alloc 8388608"] {
        w.ok(cmd).unwrap_or_else(|e| panic!("{cmd}: {e}"));
    }
    let out = child.wait_with_output().unwrap();
    let log: Vec<&str> = std::str::from_utf8(&out.stderr).unwrap_or_default().lines().collect();
    assert!(out.status.success(), "{log:#?}");
    let events: Vec<Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mine = |kind: &str| -> Vec<&Value> {
        events.iter().filter(|e| e["kind"] == kind && e["tgid"] == w.pid()).collect::<Vec<_>>()
    };
    let vh = mine("vid_heap_alloc");
    assert_eq!(vh.len(), 1, "{events:#?}");
    assert_eq!(vh[0]["bytes"], 134217728u64);
    if !cuda {
        return;
    }
    let launches: u64 = mine("cuda_launch_batch")
        .iter()
        .filter(|e| e["entry_point"] == "cuLaunchKernel")
        .map(|e| e["launches"].as_u64().unwrap())
        .sum();
    assert_eq!(launches, 300, "{events:#?}");
    let a = mine("cuda_alloc");
    assert_eq!(a.len(), 1, "{events:#?}");
    assert_eq!(a[0]["bytes"], 8388608u64);
}

/// The memlock limit (`RLIMIT_MEMLOCK`, 64 KiB by default before 5.16): from 5.11 on the kernel
/// charges map memory to the memory cgroup and the agent starts under the chart's capabilities
/// with that limit; before, it cannot, and the error names the limit and both fixes — and with
/// SYS_RESOURCE (the chart's `memlockCapability`) it raises the limit and starts.
#[test]
fn the_memlock_limit_matters_only_before_5_11_and_is_named_there() {
    require_root();
    let run = |caps: &[&str]| {
        let mut c = Command::new("prlimit");
        c.args(["--memlock=65536:65536", "--", "setpriv"]).args(setpriv_args(caps)).arg(gpu_tracer());
        c.args(["--log", "warn", "--no-cuda", "--simulated-devices", "events", "--json", "--duration", "1"]);
        let out = c.stdout(Stdio::null()).output().expect("prlimit and setpriv (util-linux) run gpu-tracer");
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run(&CHART);
    if kernel_at_least(5, 11) {
        assert_eq!(code, Some(0), "64 KiB of memlock is enough from 5.11 on: {err}");
        println!("reliability: kernel_5_11_plus=true memlock_kib=64 chart_caps_start=true");
    } else {
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("charges BPF map memory to RLIMIT_MEMLOCK") && err.contains("64.0 KiB here"), "{err}");
        assert!(err.contains("CAP_SYS_RESOURCE (Helm: memlockCapability=true)") && err.contains("ulimit -l"), "{err}");
        assert!(!err.contains("needs CAP_BPF and CAP_PERFMON"), "the hint names the real cause: {err}");
        let (code, err) = run(&chart());
        assert_eq!(code, Some(0), "with SYS_RESOURCE the agent raises the limit: {err}");
        println!(
            "reliability: kernel_5_11_plus=false memlock_kib=64 chart_caps_start=false with_sys_resource_start=true"
        );
    }
}
