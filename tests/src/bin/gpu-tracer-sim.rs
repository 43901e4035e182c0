//! `gpu-tracer-sim`: a simulated GPU node, and the real `gpu-tracer top` watching it
//! (`cargo xtask sim` builds and runs it).
//!
//! It mounts the fake NVIDIA driver (two GPUs) on a temp dir, creates three cgroups named like
//! Kubernetes pods' containers, starts one `nv-workload` in each and has it open a GPU (`init`),
//! then starts `gpu-tracer top --per-process` on the mount. The workloads are already running when
//! the tracer starts, so the tracer finds their device fds with its `/proc` scan (the seed path).
//! Once the tracer's first table is out, one thread per pod drives its workload like a CUDA
//! application: allocations through `RM_ALLOC` (class 0x40) and `RM_VID_HEAP_CONTROL`, pinned host
//! memory, a managed `mmap`, a UVM external mapping, frees, and one process that exits without
//! freeing anything and is replaced (a notebook kernel restart). The pods stop changing a little
//! before the tracer stops, so that its last table can be checked against the fake driver's own
//! count of video memory per GPU.
//!
//! On a terminal the table is redrawn in place; otherwise (CI, pipes) every table is printed in
//! turn, with what the pods did in between. Ctrl-C (or SIGTERM) stops everything early; the RAII
//! guards of the test harness kill the workloads, remove the cgroups and unmount the driver on
//! every path out, panics included.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{RecvTimeoutError, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use gpu_tracer_tests::{FakeDriver, PodCgroup, Qos, Runtime, Workload, cgroup2_mount, locate_binary};

/// Driver version the fake driver reports and whose struct layouts everyone uses.
const DRIVER_VERSION: &str = "535.261.03";
const GPUS: u32 = 2;
const GPU_MEMORY_BYTES: u64 = 80 << 30;
/// Exit status after Ctrl-C / SIGTERM (128 + SIGINT, as shells report it).
const INTERRUPTED: u8 = 130;

#[derive(Parser, Debug)]
#[command(
    name = "gpu-tracer-sim",
    about = "A simulated GPU node (fake NVIDIA driver, three pods running CUDA-like workloads) \
             watched by the real `gpu-tracer top`. Needs root, /dev/fuse and cgroup v2."
)]
struct Args {
    /// How long `gpu-tracer top` runs, in seconds.
    #[arg(long, default_value_t = 20.0)]
    duration: f64,
    /// Refresh interval of `gpu-tracer top`, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// The `gpu-tracer` binary [default: the one next to this program].
    #[arg(long)]
    tracer: Option<PathBuf>,
}

// ----- signals ------------------------------------------------------------------------------------

/// Set by SIGINT / SIGTERM / SIGHUP; every loop of this program polls it.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Turn the stop signals into [`STOP`] so that cleanup always runs. Handlers do not survive
/// `exec`, so the children keep the default behaviour.
fn install_stop_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction is valid; the handler only stores to an atomic
        // (async-signal-safe).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

fn stopping() -> bool {
    STOP.load(Ordering::SeqCst)
}

// ----- the pods -----------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum App {
    Trainer,
    Inference,
    Notebook,
}

struct PodSpec {
    /// `namespace/name`, for the legend (the tracer does not know Kubernetes names yet).
    name: &'static str,
    qos: Qos,
    runtime: Runtime,
    gpu: u32,
    app: App,
    what: &'static str,
}

const PODS: [PodSpec; 3] = [
    PodSpec {
        name: "ml/train-a",
        qos: Qos::Burstable,
        runtime: Runtime::Containerd,
        gpu: 0,
        app: App::Trainer,
        what: "training loop",
    },
    PodSpec {
        name: "serving/infer-b",
        qos: Qos::Guaranteed,
        runtime: Runtime::Containerd,
        gpu: 1,
        app: App::Inference,
        what: "inference server",
    },
    PodSpec {
        name: "research/notebook-c",
        qos: Qos::Burstable,
        runtime: Runtime::CriO,
        gpu: 0,
        app: App::Notebook,
        what: "notebook, restarts",
    },
];

fn qos_name(q: Qos) -> &'static str {
    match q {
        Qos::Guaranteed => "guaranteed",
        Qos::Burstable => "burstable",
        Qos::BestEffort => "besteffort",
    }
}

/// A message for the main thread.
enum Msg {
    /// One line of `gpu-tracer top`'s stdout.
    Top(String),
    /// `gpu-tracer top` closed its stdout.
    TopEof,
    /// Something a pod did.
    Activity(String),
}

/// Why an app thread stopped issuing commands.
enum Halt {
    /// Time to hold still (the end of the run is near, or a stop was asked for).
    Quiet,
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for Halt {
    fn from(e: anyhow::Error) -> Self {
        Halt::Failed(e)
    }
}

impl From<gpu_tracer_tests::HarnessError> for Halt {
    fn from(e: gpu_tracer_tests::HarnessError) -> Self {
        Halt::Failed(e.into())
    }
}

/// One pod's driver thread: its workload and its clock.
struct AppCtx {
    pod: &'static PodSpec,
    workload: Workload,
    dev_dir: PathBuf,
    cgroup_dir: PathBuf,
    /// When the tracer was started (the `t+` times).
    t0: Instant,
    /// From this instant on the pod holds still.
    quiet_at: Instant,
    tx: Sender<Msg>,
}

impl AppCtx {
    fn short(&self) -> &'static str {
        self.pod.name.rsplit('/').next().unwrap_or(self.pod.name)
    }

    fn say(&self, what: impl AsRef<str>) {
        let t = self.t0.elapsed().as_secs_f64();
        let _ = self.tx.send(Msg::Activity(format!("t+{t:4.1}s {:<10} {}", self.short(), what.as_ref())));
    }

    /// A command that must answer `ok`.
    fn ok(&mut self, line: &str) -> Result<gpu_tracer_tests::Answer, Halt> {
        if stopping() {
            return Err(Halt::Quiet);
        }
        let name = self.pod.name;
        self.workload.ok(line).map_err(|e| Halt::Failed(anyhow::Error::new(e).context(format!("{name}: `{line}`"))))
    }

    /// An allocating command; returns the new handle.
    fn alloc(&mut self, line: &str) -> Result<u32, Halt> {
        Ok(self.ok(line)?.handle("handle")?)
    }

    /// Sleep `ms`, or stop early when the pod must hold still.
    fn pause(&self, ms: u64) -> Result<(), Halt> {
        let until = Instant::now() + Duration::from_millis(ms);
        loop {
            let now = Instant::now();
            if stopping() || now >= self.quiet_at {
                return Err(Halt::Quiet);
            }
            if now >= until {
                return Ok(());
            }
            std::thread::sleep((until - now).min(Duration::from_millis(50)));
        }
    }

    fn run(&mut self) -> Result<(), Halt> {
        match self.pod.app {
            App::Trainer => self.trainer(),
            App::Inference => self.inference(),
            App::Notebook => self.notebook(),
        }
    }

    /// Weights and optimizer state, a cuDNN workspace, pinned staging buffers, the weights mapped
    /// into the UVM address space; then one step's activations allocated and freed, over and over.
    fn trainer(&mut self) -> Result<(), Halt> {
        let weights = self.alloc("alloc-rm 6G")?;
        self.alloc("alloc-vidheap 512M")?;
        self.alloc("alloc-rm 256M sysmem")?;
        self.ok(&format!("uvm-map-external {weights:#x} 6G"))?;
        self.say("weights 6 GiB (RM_ALLOC), workspace 512 MiB (VID_HEAP)");
        self.say("256 MiB pinned host memory; weights mapped into UVM");
        for step in 1.. {
            self.pause(1500)?;
            let act = self.alloc("alloc-rm 1G")?;
            self.say(format!("step {step}: +1 GiB activations"));
            self.pause(1500)?;
            self.ok(&format!("free {act:#x}"))?;
            self.say(format!("step {step}: activations freed"));
        }
        Ok(())
    }

    /// A 2 GiB model and a KV cache that grows in 256 MiB blocks and is flushed when full.
    fn inference(&mut self) -> Result<(), Halt> {
        self.alloc("alloc-rm 2G")?;
        self.say("2 GiB model (RM_ALLOC)");
        let mut blocks = Vec::new();
        loop {
            self.pause(1000)?;
            if blocks.len() == 6 {
                for h in std::mem::take(&mut blocks) {
                    self.ok(&format!("free-vidheap {h:#x}"))?;
                }
                self.say("KV cache flushed: 6 x 256 MiB freed (VID_HEAP)");
            } else {
                blocks.push(self.alloc("alloc-vidheap 256M")?);
                self.say(format!("KV cache +256 MiB (VID_HEAP), {} of 6 blocks", blocks.len()));
            }
        }
    }

    /// Some tensors and managed memory; a 2 GiB experiment allocated and freed; then the kernel
    /// restarts: the process exits without freeing anything and a new one starts in the pod.
    fn notebook(&mut self) -> Result<(), Halt> {
        self.alloc("alloc-rm 512M")?;
        self.ok("managed-mmap 2G")?;
        self.say("tensors 512 MiB (RM_ALLOC), managed mmap 2 GiB");
        self.pause(2500)?;
        let big = self.alloc("alloc-rm 2G")?;
        self.say("+2 GiB experiment");
        self.pause(2500)?;
        self.ok(&format!("free {big:#x}"))?;
        self.say("experiment freed");
        self.pause(2000)?;

        let old = self.workload.pid();
        self.ok("exit")?;
        self.workload.wait()?;
        let fresh = Workload::builder(&self.dev_dir)
            .cgroup_dir(&self.cgroup_dir)
            .driver_version(DRIVER_VERSION)
            .spawn()
            .context("respawn nv-workload")?;
        // The old guard goes now (its process is gone); the new one is killed on drop like it.
        drop(std::mem::replace(&mut self.workload, fresh));
        self.ok(&format!("init {}", self.pod.gpu))?;
        self.say(format!("restart: pid {old} exited without freeing; now pid {}", self.workload.pid()));
        self.pause(1000)?;
        self.alloc("alloc-rm 768M")?;
        self.ok("managed-mmap 1G")?;
        self.say("tensors 768 MiB, managed mmap 1 GiB");
        Ok(())
    }
}

/// Drive one pod until it must hold still; returns its workload (still running, memory held)
/// and what went wrong, if anything.
fn spawn_app(mut ctx: AppCtx) -> JoinHandle<(Workload, Option<anyhow::Error>)> {
    std::thread::spawn(move || {
        let err = match ctx.run() {
            Ok(()) | Err(Halt::Quiet) => None,
            Err(Halt::Failed(e)) => {
                ctx.say(format!("FAILED: {e:#}"));
                Some(e)
            }
        };
        (ctx.workload, err)
    })
}

// ----- output -------------------------------------------------------------------------------------

/// Parse a size as `top` prints it (`0`, `512 B`, `1.5 GiB`) into bytes and the rounding
/// error its printed precision allows.
fn parse_human(s: &str) -> Option<(f64, f64)> {
    let s = s.trim();
    if s == "0" {
        return Some((0.0, 0.0));
    }
    let (num, unit) = s.split_once(' ')?;
    let shift = match unit {
        "B" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        "TiB" => 40,
        "PiB" => 50,
        _ => return None,
    };
    let v: f64 = num.parse().ok()?;
    let decimals = num.split_once('.').map_or(0, |(_, d)| d.len()) as i32;
    let scale = (1u64 << shift) as f64;
    Some((v * scale, 0.5 * 10f64.powi(-decimals) * scale))
}

/// The `per GPU: gpu0 7.0 GiB | gpu1 3.5 GiB` line of a `top` table, as (name, bytes, tolerance).
fn per_gpu(frame: &[String]) -> Option<Vec<(String, f64, f64)>> {
    let line = frame.iter().find_map(|l| l.strip_prefix("per GPU: "))?;
    line.split(" | ")
        .map(|part| {
            let (name, size) = part.trim().split_once(' ')?;
            let (v, tol) = parse_human(size)?;
            Some((name.to_string(), v, tol))
        })
        .collect()
}

/// What the fake driver counts (physical video memory per GPU) against the tracer's last table.
/// Returns the report line and whether they agree.
fn check_against_driver(frame: &[String], driver_used: &[u64]) -> (String, bool) {
    let truth: Vec<String> =
        driver_used.iter().enumerate().map(|(i, b)| format!("gpu{i} {}", tracer_user::export::top::human_bytes(*b))).collect();
    let truth = truth.join(" | ");
    let Some(seen) = per_gpu(frame) else {
        let agree = driver_used.iter().all(|b| *b == 0);
        return (format!("fake driver: {truth}; the tracer's last table has no per-GPU line"), agree);
    };
    let mut agree = true;
    for (i, used) in driver_used.iter().enumerate() {
        let name = format!("gpu{i}");
        let (v, tol) = seen.iter().find(|(n, _, _)| *n == name).map_or((0.0, 0.0), |(_, v, t)| (*v, *t));
        agree &= (v - *used as f64).abs() <= tol + 0.5;
    }
    // Memory the tracer could not place on a GPU would show up under another name.
    agree &= seen.iter().all(|(n, v, _)| {
        n.strip_prefix("gpu").is_some_and(|m| m.parse::<usize>().is_ok_and(|m| m < driver_used.len())) || *v == 0.0
    });
    let verdict = if agree { "agrees" } else { "DISAGREES" };
    (format!("fake driver's own count: {truth} (tracer {verdict})"), agree)
}

/// Where the run's output goes: redrawn in place on a terminal, appended otherwise.
struct Screen {
    tty: bool,
    legend: Vec<String>,
    activity: VecDeque<String>,
    duration: f64,
    t0: Instant,
}

impl Screen {
    const RECENT: usize = 3;

    fn activity(&mut self, line: String) {
        if self.tty {
            self.activity.push_back(line);
            while self.activity.len() > Self::RECENT {
                self.activity.pop_front();
            }
        } else {
            println!("{line}");
        }
    }

    fn frame(&mut self, frame: &[String]) {
        let t = self.t0.elapsed().as_secs_f64();
        let mut out = String::new();
        if self.tty {
            out.push_str("\x1b[H\x1b[2J");
            for l in &self.legend {
                out.push_str(l);
                out.push('\n');
            }
            out.push_str(&format!("--- gpu-tracer top, t+{t:.0}s of {:.0}s (Ctrl-C stops) ---\n", self.duration));
        } else {
            out.push_str(&format!("--- gpu-tracer top, t+{t:.1}s ---\n"));
        }
        for l in frame {
            out.push_str(l);
            out.push('\n');
        }
        if self.tty && !self.activity.is_empty() {
            out.push_str("recent pod activity:\n");
            for l in &self.activity {
                out.push_str(l);
                out.push('\n');
            }
        }
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(out.as_bytes()).and_then(|()| stdout.flush());
    }
}

// ----- the run ------------------------------------------------------------------------------------

/// Fail with a clear message (no panic) where the simulation cannot run.
fn preflight() -> anyhow::Result<()> {
    let mut missing = Vec::new();
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        missing.push(format!("root (euid is {euid}): eBPF, FUSE mounts and cgroups need it"));
    }
    if !std::path::Path::new("/dev/fuse").exists() {
        missing.push("/dev/fuse (FUSE, for the fake driver; `modprobe fuse`)".into());
    }
    if cgroup2_mount().is_none() {
        missing.push("a cgroup v2 mount".into());
    }
    if !missing.is_empty() {
        bail!("the simulated node needs {}", missing.join("; "));
    }
    Ok(())
}

fn interrupted() -> anyhow::Result<()> {
    if stopping() { bail!("interrupted") } else { Ok(()) }
}

/// Ask `top` to stop (SIGINT, which it handles), then kill it if it does not.
fn stop_child(child: &mut Child, grace: Duration) -> Option<ExitStatus> {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let start = Instant::now();
    while start.elapsed() < grace {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait().ok()
}

fn main() -> ExitCode {
    let args = Args::parse();
    install_stop_handlers();
    match run(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpu-tracer-sim: error: {e:#}");
            if stopping() { ExitCode::from(INTERRUPTED) } else { ExitCode::FAILURE }
        }
    }
}

fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    if args.duration.is_nan() || args.duration <= 0.0 {
        bail!("--duration must be positive");
    }
    preflight()?;
    let tracer = match &args.tracer {
        Some(t) => t.clone(),
        None => locate_binary("gpu-tracer")
            .context("`cargo build --release -p tracer-user` builds gpu-tracer (or pass --tracer)")?,
    };
    let tty = std::io::stdout().is_terminal();

    // Guards, declared so that they drop in the right order: workloads, then cgroups, then driver.
    let driver = FakeDriver::builder()
        .gpus(GPUS)
        .gpu_memory_bytes(GPU_MEMORY_BYTES)
        .driver_version(DRIVER_VERSION)
        .start()
        .context("starting the fake NVIDIA driver")?;
    let dev_dir = driver.dev_dir().to_path_buf();
    interrupted()?;
    let mut pods = Vec::new();
    for spec in &PODS {
        let cg = PodCgroup::create(spec.qos, spec.runtime)
            .with_context(|| format!("creating the cgroup of {}", spec.name))?;
        pods.push((spec, cg));
    }
    let mut workloads = Vec::new();
    for (spec, cg) in &pods {
        let mut w = Workload::builder(&dev_dir)
            .cgroup(cg)
            .driver_version(DRIVER_VERSION)
            .spawn()
            .with_context(|| format!("starting the workload of {}", spec.name))?;
        w.ok(&format!("init {}", spec.gpu)).with_context(|| format!("{}: init", spec.name))?;
        workloads.push(w);
    }
    interrupted()?;
    let setup_s = started.elapsed().as_secs_f64();

    let mut legend = vec![format!(
        "gpu-tracer-sim: fake NVIDIA driver {DRIVER_VERSION}, {GPUS} GPUs x {} GiB, 3 pods",
        GPU_MEMORY_BYTES >> 30
    )];
    legend.push("(the table names a pod by its UID; Kubernetes names are not looked up yet)".into());
    for (spec, cg) in &pods {
        legend.push(format!(
            "  {:<20}pod {}  {:<10}  gpu{}  {}",
            spec.name,
            &cg.pod_uid()[..8],
            qos_name(spec.qos),
            spec.gpu,
            spec.what,
        ));
    }
    for l in &legend {
        println!("{l}");
    }
    println!("devices: {}", dev_dir.display());
    println!("the workloads opened their GPU before the tracer starts: it finds them in /proc");

    // The tracer.
    let mut top_cmd = Command::new(&tracer);
    top_cmd
        .arg("--dev-dir")
        .arg(&dev_dir)
        .args(["--driver-version", DRIVER_VERSION, "top", "--per-process"])
        .args(["--interval-ms", &args.interval_ms.to_string(), "--duration", &args.duration.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    println!("+ {}", display(&top_cmd));
    let t0 = Instant::now();
    let mut top = top_cmd.spawn().with_context(|| format!("starting {}", tracer.display()))?;
    let (tx, rx) = channel();
    let top_out = top.stdout.take().expect("piped stdout");
    let reader_tx = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(top_out).lines() {
            let Ok(line) = line else { break };
            if reader_tx.send(Msg::Top(line)).is_err() {
                return;
            }
        }
        let _ = reader_tx.send(Msg::TopEof);
    });

    let mut screen = Screen { tty, legend, activity: VecDeque::new(), duration: args.duration, t0 };
    let interval = Duration::from_millis(args.interval_ms.max(50));
    // Hold still for the last two or three tables.
    let quiet_window = Duration::from_millis(2500).max(interval * 2 + Duration::from_millis(500));
    let mut apps: Vec<JoinHandle<(Workload, Option<anyhow::Error>)>> = Vec::new();
    let mut idle = workloads.into_iter();
    let mut frame: Vec<String> = Vec::new();
    let mut last_frame: Vec<String> = Vec::new();
    let mut frames = 0u64;
    let mut stop_asked = false;
    let mut top_status = None;
    loop {
        if stopping() && !stop_asked {
            stop_asked = true;
            top_status = stop_child(&mut top, Duration::from_secs(3));
        }
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Msg::Top(line)) if line.is_empty() => {
                // `top` ends every table with an empty line when its stdout is not a terminal.
                if frame.is_empty() {
                    continue;
                }
                screen.frame(&frame);
                last_frame = std::mem::take(&mut frame);
                frames += 1;
                if frames == 1 {
                    // The tracer is up (probes attached, /proc seeded): the pods start working.
                    let end = t0 + Duration::from_secs_f64(args.duration);
                    let quiet_at = end.checked_sub(quiet_window).unwrap_or(Instant::now()).max(Instant::now());
                    for ((spec, cg), w) in pods.iter().zip(idle.by_ref()) {
                        apps.push(spawn_app(AppCtx {
                            pod: spec,
                            workload: w,
                            dev_dir: dev_dir.clone(),
                            cgroup_dir: cg.path().to_path_buf(),
                            t0,
                            quiet_at,
                            tx: tx.clone(),
                        }));
                    }
                }
            }
            Ok(Msg::Top(line)) => frame.push(line),
            Ok(Msg::Activity(line)) => screen.activity(line),
            Ok(Msg::TopEof) => break,
            // top's exit shows as the end of its output.
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    if !frame.is_empty() {
        // A table cut short by the end of the output.
        screen.frame(&frame);
    }
    let top_status = match top_status {
        Some(s) => s,
        None => top.wait().context("waiting for gpu-tracer top")?,
    };
    let tracer_s = t0.elapsed().as_secs_f64();

    // The pods are holding still (or were told to stop): collect them.
    let signalled = stop_asked || stopping();
    STOP.store(true, Ordering::SeqCst);
    let mut workloads: Vec<Workload> = idle.collect();
    let mut failures = Vec::new();
    for h in apps {
        match h.join() {
            Ok((w, err)) => {
                workloads.push(w);
                failures.extend(err);
            }
            Err(_) => failures.push(anyhow::anyhow!("a pod thread panicked")),
        }
    }
    while let Ok(msg) = rx.try_recv() {
        if let Msg::Activity(line) = msg {
            println!("{line}");
        }
    }

    // Check the tracer's last table against the driver's own view, unless cut short.
    let mut agree = true;
    println!();
    if signalled {
        println!("stopped early: the last table was not checked against the driver");
    } else if !top_status.success() {
        println!("gpu-tracer top exited with {top_status}");
    } else if frames < 2 {
        println!("gpu-tracer top printed {frames} table(s); nothing to check");
    } else {
        let stats = driver.stats().context("reading the fake driver's stats")?;
        let used: Vec<u64> = stats.gpus.iter().map(|g| g.used_bytes).collect();
        let (line, ok) = check_against_driver(&last_frame, &used);
        agree = ok;
        println!("{line}");
    }

    let cleanup = Instant::now();
    let (n_workloads, n_pods) = (workloads.len(), pods.len());
    drop(workloads);
    drop(pods);
    let unmount = driver.stop();
    let cleanup_s = cleanup.elapsed().as_secs_f64();
    println!(
        "cleaned up: {n_workloads} workloads stopped, {n_pods} pod cgroups removed, fake driver {}",
        if unmount.is_ok() { "unmounted" } else { "unmount FAILED" }
    );
    println!(
        "took {:.1} s: setup {setup_s:.1} s, tracer {tracer_s:.1} s ({frames} tables), cleanup {cleanup_s:.1} s",
        started.elapsed().as_secs_f64()
    );

    for e in &failures {
        eprintln!("gpu-tracer-sim: a pod failed: {e:#}");
    }
    if let Err(e) = &unmount {
        eprintln!("gpu-tracer-sim: unmounting the fake driver: {e}");
    }
    if signalled {
        return Ok(ExitCode::from(INTERRUPTED));
    }
    if !top_status.success() || !failures.is_empty() || !agree || unmount.is_err() || frames == 0 {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// A command line for messages (no quoting).
fn display(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(per_gpu: &str) -> Vec<String> {
        vec!["gpu-tracer — driver 535.261.03".into(), per_gpu.into(), "events: seen 3 = received 3 + dropped 0".into()]
    }

    #[test]
    fn sizes_parse_back_with_their_rounding() {
        assert_eq!(parse_human("0"), Some((0.0, 0.0)));
        assert_eq!(parse_human("512 B"), Some((512.0, 0.5)));
        let (v, tol) = parse_human("1.5 GiB").unwrap();
        assert_eq!(v, 1.5 * (1u64 << 30) as f64);
        assert_eq!(tol, 0.05 * (1u64 << 30) as f64);
        assert_eq!(parse_human("200 MiB").unwrap().0, (200u64 << 20) as f64);
        assert_eq!(parse_human("lots"), None);
    }

    #[test]
    fn driver_count_is_checked_per_gpu() {
        let f = frame("per GPU: gpu0 7.3 GiB | gpu1 3.8 GiB");
        let used = [(7u64 << 30) + (768 << 20) - (512 << 20), (3u64 << 30) + (768 << 20)];
        let (line, ok) = check_against_driver(&f, &used);
        assert!(ok, "{line}");
        let (line, ok) = check_against_driver(&f, &[7 << 30, 3 << 30]);
        assert!(!ok, "{line}");
        assert!(line.contains("DISAGREES"));
        // Memory on a GPU the driver does not have, or on no GPU, is a disagreement.
        let (_, ok) = check_against_driver(&frame("per GPU: gpu0 1.0 GiB | unknown-gpu 1.0 GiB"), &[1 << 30, 0]);
        assert!(!ok);
        let (_, ok) = check_against_driver(&frame("per GPU: gpu0 1.0 GiB | unknown-gpu 0"), &[1 << 30, 0]);
        assert!(ok);
    }

    #[test]
    fn legend_fits_80_columns() {
        for spec in &PODS {
            let l = format!(
                "  {:<20}pod {}  {:<10}  gpu{}  {}",
                spec.name,
                "1b2c3d4e",
                qos_name(spec.qos),
                spec.gpu,
                spec.what
            );
            assert!(l.chars().count() <= 80, "{l:?} is {} columns", l.chars().count());
        }
    }
}
