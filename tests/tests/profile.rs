//! `gpu-tracer profile` as a user runs it, on a running workload of the fake libcuda in a pod
//! cgroup: the trace is decoded by the PyPI `perfetto` package's own protos
//! (tests/perfetto_check.py), which also checks its structure (tracks declared before use, slices
//! balanced, interned names resolved), and its counts per thread and per stream, like the summary's,
//! equal what the workload did. Needs root.
use std::{
    collections::BTreeMap,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use gpu_tracer_tests::{
    AgentProcess, Answer, FakeDriver, PodCgroup, Workload, fake_libcuda, gpu_tracer, require_root, scaled,
};
use serde_json::Value;

fn secs(n: u64) -> String {
    scaled(Duration::from_secs(n)).as_secs().to_string()
}

/// Start `gpu-tracer profile <args>` against the fake driver and wait until it records.
fn start_profile(driver: &FakeDriver, args: &[&str]) -> AgentProcess {
    let mut child = AgentProcess::spawn(
        Command::new(gpu_tracer())
            .args(["--log", "info", "--dev-dir"])
            .arg(driver.dev_dir())
            .args(["--simulated-devices", "profile"])
            .args(args)
            .stdout(Stdio::piped()),
    )
    .expect("spawn gpu-tracer");
    child.wait_log("recording").unwrap_or_else(|e| panic!("gpu-tracer profile did not start recording: {e}"));
    child
}

/// The trace, decoded and checked by tests/perfetto_check.py.
fn decode(trace: &Path) -> Value {
    let py = gpu_tracer_tests::venv_python();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("perfetto_check.py");
    let out = Command::new(py).arg(script).arg(trace).output().expect("run tests/perfetto_check.py");
    assert!(out.status.success(), "perfetto_check.py: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("perfetto_check.py prints JSON")
}

/// A fake-libcuda workload in `pod`, once it answers (libcuda is mapped by then, so a session can
/// start on it); `env` for its environment (the fake's simulated GPU time).
fn workload(driver: &FakeDriver, pod: &PodCgroup, env: &[(&str, &str)]) -> Workload {
    let mut b = Workload::builder(driver.dev_dir()).cgroup(pod).libcuda(fake_libcuda("thunk"));
    for (k, v) in env {
        b = b.env(k, v);
    }
    let mut w = b.spawn().unwrap();
    ok(&mut w, "pid");
    w
}

/// `gpu-tracer profile <args>` against the fake driver, to completion.
fn run_profile(driver: &FakeDriver, args: &[&str]) -> std::process::Output {
    Command::new(gpu_tracer())
        .arg("--dev-dir")
        .arg(driver.dev_dir())
        .args(["--simulated-devices", "profile"])
        .args(args)
        .output()
        .unwrap()
}

fn ok(w: &mut Workload, cmd: &str) -> Answer {
    w.ok(cmd).unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

/// Every event name on each track of `kind`, per track name.
fn per_track(t: &Value, kind: &str) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for (uuid, track) in t["tracks"].as_object().unwrap() {
        if track["kind"] != kind {
            continue;
        }
        let name = match kind {
            "thread" => format!("tid {}", track["tid"]),
            _ => track["name"].as_str().unwrap().to_string(),
        };
        let events: BTreeMap<String, u64> = t["events"]
            .get(uuid)
            .and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap())).collect())
            .unwrap_or_default();
        out.insert(name, events);
    }
    out
}

#[test]
fn profile_records_a_running_workload_into_a_trace_perfetto_reads() {
    require_root();
    let driver = FakeDriver::start(1).unwrap();
    let pod = PodCgroup::new().unwrap();
    // The fake's simulated GPU time: each launch keeps its stream busy for 1 ms.
    let mut w = workload(&driver, &pod, &[("FAKE_LIBCUDA_KERNEL_NS", "1000000")]);
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("run.pftrace");
    let summary_file = dir.path().join("summary.json");
    let html = dir.path().join("report.html");
    let pid = w.pid().to_string();
    let child = start_profile(
        &driver,
        &[
            "--pid",
            &pid,
            "--duration",
            &secs(8),
            "-o",
            trace.to_str().unwrap(),
            "--summary",
            summary_file.to_str().unwrap(),
            "--html",
            html.to_str().unwrap(),
            "--json",
        ],
    );
    // The schedule, all inside the window: the handle lookups too, so launches are named.
    ok(&mut w, "cuda-init");
    let stream = ok(&mut w, "cuda-state").number("stream").unwrap();
    ok(&mut w, "cuda-launch 25");
    ok(&mut w, "cuda-launch-ex 5");
    let blocked = ok(&mut w, "cuda-stream-sync").number("ns").unwrap(); // the 30 launches' 30 ms
    ok(&mut w, "cuda-launch-threads 3 10");
    let ctx_blocked = ok(&mut w, "cuda-ctx-sync").number("ns").unwrap();
    let a = ok(&mut w, "cuda-alloc 8388608").number("ptr").unwrap();
    ok(&mut w, &format!("cuda-memcpy-htod {a:#x} 4096"));
    ok(&mut w, &format!("cuda-memcpy-dtoh {a:#x} 8192"));
    // The per-thread default stream's forms (a program built with --default-stream per-thread).
    ok(&mut w, &format!("cuda-memcpy-htod-ptds {a:#x} 1024"));
    ok(&mut w, &format!("cuda-memcpy-dtoh-async-ptsz {a:#x} 2048"));
    ok(&mut w, &format!("cuda-memset-ptds {a:#x} 512"));
    ok(&mut w, "cuda-alloc 4096");
    ok(&mut w, &format!("cuda-free {a:#x}"));
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // The summary (stdout with --json, and the file) equals the schedule.
    let s: Value = serde_json::from_slice(&out.stdout).expect("the summary is JSON");
    let file: Value = serde_json::from_str(&std::fs::read_to_string(&summary_file).unwrap()).unwrap();
    assert_eq!(s, file);
    assert_eq!(s["window"]["ended_by"], "duration");
    // A standalone session's probes start with it: what was held before is not known, and the
    // counters say so ("allocated in window", held_at_start_bytes null).
    assert!(s["cuda_memory"]["held_at_start_bytes"].is_null(), "{:#}", s["cuda_memory"]);
    assert_eq!(s["launches"]["total"], 60, "{s:#}");
    assert_eq!(s["launches"]["per_entry_point"]["cuLaunchKernel"], 55);
    assert_eq!(s["launches"]["per_entry_point"]["cuLaunchKernelEx"], 5);
    assert_eq!(s["launches"]["unnamed"], 0);
    assert_eq!(s["top_kernels"][0]["name"], "fake_kernel");
    assert_eq!(
        (s["top_kernels"][0]["grid"].as_str(), s["top_kernels"][0]["block"].as_str()),
        (Some("128x2x1"), Some("32x4x2"))
    );
    let p = &s["processes"][0];
    assert_eq!((p["tgid"].as_u64(), p["threads"].as_u64()), (Some(w.pid().into()), Some(4)), "{p:#}");
    assert_eq!(p["counted_launches"], 60, "the kernel's counts agree with the per-event launches");
    let m = &s["cuda_memory"];
    assert_eq!((m["allocs"].as_u64(), m["alloc_bytes"].as_u64()), (Some(2), Some(8388608 + 4096)), "{m:#}");
    assert_eq!((m["frees"].as_u64(), m["freed_bytes"].as_u64()), (Some(1), Some(8388608)));
    assert_eq!((m["net_bytes"].as_i64(), m["peak_bytes"].as_i64()), (Some(4096), Some(8388608 + 4096)));
    assert_eq!((s["leak_candidates_total"].as_u64(), s["leak_candidates_bytes"].as_u64()), (Some(1), Some(4096)));
    assert_eq!(s["session"]["tracer_dropped"], 0);
    // GPU time: the stream synchronisation bounds the first 30 launches, the context one the
    // threads' 30; the host time blocked is the workload's own measure.
    let g = &s["gpu_time"];
    assert_eq!((g["launches_bounded"].as_u64(), g["launches_not_bounded"].as_u64()), (Some(60), Some(0)), "{g:#}");
    assert_eq!(g["intervals"], 2);
    assert!(g["bounded_share"].as_f64().unwrap() > 0.0);
    let sync = &s["synchronisation"][0];
    assert_eq!((sync["tid"].as_u64(), sync["calls"].as_u64()), (Some(w.pid().into()), Some(2)), "{sync:#}");
    let measured = (blocked + ctx_blocked) as f64 / 1e6;
    let ours = sync["blocked_ms"].as_f64().unwrap();
    assert!(blocked >= 20_000_000, "the fake blocked for the simulated work: {blocked} ns");
    assert!(ours >= measured * 0.9 && ours <= measured + 5.0, "probes {ours} ms vs the workload's {measured} ms");
    let copies = |d: &str| (s["copies"][d]["calls"].as_u64(), s["copies"][d]["bytes"].as_u64());
    assert_eq!(copies("htod"), (Some(2), Some(4096 + 1024)), "{:#}", s["copies"]);
    assert_eq!(copies("dtoh"), (Some(2), Some(8192 + 2048)), "{:#}", s["copies"]);
    assert_eq!((s["memsets"]["calls"].as_u64(), s["memsets"]["bytes"].as_u64()), (Some(1), Some(512)));
    assert_eq!(s["session"]["events_over_limit"], 0);
    // One kernel: all the bounded time is its own.
    let by_time = &s["top_kernels_by_bounded_time"][0];
    assert_eq!((by_time["name"].as_str(), by_time["bounded_share"].as_f64()), (Some("fake_kernel"), Some(1.0)));
    assert!(by_time["bounded_ms"].as_f64().unwrap() >= 30.0, "60 launches of 1 ms each: {by_time:#}");
    let cost = &s["session"]["estimated_cost"];
    assert_eq!((cost["launches"].as_u64(), cost["timed_calls"].as_u64()), (Some(60), Some(7)), "{cost:#}");

    // The trace, read by Perfetto's own protos.
    let t = decode(&trace);
    let threads = per_track(&t, "thread");
    assert_eq!(threads.len(), 4, "{threads:#?}");
    let main = &threads[&format!("tid {}", w.pid())];
    assert_eq!(main.get("fake_kernel"), Some(&30), "{main:?}");
    assert_eq!((main.get("cuMemAlloc_v2"), main.get("cuMemFree_v2")), (Some(&2), Some(&1)));
    for call in [
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuMemcpyHtoD_v2",
        "cuMemcpyDtoH_v2",
        "cuMemcpyHtoD_v2_ptds",
        "cuMemcpyDtoHAsync_v2_ptsz",
        "cuMemsetD8_v2_ptds",
    ] {
        assert_eq!(main.get(call), Some(&1), "{call} is a slice on the calling thread: {main:?}");
    }
    let others: Vec<u64> = threads
        .iter()
        .filter(|(k, _)| **k != format!("tid {}", w.pid()))
        .map(|(_, v)| v.get("fake_kernel").copied().unwrap_or(0))
        .collect();
    assert_eq!(others, vec![10, 10, 10], "{threads:#?}");
    let streams = per_track(&t, "named");
    let on_stream = &streams[&format!("stream {stream:#x}")];
    assert_eq!(on_stream.get("fake_kernel"), Some(&60), "{streams:#?}");
    assert_eq!(on_stream.get("ran within (bounded at sync)"), Some(&2), "{streams:#?}");
    let processes: Vec<&Value> = t["tracks"].as_object().unwrap().values().filter(|t| t["kind"] == "process").collect();
    assert_eq!(processes.len(), 1);
    assert_eq!(processes[0]["pid"].as_u64(), Some(w.pid().into()));
    let counter = t["tracks"]
        .as_object()
        .unwrap()
        .iter()
        .find(|(_, t)| t["name"] == "CUDA memory allocated in window")
        .map(|(u, _)| t["counters"][u].clone())
        .expect("a CUDA memory counter track");
    assert_eq!(counter, serde_json::json!([0, 8388608, 8388608 + 4096, 4096]));
    assert_eq!((t["flows_begun"].as_u64(), t["flows_terminated"].as_u64()), (Some(2), Some(1)));
    // 7 calls, 2 allocations, 2 bounded intervals, and at least the idle time before the first launch.
    assert!(t["slices"].as_u64().unwrap() >= 12, "{}", t["slices"]);

    // The HTML report, rendered by headless Chromium: no console errors, a canvas per plot, and
    // each plot's colour on the screenshot.
    // No NVML readings here: the GPU plot says so instead of drawing.
    html_renders_in_chromium(&html, dir.path(), 4, &PLOT_COLOURS);
}

/// Every plot's series colour (tracer-user/client/src/profile/html.rs), without NVML's.
const PLOT_COLOURS: [&str; 4] = ["1f77b4", "d62728", "2ca02c", "9467bd"];
/// The NVML plot's colours for GPU 0: utilization and this workload's SM %.
const GPU_PLOT_COLOURS: [&str; 2] = ["8c564b", "e377c2"];

/// `html` loads in headless Chromium with no console message and draws `plots` uPlot charts,
/// each of `colours` visible on a screenshot.
fn html_renders_in_chromium(html: &Path, dir: &Path, plots: usize, colours: &[&str]) {
    let page = std::fs::read_to_string(html).unwrap();
    assert!(!page.contains("src=\"http"), "the report fetches nothing");
    let chromium = Path::new("/usr/bin/chromium");
    assert!(chromium.exists(), "chromium not found: `cargo xtask setup` installs Debian's chromium");
    let url = format!("file://{}", html.display());
    let chrome = |extra: &[&str]| {
        Command::new(chromium)
            .args(["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,2600"])
            .args(["--virtual-time-budget=5000", "--enable-logging=stderr", "--v=0"])
            .args(extra)
            .arg(&url)
            .env("HOME", dir)
            .output()
            .expect("run chromium")
    };
    let shot = dir.join("shot.png");
    let out = chrome(&[&format!("--screenshot={}", shot.display())]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let console: Vec<&str> = stderr.lines().filter(|l| l.contains("CONSOLE")).collect();
    assert!(console.is_empty(), "console messages: {console:#?}");
    assert!(shot.exists(), "no screenshot: {stderr}");
    let dom = String::from_utf8_lossy(&chrome(&["--dump-dom"]).stdout).into_owned();
    assert_eq!(dom.matches("class=\"uplot").count(), plots, "one uPlot chart per plot");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("png_colours.py");
    let out = Command::new(gpu_tracer_tests::venv_python()).arg(script).arg(&shot).args(colours).output().unwrap();
    let counts = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "png_colours.py: {}", String::from_utf8_lossy(&out.stderr));
    for pair in counts.split_whitespace() {
        let (colour, n) = pair.split_once('=').unwrap();
        assert!(n.parse::<u64>().unwrap() >= 200, "the plot drawn in #{colour} is (nearly) blank: {counts}");
    }
}

#[test]
fn profile_ends_cleanly_when_the_workload_exits() {
    require_root();
    let driver = FakeDriver::start(1).unwrap();
    let pod = PodCgroup::new().unwrap();
    let mut w = workload(&driver, &pod, &[]);
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("run.pftrace");
    let pid = w.pid().to_string();
    let started = std::time::Instant::now();
    let child = start_profile(&driver, &["--pid", &pid, "--duration", "300", "-o", trace.to_str().unwrap(), "--json"]);
    ok(&mut w, "cuda-init");
    ok(&mut w, "cuda-launch 7");
    let _ = w.cmd("exit");
    w.wait().unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(started.elapsed() < Duration::from_secs(120), "it stopped at the exit, not at --duration");
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["window"]["ended_by"], "workload exited", "{s:#}");
    assert_eq!(s["launches"]["total"], 7);
    assert!(s["processes"][0]["exited_at_s"].is_number());
    decode(&trace);
}

/// One session per workload: a second one on the same process is refused while the first
/// records, and allowed once it has ended.
#[test]
fn a_second_session_on_one_workload_is_refused() {
    require_root();
    let driver = FakeDriver::start(1).unwrap();
    let pod = PodCgroup::new().unwrap();
    let w = workload(&driver, &pod, &[]);
    let dir = tempfile::tempdir().unwrap();
    let (t1, t2) = (dir.path().join("1.pftrace"), dir.path().join("2.pftrace"));
    let pid = w.pid().to_string();
    let first = start_profile(&driver, &["--pid", &pid, "--duration", &secs(4), "-o", t1.to_str().unwrap()]);
    let second = run_profile(&driver, &["--pid", &pid, "--duration", "1", "-o", t2.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{err}");
    assert!(err.contains("another profile session is recording this workload"), "{err}");
    assert!(err.contains(&format!("gpu-tracer pid {}", first.pid())), "{err}");
    let out = first.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Ended: the lock is free again.
    let third = run_profile(&driver, &["--pid", &pid, "--duration", "1", "-o", t2.to_str().unwrap()]);
    assert!(third.status.success(), "{}", String::from_utf8_lossy(&third.stderr));
}

#[test]
fn profile_refuses_what_it_cannot_record_with_a_clear_message() {
    require_root();
    let driver = FakeDriver::start(1).unwrap();
    let run = |args: &[&str]| {
        let out = run_profile(&driver, args);
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.pftrace");
    let t = trace.to_str().unwrap();
    // No such process (beyond any pid_max).
    let (code, err) = run(&["--pid", "2147483647", "-o", t]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no process 2147483647"), "{err}");
    // A process without libcuda.
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let (code, err) = run(&["--pid", &sleeper.id().to_string(), "-o", t]);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("has no libcuda.so mapped") && err.contains("(sleep)"), "{err}");
    // No workload named; both named.
    let (code, err) = run(&["-o", t]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--pid") && err.contains("--cgroup"), "{err}");
    let (code, err) = run(&["--pid", "1", "--cgroup", "x", "-o", t]);
    assert_eq!(code, Some(2), "{err}");
    // A cgroup that does not exist.
    let (code, err) = run(&["--cgroup", "no/such/cgroup.scope", "--duration", "1", "-o", t]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--cgroup no/such/cgroup.scope: no such cgroup"), "{err}");
    // A duration out of range.
    let (code, err) = run(&["--pid", "1", "--duration", "0", "-o", t]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--duration"), "{err}");
}

/// `gpu-tracer agent` on the fake driver at `dev_dir` and the fake libcuda (thunk prologues), with
/// `config`, for `secs` seconds, its API at `api`, /metrics on an ephemeral port.
fn agent_command(dev_dir: &Path, config: &Path, secs: u32, api: &str) -> Command {
    let mut c = Command::new(gpu_tracer());
    c.args(["--log", "info", "--dev-dir"])
        .arg(dev_dir)
        .arg("--config")
        .arg(config)
        .arg("--libcuda")
        .arg(fake_libcuda("thunk"))
        .args(["--simulated-devices", "agent", "--listen", "127.0.0.1:0", "--duration", &secs.to_string()])
        .args(["--grpc-listen", api])
        .stdout(Stdio::null());
    c
}

/// `gpu-tracer agent` with the cuda family on the fake libcuda (synchronisation and copy calls
/// probed too) and its API on a Unix socket in `dir`; returns it and the API address once it
/// serves.
fn start_agent(driver: &FakeDriver, dir: &Path) -> (AgentProcess, String) {
    let config = dir.join("agent.toml");
    std::fs::write(&config, "cuda_timed_calls = true\n").unwrap();
    let api = format!("unix://{}", dir.join("api.sock").display());
    let mut agent =
        AgentProcess::spawn(&mut agent_command(driver.dev_dir(), &config, 300, &api)).expect("spawn gpu-tracer agent");
    agent.grpc_addr().unwrap_or_else(|e| panic!("the agent did not serve its API: {e}"));
    (agent, api)
}

/// `profile --connect`: the running agent's probes record the session (none attached by the
/// client), the summary and the trace equal the workload's schedule as a standalone session's do,
/// and per-event mode ends with the session; a client killed mid-session (SIGKILL) ends its session
/// in the agent at once (the lock is free again and the agent says so), and the agent refuses
/// what it cannot record with the same clear messages.
#[test]
fn profile_connect_records_through_a_running_agent() {
    require_root();
    let driver = FakeDriver::start(1).unwrap();
    let pod = PodCgroup::new().unwrap();
    let mut w = workload(&driver, &pod, &[("FAKE_LIBCUDA_KERNEL_NS", "1000000")]);
    let dir = tempfile::tempdir().unwrap();
    let (mut agent, api) = start_agent(&driver, dir.path());
    let trace = dir.path().join("run.pftrace");
    let summary_file = dir.path().join("summary.json");
    let pid = w.pid().to_string();
    let t = trace.to_str().unwrap();
    let connect = ["--connect", api.as_str()];
    let six = secs(6);
    // What the process holds before the session: the counters start there.
    ok(&mut w, "cuda-init");
    let held = ok(&mut w, "cuda-alloc 2097152").number("ptr").unwrap();
    let args = [&connect[..], &["--pid", &pid, "--duration", &six, "-o", t, "--json"]].concat();
    let child = start_profile(&driver, &[&args[..], &["--summary", summary_file.to_str().unwrap()]].concat());
    agent.wait_log("profile session started").unwrap();
    let stream = ok(&mut w, "cuda-state").number("stream").unwrap();
    ok(&mut w, "cuda-launch 25");
    let blocked = ok(&mut w, "cuda-stream-sync").number("ns").unwrap();
    ok(&mut w, "cuda-launch-threads 2 10");
    let a = ok(&mut w, "cuda-alloc 1048576").number("ptr").unwrap();
    ok(&mut w, &format!("cuda-memcpy-htod {a:#x} 4096"));
    ok(&mut w, &format!("cuda-free {a:#x}"));
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s: Value = serde_json::from_slice(&out.stdout).expect("the summary is JSON");
    assert_eq!(s["window"]["ended_by"], "duration", "{s:#}");
    assert_eq!(s["session"]["source"], format!("agent {api}"));
    assert_eq!(s["session"]["notes"], serde_json::json!([]), "{s:#}");
    assert_eq!(s["launches"]["total"], 45, "{s:#}");
    assert_eq!(s["launches"]["unnamed"], 0);
    let p = &s["processes"][0];
    assert_eq!((p["tgid"].as_u64(), p["threads"].as_u64()), (Some(w.pid().into()), Some(3)), "{p:#}");
    assert_eq!(p["counted_launches"], 45, "the agent's in-kernel counts for the window agree: {p:#}");
    let m = &s["cuda_memory"];
    assert_eq!((m["allocs"].as_u64(), m["frees"].as_u64(), m["net_bytes"].as_i64()), (Some(1), Some(1), Some(0)));
    assert_eq!(
        (m["held_at_start_bytes"].as_u64(), m["peak_bytes"].as_i64(), m["peak_held_bytes"].as_u64()),
        (Some(2097152), Some(1048576), Some(3145728)),
        "the CUDA counters start at what the process held (the agent's ledger): {m:#}"
    );
    assert_eq!((s["copies"]["htod"]["calls"].as_u64(), s["copies"]["htod"]["bytes"].as_u64()), (Some(1), Some(4096)));
    let sync = &s["synchronisation"][0];
    assert_eq!(sync["calls"], 1, "{sync:#}");
    let ours = sync["blocked_ms"].as_f64().unwrap();
    let measured = blocked as f64 / 1e6;
    assert!(ours >= measured * 0.9 && ours <= measured + 5.0, "probes {ours} ms vs the workload's {measured} ms");
    assert_eq!(s["gpu_time"]["launches_bounded"], 25, "{:#}", s["gpu_time"]);
    assert_eq!(s["session"]["tracer_dropped"], 0);
    let file: Value = serde_json::from_str(&std::fs::read_to_string(&summary_file).unwrap()).unwrap();
    assert_eq!(s, file);
    let t = decode(&trace);
    let streams = per_track(&t, "named");
    assert_eq!(streams[&format!("stream {stream:#x}")].get("fake_kernel"), Some(&45), "{streams:#?}");
    let counter = t["tracks"]
        .as_object()
        .unwrap()
        .iter()
        .find(|(_, t)| t["name"] == "CUDA memory held")
        .map(|(u, _)| t["counters"][u].clone())
        .expect("a CUDA memory counter track");
    assert_eq!(counter, serde_json::json!([2097152, 3145728, 2097152]), "from the held level, +1 MiB, -1 MiB");
    ok(&mut w, &format!("cuda-free {held:#x}"));
    assert!(agent.wait_log("profile session ended").unwrap().contains("duration"));

    // After the session: launches are counted in the kernel only (a new session sees only its own).
    ok(&mut w, "cuda-launch 9");
    // A client killed mid-session: its session ends in the agent when the stream drops.
    let trace2 = dir.path().join("killed.pftrace");
    let args = [&connect[..], &["--pid", &pid, "--duration", "300", "-o", trace2.to_str().unwrap()]].concat();
    let killed = start_profile(&driver, &args);
    agent.wait_log("profile session started").unwrap();
    ok(&mut w, "cuda-launch 3");
    killed.kill().unwrap();
    assert!(agent.wait_log("profile session ended").unwrap().contains("client"));
    // The lock is free again, and a new session records only its own window's launches.
    let trace3 = dir.path().join("after.pftrace");
    let three = secs(3);
    let args =
        [&connect[..], &["--pid", &pid, "--duration", &three, "-o", trace3.to_str().unwrap(), "--json"]].concat();
    let third = start_profile(&driver, &args);
    agent.wait_log("profile session started").unwrap();
    ok(&mut w, "cuda-launch 4");
    let out = third.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["launches"]["total"], 4, "{s:#}");
    assert_eq!(s["processes"][0]["counted_launches"], 4, "{s:#}");

    // Refusals, from the agent, with the same messages as a standalone session's.
    let run = |args: &[&str]| {
        let out = run_profile(
            &driver,
            &[&connect[..], args, &["-o", dir.path().join("x.pftrace").to_str().unwrap()]].concat(),
        );
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = run(&["--pid", "2147483647"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("refused the session") && err.contains("no process 2147483647"), "{err}");
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let (code, err) = run(&["--pid", &sleeper.id().to_string()]);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("has no libcuda.so mapped"), "{err}");
    let (code, err) = run(&["--pod", "ml/no-such-pod", "--duration", "1"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no running container of pod ml/no-such-pod"), "{err}");

    assert!(agent.stop().unwrap().success());
}

/// `profile --pod NS/NAME [--container C]`, standalone: Kubernetes identity (the fake API server)
/// names the pod's container cgroups, the workload's own libcuda copy is probed although it was
/// mapped before the profiler started, and only that pod's launches are recorded (another pod's
/// on the same node are not); a container the pod does not have is refused, naming those it has.
#[test]
fn profile_pod_records_only_that_pods_containers() {
    use gpu_tracer_tests::{
        kube_api::{FakeApiServer, FakePod},
        pod_resources::FakePodResources,
    };
    require_root();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let driver = FakeDriver::start(1).unwrap();
    let (mine, other) = (PodCgroup::new().unwrap(), PodCgroup::new().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let api = rt.block_on(FakeApiServer::start()).unwrap();
    for (name, pod) in [("trainer-0", &mine), ("other-0", &other)] {
        api.apply(
            FakePod::new("ml", name, "profile-node")
                .uid(pod.pod_uid())
                .container("main", 1, Some(&format!("containerd://{}", pod.container_id())))
                .build(),
        );
    }
    let kubelet = rt.block_on(FakePodResources::start()).unwrap();
    api.write_kubeconfig(&dir.path().join("kubeconfig")).unwrap();
    let config = dir.path().join("gpu-tracer.toml");
    std::fs::write(
        &config,
        format!(
            "[kubernetes]\nmode = \"required\"\nnode_name = \"profile-node\"\nkubeconfig = {:?}\npod_resources_socket = {:?}\n",
            dir.path().join("kubeconfig"),
            kubelet.socket()
        ),
    )
    .unwrap();
    let mut a = workload(&driver, &mine, &[]);
    let mut b = workload(&driver, &other, &[]);
    let trace = dir.path().join("pod.pftrace");
    let cfg = config.to_str().unwrap();
    let five = secs(5);
    let child = start_profile(
        &driver,
        &["--config", cfg, "--pod", "ml/trainer-0", "--duration", &five, "-o", trace.to_str().unwrap(), "--json"],
    );
    ok(&mut a, "cuda-init");
    ok(&mut b, "cuda-init");
    ok(&mut a, "cuda-launch 6");
    ok(&mut b, "cuda-launch 4");
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["target"], format!("cgroup {}", mine.id()), "{s:#}");
    assert_eq!(s["launches"]["total"], 6, "{s:#}");
    let procs = s["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{procs:#?}");
    assert_eq!(procs[0]["tgid"], a.pid());
    assert!(procs[0]["name"].as_str().unwrap().starts_with("ml/trainer-0/main ("), "{procs:#?}");
    assert_eq!(s["workload"], "ml/trainer-0/main", "{s:#}");
    assert_eq!(procs[0]["counted_launches"], 6);
    decode(&trace);

    // A container the pod does not have.
    let out = run_profile(
        &driver,
        &["--config", cfg, "--pod", "ml/trainer-0", "--container", "nope", "-o", trace.to_str().unwrap()],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("pod ml/trainer-0 has no running container nope") && err.contains("here: main"), "{err}");
    drop(kubelet);
}

/// NVML's readings of the GPU the workload uses go into the session (the fake libnvidia-ml, whose
/// readings follow the fake driver: the workload's 1 GiB and 40 % SM): counter tracks per GPU in
/// the trace and a row in the summary, the same whether the profiler samples NVML itself or the
/// agent streams its own samples (`--connect`).
#[test]
fn profile_records_nvml_readings_of_the_gpu_the_workload_uses() {
    use gpu_tracer_tests::nvml_model::{Busy, NvmlModel};
    require_root();
    const GIB: u64 = 1 << 30;
    let driver = FakeDriver::start(1).unwrap();
    let pod = PodCgroup::new().unwrap();
    let mut w = workload(&driver, &pod, &[]);
    ok(&mut w, "init 0");
    ok(&mut w, "alloc-rm 1073741824");
    let dir = tempfile::tempdir().unwrap();
    let model = NvmlModel::install(&dir.path().join("nvml"), &driver.stats().unwrap(), 256 << 20).unwrap();
    let lib = model.library().to_str().unwrap().to_string();
    let pid = w.pid();
    let _follower = model.follow(
        driver.path(gpu_tracer_tests::fake_driver::stats::STATS_FILE_NAME),
        Duration::from_millis(200),
        move || [(pid, Busy { sm_pct: 40, mem_pct: 10 })].into(),
    );
    let check = |s: &Value, trace: &Path| {
        let g = &s["gpus"];
        assert_eq!(g.as_array().map(Vec::len), Some(1), "{s:#}");
        let g = &g[0];
        assert_eq!(g["index"], 0);
        assert!(g["samples"].as_u64().unwrap() >= 2, "{g:#}");
        assert_eq!(g["workload_sm_mean_pct"].as_f64(), Some(40.0), "{g:#}");
        assert_eq!(g["utilization_peak_pct"], 40, "{g:#}");
        assert_eq!(g["workload_memory_peak_bytes"], GIB, "{g:#}");
        assert_eq!(g["power_mean_w"].as_f64(), Some(270.0), "70 W idle + 5 W per SM %: {g:#}");
        let t = decode(trace);
        let counter = |name: &str| -> Vec<f64> {
            let (uuid, _) = t["tracks"]
                .as_object()
                .unwrap()
                .iter()
                .find(|(_, tr)| tr["name"].as_str().is_some_and(|n| n.starts_with("GPU 0") && n.contains(name)))
                .unwrap_or_else(|| panic!("no GPU 0 track {name:?}: {:#}", t["tracks"]));
            t["counters"][uuid].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect()
        };
        let sm = counter("SM % of this workload");
        assert!(sm.len() >= 2 && sm.iter().all(|v| *v == 40.0), "{sm:?}");
        assert!(counter("memory of this workload").iter().all(|v| *v == GIB as f64));
        assert!(counter("power W").iter().all(|v| *v == 270.0));
    };
    let pid = w.pid().to_string();

    // Standalone: the profiler samples NVML once a second.
    let trace = dir.path().join("standalone.pftrace");
    let html = dir.path().join("standalone.html");
    let three = secs(3);
    let child = start_profile(
        &driver,
        &[
            "--nvml",
            "required",
            "--nvml-library",
            &lib,
            "--pid",
            &pid,
            "--duration",
            &three,
            "-o",
            trace.to_str().unwrap(),
            "--html",
            html.to_str().unwrap(),
            "--json",
        ],
    );
    ok(&mut w, "cuda-init");
    ok(&mut w, "cuda-launch 3");
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    check(&s, &trace);
    // The report plots them, beside the launch rate and the top kernels (no memory calls or
    // synchronisations in this window: those say so instead of drawing).
    html_renders_in_chromium(&html, dir.path(), 3, &GPU_PLOT_COLOURS);

    // On the agent: its own samples (once per snapshot interval) come with the stream.
    let config = dir.path().join("agent.toml");
    std::fs::write(&config, format!("snapshot_interval_ms = 500\n[nvml]\nmode = \"required\"\nlibrary = {lib:?}\n"))
        .unwrap();
    let api = format!("unix://{}", dir.path().join("api.sock").display());
    let mut agent = AgentProcess::spawn(&mut agent_command(driver.dev_dir(), &config, 120, &api)).unwrap();
    agent.grpc_addr().unwrap();
    let trace = dir.path().join("agent.pftrace");
    let child = start_profile(
        &driver,
        &["--connect", &api, "--pid", &pid, "--duration", &three, "-o", trace.to_str().unwrap(), "--json"],
    );
    ok(&mut w, "cuda-launch 3");
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    check(&s, &trace);
    assert!(agent.stop().unwrap().success());
}
