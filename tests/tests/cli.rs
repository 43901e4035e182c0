//! The `gpu-tracer` binary as a user runs it: `events --json`, `events` (protobuf), `top --once
//! --json` and `doctor`, against the fake driver with workloads in pod cgroups. Needs root.
use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use gpu_tracer_tests::{locate_binary, require_root, FakeDriver, PodCgroup, Workload};

fn gpu_tracer() -> PathBuf {
    locate_binary("gpu-tracer").unwrap_or_else(|e| {
        panic!("{e}: build it first (`cargo build --release -p tracer-user`, or run `cargo xtask test`)")
    })
}

/// Start `gpu-tracer <args>` (driver and lifecycle families only: detaching libcuda uprobes costs
/// seconds) and wait until its probes are attached (it logs "probes loaded").
fn start(args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    start_with(&["--no-cuda"], args)
}

fn start_with(global: &[&str], args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(gpu_tracer())
        .args(["--log", "info"])
        .args(global)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn gpu-tracer");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let line = rx.recv_timeout(Duration::from_secs(20)).expect("gpu-tracer said nothing");
        if line.contains("probes loaded") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "gpu-tracer did not start");
    }
    (child, rx)
}

fn ok(w: &mut Workload, cmd: &str) -> String {
    let a = w.cmd(cmd).unwrap();
    assert!(a.starts_with("ok"), "{cmd}: {a}");
    a
}

#[test]
fn events_json_carries_identity_and_allocation_details() {
    require_root();
    let driver = FakeDriver::start(1).unwrap();
    let pod = PodCgroup::new().unwrap();
    let dev = driver.dev_dir().to_str().unwrap().to_string();
    let (child, log) = start(&["--dev-dir", &dev, "events", "--json", "--duration", "3", "--summary"]);
    let mut w = Workload::spawn(driver.dev_dir(), Some(&pod)).unwrap();
    ok(&mut w, "init 0");
    ok(&mut w, "alloc-rm 1073741824");
    ok(&mut w, "alloc-vidheap 268435456");
    let out = child.wait_with_output().unwrap();
    let stderr: Vec<String> = log.try_iter().collect();
    assert!(out.status.success(), "gpu-tracer failed: {stderr:#?}");
    let events: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let allocs: Vec<&serde_json::Value> = events.iter().filter(|e| e["kind"] == "rm_alloc" && e["bytes"] == 1073741824u64).collect();
    assert_eq!(allocs.len(), 1, "one 1 GiB RM_ALLOC: {events:#?}");
    let a = allocs[0];
    assert_eq!(a["class"], 0x40);
    assert_eq!(a["tgid"], w.pid());
    assert_eq!(a["cgroup_id"], pod.id());
    assert_eq!(a["cgroup_path"], pod.relative_path());
    assert_eq!(a["device"]["kind"], "ctl");
    assert_eq!(a["success"], true);
    assert!(a["handle"].as_u64().unwrap() > 0);
    let vh: Vec<_> = events.iter().filter(|e| e["kind"] == "vid_heap_alloc").collect();
    assert_eq!(vh.len(), 1);
    assert_eq!(vh[0]["bytes"], 268435456u64);
    assert!(events.iter().any(|e| e["kind"] == "fd_opened" && e["device"]["kind"] == "gpu"));
    let summary = stderr.iter().find(|l| l.starts_with("events written:")).expect("summary line");
    assert!(summary.contains("dropped 0 (in flight 0)"), "{summary}");
}

#[test]
fn events_protobuf_stream_decodes_and_top_once_json_has_exact_bytes() {
    require_root();
    let driver = FakeDriver::start(1).unwrap();
    let pod = PodCgroup::new().unwrap();
    let dev = driver.dev_dir().to_str().unwrap().to_string();
    let out_file = std::env::temp_dir().join(format!("gt-events-{}.pb", std::process::id()));
    let out_path = out_file.to_str().unwrap().to_string();
    let (events, _l1) = start(&["--dev-dir", &dev, "events", "--output", &out_path, "--duration", "4"]);
    let mut w = Workload::spawn(driver.dev_dir(), Some(&pod)).unwrap();
    ok(&mut w, "init 0");
    ok(&mut w, "alloc-rm 536870912");
    // `top --once` started now finds the workload by the /proc scan and sees the next allocation.
    let (top, _l2) = start(&["--dev-dir", &dev, "top", "--once", "--json", "--interval-ms", "1500"]);
    ok(&mut w, "alloc-vidheap 134217728");
    let top_out = top.wait_with_output().unwrap();
    assert!(top_out.status.success());
    let snap: serde_json::Value = serde_json::from_slice(&top_out.stdout).unwrap();
    let row = snap["state"]["cgroups"].as_array().unwrap().iter().find(|c| c["cgroup_id"] == pod.id()).cloned();
    let row = row.unwrap_or_else(|| panic!("pod cgroup row missing: {snap:#}"));
    assert_eq!(row["usage"]["vidmem_bytes"], 134217728u64, "only what happened after start is known");
    assert_eq!(snap["pipeline"]["seeded_fds"], 3);
    assert_eq!(snap["accounting"]["exact"], true);

    let ev_out = events.wait_with_output().unwrap();
    assert!(ev_out.status.success());
    let bytes = std::fs::read(&out_file).unwrap();
    std::fs::remove_file(&out_file).unwrap();
    let msgs: Vec<_> = gpu_tracer_proto::read_stream(&bytes).collect::<Result<_, _>>().expect("valid stream");
    use gpu_tracer_proto::v1::event::Payload;
    let sizes: Vec<u64> = msgs
        .iter()
        .filter_map(|m| match &m.payload {
            Some(Payload::RmAlloc(a)) if a.bytes > 0 => Some(a.bytes),
            Some(Payload::VidHeapAlloc(a)) => Some(a.bytes),
            _ => None,
        })
        .collect();
    assert_eq!(sizes, vec![536870912, 134217728]);
}

#[test]
fn doctor_reports_every_family_attached() {
    require_root();
    let out = Command::new(gpu_tracer()).args(["doctor", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["probes"]["driver"]["state"], "attached");
    assert_eq!(v["probes"]["lifecycle"]["state"], "attached");
    // The real libcuda (installed by `cargo xtask setup`) is found and probed past its thunks.
    assert_eq!(v["probes"]["cuda"]["state"], "attached", "{v:#}");
    // Turning a family off is reported, and the other keeps running.
    let out = Command::new(gpu_tracer()).args(["--no-driver", "doctor", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["probes"]["driver"]["state"], "disabled");
    assert_eq!(v["probes"]["lifecycle"]["state"], "attached");
}

#[test]
fn events_json_reports_cuda_launch_batches_and_allocations() {
    require_root();
    let driver = FakeDriver::start(1).unwrap();
    let pod = PodCgroup::new().unwrap();
    let lib = gpu_tracer_tests::fake_libcuda("thunk");
    let dev = driver.dev_dir().to_str().unwrap().to_string();
    let libs = lib.to_str().unwrap().to_string();
    let (child, _log) =
        start_with(&["--libcuda", &libs], &["--dev-dir", &dev, "events", "--json", "--duration", "3"]);
    let mut w = Workload::builder(driver.dev_dir()).cgroup(&pod).libcuda(&lib).spawn().unwrap();
    ok(&mut w, "cuda-init");
    ok(&mut w, "cuda-launch 500");
    ok(&mut w, "cuda-graph-launch 4");
    ok(&mut w, "cuda-alloc 8388608");
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let events: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let batches = |entry: &str| -> u64 {
        events
            .iter()
            .filter(|e| e["kind"] == "cuda_launch_batch" && e["entry_point"] == entry && e["tgid"] == w.pid())
            .map(|e| e["launches"].as_u64().unwrap())
            .sum()
    };
    assert_eq!(batches("cuLaunchKernel"), 500, "{events:#?}");
    assert_eq!(batches("cuGraphLaunch"), 4);
    let b = events.iter().find(|e| e["kind"] == "cuda_launch_batch").unwrap();
    assert_eq!(b["cgroup_path"], pod.relative_path());
    let a: Vec<_> = events.iter().filter(|e| e["kind"] == "cuda_alloc").collect();
    assert_eq!(a.len(), 1);
    assert_eq!((a[0]["entry_point"].as_str(), a[0]["bytes"].as_u64()), (Some("cuMemAlloc_v2"), Some(8388608)));
    assert!(events.iter().any(|e| e["kind"] == "cuda_function" && e["name"] == "fake_kernel"));
}

#[test]
fn events_per_event_cgroup_sends_every_launch_with_its_kernel_name() {
    require_root();
    let driver = FakeDriver::start(1).unwrap();
    let pod = PodCgroup::new().unwrap();
    let lib = gpu_tracer_tests::fake_libcuda("endbr64");
    let dev = driver.dev_dir().to_str().unwrap().to_string();
    let libs = lib.to_str().unwrap().to_string();
    let cg = pod.relative_path().to_string();
    let (child, _log) = start_with(
        &["--libcuda", &libs],
        &["--dev-dir", &dev, "events", "--json", "--duration", "3", "--per-event-cgroup", &cg],
    );
    let mut w = Workload::builder(driver.dev_dir()).cgroup(&pod).libcuda(&lib).spawn().unwrap();
    ok(&mut w, "cuda-init");
    ok(&mut w, "cuda-launch 25");
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let events: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let launches: Vec<_> = events.iter().filter(|e| e["kind"] == "cuda_launch").collect();
    assert_eq!(launches.len(), 25, "{events:#?}");
    assert!(launches.iter().all(|e| e["kernel_name"] == "fake_kernel" && e["grid"] == serde_json::json!([128, 2, 1])));
}
