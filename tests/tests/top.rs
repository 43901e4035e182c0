//! `gpu-tracer top` on real terminals: tmux (Debian's, which `cargo xtask setup` installs) runs
//! `top --connect` against a simulated GPU node's agent (`gpu-tracer-sim --agent`: fake driver,
//! fake NVML, fake API server and kubelet, two GPUs, five pods) in windows of 80×24 and 200×50,
//! and the test reads the screen back with `capture-pane`:
//!
//! - the whole screen fits: the title, a row per GPU, the selected GPU's pods, its remainder lines
//!   and total, the keys;
//! - each GPU's block adds up as printed: every column (memory MiB, SM %, watts, cost per hour) of
//!   the lines sums to the total row, and the GPU's row shows the same total;
//! - ↓ chooses the next GPU, `n` + a namespace filters (the other namespaces become one line, the
//!   totals stay), `q` quits;
//! - it redraws in place: nothing reaches tmux's scrollback however many refreshes (before, a
//!   frame taller than the terminal scrolled the attribution off and filled the scrollback).
//!
//! And `top` on this node's own probes (no `--connect`): the same screen, from a fake driver, the
//! fake NVML and a workload holding 1 GiB in a pod's cgroup, at 80×24.
//!
//! Root: the simulated node needs eBPF, FUSE and cgroups. Fails, never skips, without them or
//! without tmux.
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use gpu_tracer_tests::{FakeDriver, PodCgroup, Workload, gpu_tracer, http, require_root, spawn_sim};

/// The tests run one at a time: each drives probes, FUSE and a terminal on a two-core machine.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// tmux on a server of its own (`-L`), so that nothing of the user's is touched.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn new() -> Tmux {
        assert!(Path::new("/usr/bin/tmux").exists(), "tmux not found: `cargo xtask setup` installs Debian's tmux");
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Tmux { socket: format!("gpu-tracer-top-test-{}-{n}", std::process::id()) }
    }

    fn run(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new("tmux").arg("-L").arg(&self.socket).args(args).output().expect("run tmux");
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn ok(&self, args: &[&str]) -> String {
        let (ok, out) = self.run(args);
        assert!(ok, "tmux {args:?} failed: {out}");
        out
    }

    /// The visible screen, line by line.
    fn screen(&self) -> Vec<String> {
        self.ok(&["capture-pane", "-p", "-t", "top"]).lines().map(str::to_string).collect()
    }

    /// Wait until the screen satisfies `ok`, and return it.
    fn wait(&self, what: &str, ok: impl Fn(&[String]) -> bool) -> Vec<String> {
        let start = Instant::now();
        loop {
            let s = self.screen();
            if ok(&s) {
                return s;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "{what} within 30 s; the screen:\n{}", s.join("\n"));
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// The pod block: the rows between the header and the total row, each numeric column (memory,
/// SM, power, cost) cut at the header's offsets, and the total row's; the block's title.
fn block(lines: &[String]) -> (String, Vec<[f64; 4]>, [f64; 4]) {
    let start = lines
        .iter()
        .position(|l| l.contains("POD (namespace/pod/container)"))
        .unwrap_or_else(|| panic!("no pod block:\n{}", lines.join("\n")));
    let header: String = lines[start].clone();
    let at = |name: &str| -> usize {
        header.find(name).map(|b| header[..b].chars().count()).unwrap_or_else(|| panic!("no {name} column"))
    };
    let cols = [at("MEM MiB"), at("SM %"), at("W "), at("COST/h")];
    let ends = [cols[1], cols[2], cols[3], cols[3] + 8];
    let cells = |l: &str| -> [f64; 4] {
        let c: Vec<char> = l.chars().collect();
        std::array::from_fn(|i| {
            let cell: String = c[cols[i].min(c.len())..ends[i].min(c.len())].iter().collect();
            cell.trim().parse::<f64>().unwrap_or(0.0)
        })
    };
    let title = lines[start - 1].trim().trim_matches('─').trim().to_string();
    let mut rows = Vec::new();
    for l in &lines[start + 1..] {
        if l.trim_start().starts_with("total ") {
            return (title, rows, cells(l));
        }
        rows.push(cells(l));
    }
    panic!("no total row:\n{}", lines.join("\n"));
}

/// The selected GPU's block adds up as printed, and its GPU row shows the same memory total.
/// Returns the block's title and how many lines it has.
fn check_block(lines: &[String]) -> (String, usize) {
    let (title, rows, total) = block(lines);
    let names = ["memory MiB", "SM %", "W", "cost/h"];
    for (c, name) in names.iter().enumerate() {
        let sum: f64 = rows.iter().map(|r| r[c]).sum();
        assert!(
            (sum - total[c]).abs() < 1e-6 && total[c] > 0.0,
            "{title}: the {name} column sums to {sum} as printed, its total says {}:\n{}",
            total[c],
            lines.join("\n")
        );
    }
    let selected = lines.iter().find(|l| l.starts_with('>')).unwrap_or_else(|| panic!("no GPU row selected"));
    let mem_total = format!("/{}", total[0] as u64);
    assert!(selected.contains(&mem_total), "the selected GPU's row `{selected}` does not show the total {mem_total}");
    (title, rows.len())
}

#[test]
fn top_fits_80x24_and_200x50_redraws_in_place_and_adds_up_as_printed() {
    let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    require_root();
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("api.sock");
    let api = format!("unix://{}", sock.display());
    let addr = format!("127.0.0.1:{}", free_port());
    let tracer: PathBuf = gpu_tracer();
    let log_path = tmp.path().join("sim.log");
    let args = ["--duration", "300", "--grpc-listen", &api];
    let mut child = spawn_sim("top-node", &addr, &log_path, &args);
    let sim_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let start = Instant::now();
    loop {
        let (status, body) = http::get(&*addr, "/metrics");
        // Pods on both GPUs, with energy and a price (the power and cost columns).
        let pods_on = |gpu: &str| {
            body.lines().any(|l| {
                l.starts_with("gpu_tracer_attribution_memory_bytes{")
                    && l.contains("line=\"container\"")
                    && l.contains(&format!("gpu=\"{gpu}"))
            })
        };
        if status == 200
            && sock.exists()
            && body.contains("gpu_tracer_container_energy_joules_total{")
            && body.contains("gpu_tracer_container_cost_total{")
            && body.contains("gpu_tracer_violation_info{")
            && pods_on("GPU-00000000")
            && pods_on("GPU-00000001")
        {
            break;
        }
        assert!(child.running(), "gpu-tracer-sim exited:\n{}", sim_log());
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the simulated node's agent did not attribute within 120 s:\n{}",
            sim_log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    for (w, h) in [(80u16, 24u16), (200, 50)] {
        let tmux = Tmux::new();
        // The exit status through a file: tmux does not always keep a dead pane's status.
        let status_file = tmp.path().join(format!("status-{w}x{h}"));
        let cmd =
            format!("{} top --connect {api} --interval-ms 300; echo $? > {}", tracer.display(), status_file.display());
        tmux.ok(&["new-session", "-d", "-s", "top", "-x", &w.to_string(), "-y", &h.to_string(), &cmd]);
        // Keep the pane (and its output) if top exits, to say why.
        tmux.ok(&["set-option", "-t", "top", "remain-on-exit", "on"]);
        let lines = tmux.wait("two GPUs and GPU 0's pods", |s| {
            s.iter().any(|l| l.starts_with(">0"))
                && s.iter().any(|l| l.trim_start().starts_with("1 "))
                && s.iter().any(|l| l.starts_with("ml/train-a/"))
                && s.iter().any(|l| l.trim_start().starts_with("total "))
        });
        eprintln!("top --connect at {w}×{h}:\n{}", lines.join("\n"));
        assert_eq!(lines.len(), h as usize, "{w}×{h}");
        assert!(lines.iter().all(|l| l.chars().count() <= w as usize), "{w}×{h}: a line is wider than the terminal");
        assert!(
            lines[0].contains("gpu-tracer top") && lines.last().unwrap().contains("q quit"),
            "{}",
            lines.join("\n")
        );
        let (title, n) = check_block(&lines);
        assert!(title.starts_with("GPU 0"), "{title}");
        assert!(n >= 4, "GPU 0's pods and remainder lines: {n}\n{}", lines.join("\n"));
        if w >= 110 {
            assert!(lines.iter().any(|l| l.contains("LAUNCHES") && l.contains("PIDS")), "{}", lines.join("\n"));
        }

        // ↓: GPU 1, adding up too.
        tmux.ok(&["send-keys", "-t", "top", "Down"]);
        let lines = tmux.wait("GPU 1's block", |s| s.iter().any(|l| l.contains("GPU 1 ·")));
        check_block(&lines);

        // A namespace filter: the other namespaces' pods are one line, the totals stay.
        tmux.ok(&["send-keys", "-t", "top", "Up", "n", "ml", "Enter"]);
        let lines =
            tmux.wait("the namespace filter", |s| s[0].contains("ns=ml") && s.iter().any(|l| l.contains("GPU 0 ·")));
        check_block(&lines);
        assert!(lines.iter().any(|l| l.contains("other namespaces")), "{}", lines.join("\n"));

        // Redrawn in place: a few more refreshes, nothing in the scrollback.
        std::thread::sleep(Duration::from_secs(2));
        let history = tmux.ok(&["display-message", "-p", "-t", "top", "#{history_size}"]);
        assert_eq!(history.trim(), "0", "{w}×{h}: top wrote {} lines to the scrollback", history.trim());

        // q: top exits (status 0) and gives the terminal back.
        tmux.ok(&["send-keys", "-t", "top", "q"]);
        let start = Instant::now();
        loop {
            if let Ok(status) = std::fs::read_to_string(&status_file) {
                assert_eq!(status.trim(), "0", "{w}×{h}: top's exit status on q");
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{w}×{h}: top did not exit on q:\n{}",
                tmux.ok(&["capture-pane", "-p", "-S", "-", "-t", "top"])
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    assert!(child.running(), "gpu-tracer-sim exited:\n{}", sim_log());
}

/// `top` on this node's own probes takes the terminal too: the GPU's row, its block adding up as
/// printed (the workload's 1 GiB among the lines), nothing in the scrollback, `q` exits with 0.
#[test]
fn top_on_its_own_probes_is_the_same_screen() {
    use gpu_tracer_tests::nvml_model::{Busy, NvmlModel};
    let _serial = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    require_root();
    let driver = FakeDriver::start(1).unwrap();
    let pod = PodCgroup::new().unwrap();
    let mut w = Workload::spawn(driver.dev_dir(), Some(&pod)).unwrap();
    for cmd in ["init 0", "alloc-rm 1073741824"] {
        w.ok(cmd).unwrap_or_else(|e| panic!("{cmd}: {e}"));
    }
    let tmp = tempfile::tempdir().unwrap();
    let model = NvmlModel::install(&tmp.path().join("nvml"), &driver.stats().unwrap(), 256 << 20).unwrap();
    let lib = model.library().to_path_buf();
    let pid = w.pid();
    let _follower = model.follow(
        driver.path(gpu_tracer_tests::fake_driver::stats::STATS_FILE_NAME),
        Duration::from_millis(200),
        move || [(pid, Busy { sm_pct: 40, mem_pct: 10 })].into(),
    );
    let status_file = tmp.path().join("status");
    let cmd = format!(
        "{} --no-cuda --nvml required --nvml-library {} --price-per-gpu-hour 3.6 --dev-dir {} --simulated-devices \
         top --interval-ms 300 2>{}; echo $? > {}",
        gpu_tracer().display(),
        lib.display(),
        driver.dev_dir().display(),
        tmp.path().join("stderr").display(),
        status_file.display()
    );
    let tmux = Tmux::new();
    tmux.ok(&["new-session", "-d", "-s", "top", "-x", "80", "-y", "24", &cmd]);
    tmux.ok(&["set-option", "-t", "top", "remain-on-exit", "on"]);
    let lines = tmux.wait("the GPU and its block", |s| {
        s.iter().any(|l| l.starts_with(">0")) && s.iter().any(|l| l.trim_start().starts_with("total "))
    });
    eprintln!("top on its own probes at 80×24:\n{}", lines.join("\n"));
    assert!(lines[0].contains("this node's probes"), "{}", lines[0]);
    let (rows, total) = {
        let (_, rows, total) = block(&lines);
        (rows, total)
    };
    for c in 0..2 {
        let sum: f64 = rows.iter().map(|r| r[c]).sum();
        assert!(
            (sum - total[c]).abs() < 1e-6 && total[c] > 0.0,
            "column {c}: {sum} vs {}:\n{}",
            total[c],
            lines.join("\n")
        );
    }
    assert!(rows.iter().any(|r| r[0] >= 1024.0), "the workload's 1 GiB is a line of its own:\n{}", lines.join("\n"));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(tmux.ok(&["display-message", "-p", "-t", "top", "#{history_size}"]).trim(), "0");
    tmux.ok(&["send-keys", "-t", "top", "q"]);
    let start = Instant::now();
    while !status_file.exists() {
        assert!(start.elapsed() < Duration::from_secs(20), "top did not exit on q:\n{}", tmux.screen().join("\n"));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        std::fs::read_to_string(&status_file).unwrap().trim(),
        "0",
        "{}",
        std::fs::read_to_string(tmp.path().join("stderr")).unwrap_or_default()
    );
    drop(w);
}
