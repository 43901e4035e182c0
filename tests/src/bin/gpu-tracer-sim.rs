//! `gpu-tracer-sim`: a simulated GPU node, and the real `gpu-tracer top` watching it
//! (`cargo xtask sim` builds and runs it).
//!
//! It mounts the fake NVIDIA driver (two GPUs) on a temp dir, creates three cgroups named like
//! Kubernetes pods' containers, starts one `nv-workload` in each with the fake `libcuda.so.1`
//! (the `thunk` variant, whose entry points are shaped like the real 535 library's) and has it
//! open a GPU (`init`) and initialise CUDA (`cuda-init`), then starts `gpu-tracer top
//! --per-process --libcuda <that library>` on the mount. The workloads are already running when
//! the tracer starts, so the tracer finds their device fds with its `/proc` scan (the seed path),
//! and its uprobes on the library's inode reach the copies they have already mapped.
//!
//! Once the tracer's first table is out, one thread per pod drives its workload like a CUDA
//! application: allocations through `RM_ALLOC` (class 0x40) and `RM_VID_HEAP_CONTROL`, pinned host
//! memory, a managed `mmap`, a UVM external mapping, frees, and one process that exits without
//! freeing anything and is replaced (a notebook kernel restart); through libcuda, kernel and graph
//! launches every 500 ms at a different rate per pod, and `cuMemAlloc`/`cuMemFree`/
//! `cuMemAllocManaged` calls (the trainer's are a caching allocator's: big blocks, never freed).
//! The pods' memory stops changing a little before the tracer stops, so that its last table can
//! be checked against the fake driver's own count of video memory per GPU and against each pod's
//! own count of live `cuMemAlloc` bytes. Launches go on to the end; each pod records when it sent
//! each launch command, so the last table's LAUNCHES and GRAPHS are checked against what the pod
//! had made when that table came out.
//!
//! On a terminal the table is redrawn in place; otherwise (CI, pipes) every table is printed in
//! turn, with what the pods did in between. Ctrl-C (or SIGTERM) stops everything early; the RAII
//! guards of the test harness kill the workloads, remove the cgroups and unmount the driver on
//! every path out, panics included.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{RecvTimeoutError, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use gpu_tracer_tests::fake_libcuda::FAKE_LIBCUDA_DIR;
use gpu_tracer_tests::workload::{parse_bytes, parse_number};
use gpu_tracer_tests::{
    AgentProcess, ChildGuard, FakeDriver, PodCgroup, Qos, Runtime, Workload, cgroup2_mount, gpu_tracer_binary,
};

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
    /// Run `gpu-tracer agent --listen ADDR` (Prometheus metrics on http://ADDR/metrics; https
    /// with --metrics-tls-cert) instead of `top`, with two more pods (an idle reservation, a
    /// guardrail violation), until --duration ends or SIGINT/SIGTERM. Nothing is checked: the
    /// caller reads the metrics.
    #[arg(long, value_name = "ADDR")]
    agent: Option<String>,
    /// The node's name (the pods' spec.nodeName and the tracer's kubernetes.node_name). Several
    /// simulated nodes can run at once under different names.
    #[arg(long, default_value = NODE)]
    node: String,
    /// With --agent: the pods' memory stops changing after this many seconds (their launches go
    /// on) [default: 2.5 s before the end].
    #[arg(long, value_name = "SECONDS")]
    quiet_after: Option<f64>,
    /// With --agent: where the agent serves its gRPC API (e.g. unix:///tmp/sim-a.sock) [default:
    /// off, since the default socket is one per machine and several nodes may run here].
    #[arg(long, value_name = "ADDR", default_value = "off")]
    grpc_listen: String,
    /// With --agent: serve /metrics (and /healthz, /readyz) over TLS with this PEM certificate
    /// chain (the agent's `[metrics] tls_cert`; needs --metrics-tls-key) [default: plain HTTP].
    #[arg(long, value_name = "FILE", requires_all = ["agent", "metrics_tls_key"])]
    metrics_tls_cert: Option<PathBuf>,
    /// With --agent: the PEM private key of --metrics-tls-cert (`[metrics] tls_key`).
    #[arg(long, value_name = "FILE", requires_all = ["agent", "metrics_tls_cert"])]
    metrics_tls_key: Option<PathBuf>,
    /// With --agent: /metrics answers only scrapes that carry the bearer token in this file
    /// (`[metrics] token_file`) [default: no token].
    #[arg(long, value_name = "FILE", requires = "agent")]
    metrics_token_file: Option<PathBuf>,
}

impl Args {
    /// The agent's `[metrics]` table for the --metrics-* flags (empty without them: the agent's
    /// defaults, plain HTTP and no token).
    fn metrics_config(&self) -> String {
        let mut table = String::new();
        for (key, value) in [
            ("tls_cert", &self.metrics_tls_cert),
            ("tls_key", &self.metrics_tls_key),
            ("token_file", &self.metrics_token_file),
        ] {
            if let Some(path) = value {
                table.push_str(&format!("{key} = {path:?}\n"));
            }
        }
        if table.is_empty() { table } else { format!("\n[metrics]\n{table}") }
    }

    /// How the agent serves /metrics: `https` with --metrics-tls-cert, else `http`.
    fn metrics_scheme(&self) -> &'static str {
        if self.metrics_tls_cert.is_some() { "https" } else { "http" }
    }
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

// ----- the pods ---------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum App {
    Trainer,
    Inference,
    Notebook,
    /// Holds memory and never launches (an idle reservation).
    Holder,
    /// Launches a little on a GPU it was not allocated (a guardrail violation).
    Rogue,
}

struct PodSpec {
    /// `namespace/name`: the pod in the simulated API server.
    name: &'static str,
    /// The workload that owns the pod (kind, name): what the tracer resolves the owner to.
    owner: (&'static str, &'static str),
    team: &'static str,
    /// SM share the pod keeps busy while it works (the NVML double reports it).
    sm_pct: u32,
    qos: Qos,
    runtime: Runtime,
    /// The GPU the kubelet allocated to the pod (pod-resources).
    gpu: u32,
    /// The GPU its workload opens: `gpu`, except for a pod that breaks its allocation.
    opens: u32,
    app: App,
    what: &'static str,
}

const PODS: [PodSpec; 3] = [
    PodSpec {
        name: "ml/train-a",
        owner: ("ReplicaSet", "train-a-7d9f8c6b5"),
        team: "ml",
        sm_pct: 55,
        qos: Qos::Burstable,
        runtime: Runtime::Containerd,
        gpu: 0,
        opens: 0,
        app: App::Trainer,
        what: "training, 4040 launch/s",
    },
    PodSpec {
        name: "serving/infer-b",
        owner: ("ReplicaSet", "infer-b-5c8d7f9b4"),
        team: "serving",
        sm_pct: 35,
        qos: Qos::Guaranteed,
        runtime: Runtime::Containerd,
        gpu: 1,
        opens: 1,
        app: App::Inference,
        what: "inference, 600 launch/s",
    },
    PodSpec {
        name: "research/notebook-c",
        owner: ("StatefulSet", "notebook-c"),
        team: "research",
        sm_pct: 8,
        qos: Qos::Burstable,
        runtime: Runtime::CriO,
        gpu: 0,
        opens: 0,
        app: App::Notebook,
        what: "notebook: bursts, restart",
    },
];

/// Two more pods with `--agent`, so that every panel of the dashboards and every alert has
/// something to show: one holds memory and runs nothing (an idle reservation), one uses a GPU it
/// was not allocated (a violation).
const AGENT_PODS: [PodSpec; 2] = [
    PodSpec {
        name: "research/holder-d",
        owner: ("StatefulSet", "holder-d"),
        team: "research",
        sm_pct: 0,
        qos: Qos::BestEffort,
        runtime: Runtime::Containerd,
        gpu: 0,
        opens: 0,
        app: App::Holder,
        what: "holds 1 GiB, runs nothing",
    },
    PodSpec {
        name: "scratch/rogue-e",
        owner: ("ReplicaSet", "rogue-e-6b7c8d9f0"),
        team: "ml",
        sm_pct: 2,
        qos: Qos::Burstable,
        runtime: Runtime::Containerd,
        gpu: 0,
        opens: 1,
        app: App::Rogue,
        what: "allocated gpu0, uses gpu1",
    },
];

/// The node the simulated API server binds the pods to (and the tracer watches), unless `--node`.
const NODE: &str = "sim-node";
/// Device memory each fake GPU's driver keeps for itself (NVML `reserved`).
const RESERVED_BYTES: u64 = 512 << 20;
/// The price the cost split uses.
const PRICE_PER_GPU_HOUR: f64 = 4.0;
/// The container name of every simulated pod.
const CONTAINER: &str = "main";

/// The pods' launch loops run once per tick.
const LAUNCH_TICK: Duration = Duration::from_millis(500);
/// The fake libcuda every pod loads: the variant whose entry points are shaped like the real 535
/// library's (a thunk that jumps through a relocated slot to the implementation); on arm64 the
/// branch-protected build (`paciasp`/`bti c` first; no arm64 thunk variant yet).
#[cfg(not(target_arch = "aarch64"))]
const LIBCUDA_VARIANT: &str = "thunk";
#[cfg(target_arch = "aarch64")]
const LIBCUDA_VARIANT: &str = "pac";

fn qos_name(q: Qos) -> &'static str {
    match q {
        Qos::Guaranteed => "guaranteed",
        Qos::Burstable => "burstable",
        Qos::BestEffort => "besteffort",
    }
}

fn short_name(pod: &PodSpec) -> &'static str {
    pod.name.rsplit('/').next().unwrap_or(pod.name)
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

/// One launch command a pod sent: when, and how many launches the workload reported making.
#[derive(Clone, Copy, Debug)]
struct Issued {
    /// When the command was sent.
    start: Instant,
    /// When its answer came back (every launch of the command was made by then).
    end: Instant,
    /// Kernel launches (`cuLaunchKernel`).
    kernels: u64,
    /// Graph launches (`cuGraphLaunch`).
    graphs: u64,
}

/// What a pod thread hands back at the end.
struct PodOutcome {
    workload: Workload,
    /// Every launch command, in order.
    issued: Vec<Issued>,
    /// Live `cuMemAlloc` bytes of the pod's current process.
    cuda_device_bytes: u64,
    error: Option<anyhow::Error>,
}

/// One pod's driver thread: its workload and its clock.
struct AppCtx {
    pod: &'static PodSpec,
    workload: Workload,
    dev_dir: PathBuf,
    cgroup_dir: PathBuf,
    libcuda: PathBuf,
    /// When the tracer was started (the `t+` times).
    t0: Instant,
    /// From this instant on the pod's memory holds still (its launches go on).
    quiet_at: Instant,
    tx: Sender<Msg>,
    /// The next launch tick, and how many have run.
    next_tick: Instant,
    ticks: u64,
    issued: Vec<Issued>,
    /// Live `cuMemAlloc` allocations of the current process: pointer → bytes.
    cuda_live: BTreeMap<u64, u64>,
}

impl AppCtx {
    fn say(&self, what: impl AsRef<str>) {
        let t = self.t0.elapsed().as_secs_f64();
        let _ = self.tx.send(Msg::Activity(format!("t+{t:4.1}s {:<10} {}", short_name(self.pod), what.as_ref())));
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

    /// A command that launches (`launched=N` in the answer), recorded for the final check.
    fn launch(&mut self, line: &str) -> Result<(), Halt> {
        let start = Instant::now();
        let n = self.ok(line)?.number("launched")?;
        let graphs = line.starts_with("cuda-graph-launch");
        let (kernels, graphs) = if graphs { (0, n) } else { (n, 0) };
        self.issued.push(Issued { start, end: Instant::now(), kernels, graphs });
        Ok(())
    }

    /// `cuMemAlloc_v2` of `size` (`256M`); returns the device pointer.
    fn cuda_alloc(&mut self, size: &str) -> Result<u64, Halt> {
        let bytes = parse_bytes(size).with_context(|| format!("size {size}"))?;
        let ptr = self.ok(&format!("cuda-alloc {size}"))?.number("ptr")?;
        self.cuda_live.insert(ptr, bytes);
        Ok(ptr)
    }

    fn cuda_free(&mut self, ptr: u64) -> Result<(), Halt> {
        self.ok(&format!("cuda-free {ptr:#x}"))?;
        self.cuda_live.remove(&ptr);
        Ok(())
    }

    /// The pod's launches of one tick.
    fn tick(&mut self) -> Result<(), Halt> {
        let now = Instant::now();
        self.next_tick += LAUNCH_TICK;
        if self.next_tick < now {
            // Late (a slow command, a restart): start over from now rather than catch up.
            self.next_tick = now + LAUNCH_TICK;
        }
        self.ticks += 1;
        match self.pod.app {
            App::Trainer => {
                self.launch("cuda-launch 2000")?;
                self.launch("cuda-graph-launch 20")?;
            }
            App::Inference => self.launch("cuda-launch 300")?,
            // A cell runs for a second (two threads) every three seconds.
            App::Notebook if self.ticks % 6 < 2 => self.launch("cuda-launch-threads 2 500")?,
            App::Notebook | App::Holder => {}
            App::Rogue => self.launch("cuda-launch 10")?,
        }
        Ok(())
    }

    /// Launch on every tick for `ms`, or stop early when the pod's memory must hold still.
    fn work(&mut self, ms: u64) -> Result<(), Halt> {
        let until = Instant::now() + Duration::from_millis(ms);
        loop {
            let now = Instant::now();
            if stopping() || now >= self.quiet_at {
                return Err(Halt::Quiet);
            }
            if now >= until {
                return Ok(());
            }
            if now >= self.next_tick {
                self.tick()?;
                continue;
            }
            std::thread::sleep((until.min(self.next_tick) - now).min(Duration::from_millis(50)));
        }
    }

    /// Launch on every tick until the run ends (after the tracer's last table, too: the final
    /// check allows for that).
    fn launch_until_stopped(&mut self) -> Result<(), Halt> {
        loop {
            if stopping() {
                return Ok(());
            }
            let now = Instant::now();
            if now >= self.next_tick {
                self.tick()?;
            } else {
                std::thread::sleep((self.next_tick - now).min(Duration::from_millis(50)));
            }
        }
    }

    fn run(&mut self) -> Result<(), Halt> {
        let script = match self.pod.app {
            App::Trainer => self.trainer(),
            App::Inference => self.inference(),
            App::Notebook => self.notebook(),
            App::Holder => self.alloc("alloc-rm 1G").map(|_| self.say("1 GiB (RM_ALLOC), then nothing")),
            App::Rogue => self.alloc("alloc-rm 256M").map(|_| self.say("256 MiB on gpu1, allocated gpu0")),
        };
        match script {
            Ok(()) | Err(Halt::Quiet) => self.launch_until_stopped(),
            Err(e) => Err(e),
        }
    }

    /// Weights and optimizer state, a cuDNN workspace, pinned staging buffers, the weights mapped
    /// into the UVM address space; then one step's activations allocated and freed, over and over.
    /// At the CUDA level: a caching allocator's big blocks, reserved once and never freed.
    fn trainer(&mut self) -> Result<(), Halt> {
        let weights = self.alloc("alloc-rm 6G")?;
        self.alloc("alloc-vidheap 512M")?;
        self.alloc("alloc-rm 256M sysmem")?;
        self.ok(&format!("uvm-map-external {weights:#x} 6G"))?;
        self.say("weights 6 GiB (RM_ALLOC), workspace 512 MiB (VID_HEAP)");
        self.say("256 MiB pinned host memory; weights mapped into UVM");
        let start = Instant::now();
        let a = self.ok("cuda-caching-pattern 4 2G 1000")?;
        let ptrs = a.get("ptrs").unwrap_or_default().to_string();
        for p in ptrs.split(',').filter_map(parse_number) {
            self.cuda_live.insert(p, 2 << 30);
        }
        self.issued.push(Issued { start, end: Instant::now(), kernels: a.number("launched")?, graphs: 0 });
        self.say("cuda: caching allocator, 4 x 2 GiB cuMemAlloc, kept");
        self.say("cuda: 2000 launches + 20 graph launches every 0.5 s");
        for step in 1.. {
            self.work(1500)?;
            let act = self.alloc("alloc-rm 1G")?;
            self.say(format!("step {step}: +1 GiB activations"));
            self.work(1500)?;
            self.ok(&format!("free {act:#x}"))?;
            self.say(format!("step {step}: activations freed"));
        }
        Ok(())
    }

    /// A 2 GiB model and a KV cache that grows in 256 MiB blocks and is flushed when full; each
    /// also allocated through libcuda.
    fn inference(&mut self) -> Result<(), Halt> {
        self.alloc("alloc-rm 2G")?;
        self.cuda_alloc("2G")?;
        self.say("2 GiB model (RM_ALLOC; cuMemAlloc 2 GiB)");
        self.say("cuda: 300 launches every 0.5 s");
        let mut blocks = Vec::new();
        loop {
            self.work(1000)?;
            if blocks.len() == 6 {
                for (h, ptr) in std::mem::take(&mut blocks) {
                    self.ok(&format!("free-vidheap {h:#x}"))?;
                    self.cuda_free(ptr)?;
                }
                self.say("KV cache flushed: 6 x 256 MiB freed (VID_HEAP, cuMemFree)");
            } else {
                let h = self.alloc("alloc-vidheap 256M")?;
                blocks.push((h, self.cuda_alloc("256M")?));
                self.say(format!("KV cache +256 MiB (VID_HEAP, cuMemAlloc), {} of 6", blocks.len()));
            }
        }
    }

    /// Some tensors and managed memory; a 2 GiB experiment allocated and freed; then the kernel
    /// restarts: the process exits without freeing anything and a new one starts in the pod.
    /// Launches come in bursts (a cell runs, then nothing).
    fn notebook(&mut self) -> Result<(), Halt> {
        self.alloc("alloc-rm 512M")?;
        self.ok("managed-mmap 2G")?;
        self.cuda_alloc("512M")?;
        self.ok("cuda-alloc-managed 2G")?;
        self.say("tensors 512 MiB (RM_ALLOC), managed mmap 2 GiB");
        self.say("cuda: 512 MiB cuMemAlloc, 2 GiB cuMemAllocManaged");
        self.say("cuda: bursts of 2 threads x 500 launches");
        self.work(2500)?;
        let big = self.alloc("alloc-rm 2G")?;
        let cbig = self.cuda_alloc("2G")?;
        self.say("+2 GiB experiment (RM_ALLOC, cuMemAlloc)");
        self.work(2500)?;
        self.ok(&format!("free {big:#x}"))?;
        self.cuda_free(cbig)?;
        self.say("experiment freed");
        self.work(2000)?;

        let old = self.workload.pid();
        self.ok("exit")?;
        self.workload.wait()?;
        let fresh = Workload::builder(&self.dev_dir)
            .cgroup_dir(&self.cgroup_dir)
            .driver_version(DRIVER_VERSION)
            .libcuda(&self.libcuda)
            .spawn()
            .context("respawn nv-workload")?;
        // The old guard goes now (its process is gone); the new one is killed on drop like it.
        drop(std::mem::replace(&mut self.workload, fresh));
        self.cuda_live.clear();
        self.ok(&format!("init {}", self.pod.opens))?;
        self.ok("cuda-init")?;
        self.say(format!("restart: pid {old} exited without freeing; now pid {}", self.workload.pid()));
        self.work(1000)?;
        self.alloc("alloc-rm 768M")?;
        self.ok("managed-mmap 1G")?;
        self.cuda_alloc("768M")?;
        self.ok("cuda-alloc-managed 1G")?;
        self.say("tensors 768 MiB, managed mmap 1 GiB (and through libcuda)");
        Ok(())
    }
}

/// One thread per pod driving its workload (in the order of `pods`), from now on.
fn start_pods(
    pods: &[(&'static PodSpec, PodCgroup)],
    workloads: impl IntoIterator<Item = Workload>,
    dev_dir: &std::path::Path,
    libcuda: &std::path::Path,
    t0: Instant,
    quiet_at: Instant,
    tx: &Sender<Msg>,
) -> Vec<JoinHandle<PodOutcome>> {
    let now = Instant::now();
    pods.iter()
        .zip(workloads)
        .map(|((spec, cg), w)| {
            spawn_app(AppCtx {
                pod: spec,
                workload: w,
                dev_dir: dev_dir.to_path_buf(),
                cgroup_dir: cg.path().to_path_buf(),
                libcuda: libcuda.to_path_buf(),
                t0,
                quiet_at,
                tx: tx.clone(),
                next_tick: now,
                ticks: 0,
                issued: Vec::new(),
                cuda_live: BTreeMap::new(),
            })
        })
        .collect()
}

/// Drive one pod until the run ends: its memory until it must hold still, its launches until the
/// end. Hands back its workload (still running, memory held) and what it did.
fn spawn_app(mut ctx: AppCtx) -> JoinHandle<PodOutcome> {
    std::thread::spawn(move || {
        let error = match ctx.run() {
            Ok(()) | Err(Halt::Quiet) => None,
            Err(Halt::Failed(e)) => {
                ctx.say(format!("FAILED: {e:#}"));
                Some(e)
            }
        };
        PodOutcome {
            cuda_device_bytes: ctx.cuda_live.values().sum(),
            workload: ctx.workload,
            issued: ctx.issued,
            error,
        }
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
    let truth: Vec<String> = driver_used
        .iter()
        .enumerate()
        .map(|(i, b)| format!("gpu{i} {}", tracer_core::format::human_bytes(*b)))
        .collect();
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

/// A pod's row of the CUDA table: LAUNCHES, GRAPHS and CUDA MEM (bytes, tolerance).
#[derive(Clone, Debug, PartialEq)]
struct CudaRow {
    launches: u64,
    graphs: u64,
    mem: (f64, f64),
    /// CUDA MEM as printed.
    mem_text: String,
}

/// The cgroup rows of the CUDA table of a `top` frame, by their name (`namespace/pod/container`).
/// A narrow table wraps the first column onto the next lines: the text left of the LAUNCH/s
/// column on a line with nothing right of it continues the row above.
fn cuda_rows(frame: &[String]) -> BTreeMap<String, CudaRow> {
    let mut rows = BTreeMap::new();
    let Some(header) = frame.iter().position(|l| l.contains("CUDA (libcuda)")) else { return rows };
    let Some(cut) = frame[header].find("LAUNCH/s").map(|b| frame[header][..b].chars().count()) else {
        return rows;
    };
    // (first column, the rest) of each row, continuation lines joined.
    let mut cells: Vec<(String, String)> = Vec::new();
    for line in &frame[header + 1..] {
        if line.starts_with("per GPU:") || line.starts_with("events:") {
            break;
        }
        let name: String = line.chars().take(cut).collect();
        let rest: String = line.chars().skip(cut).collect();
        match cells.last_mut() {
            Some((first, _)) if rest.trim().is_empty() && !name.trim().is_empty() => {
                first.push(' ');
                first.push_str(name.trim());
            }
            _ if !rest.trim().is_empty() => cells.push((name.trim().to_string(), rest)),
            _ => {}
        }
    }
    for (name, rest) in cells {
        // `namespace/pod/container`, wrapped anywhere; process rows (a pid) are skipped.
        let key: String = name.split_whitespace().collect();
        if key.matches('/').count() != 2 {
            continue;
        }
        // RATE LAUNCHES GRAPHS <CUDA MEM> <MANAGED> ALLOC/FREE; a size is `0` or a number and a unit.
        let words: Vec<&str> = rest.split_whitespace().collect();
        let (Some(launches), Some(graphs)) = (words.get(1), words.get(2)) else { continue };
        let mem_text = match words.get(3..5) {
            Some([n, unit]) if *n != "0" && !unit.contains('/') => format!("{n} {unit}"),
            _ => words.get(3).copied().unwrap_or_default().to_string(),
        };
        let (Ok(launches), Ok(graphs), Some(mem)) = (launches.parse(), graphs.parse(), parse_human(&mem_text)) else {
            continue;
        };
        rows.insert(key, CudaRow { launches, graphs, mem, mem_text });
    }
    rows
}

/// What a table can hold of the launches a pod made: every launch whose command was answered
/// before `lower_cut` (the previous table was out), none of those sent after `upper_cut` (this
/// table was out), any number of those in between.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct LaunchBounds {
    lower: u64,
    /// Launches made (or being made) when the table came out.
    upper: u64,
}

impl LaunchBounds {
    fn of(issued: &[Issued], count: impl Fn(&Issued) -> u64, lower_cut: Instant, upper_cut: Instant) -> Self {
        let mut b = LaunchBounds::default();
        for i in issued {
            if i.end < lower_cut {
                b.lower += count(i);
            }
            if i.start < upper_cut {
                b.upper += count(i);
            }
        }
        b
    }

    fn holds(&self, seen: u64) -> bool {
        (self.lower..=self.upper).contains(&seen)
    }
}

/// What one pod made through libcuda, for the final check.
#[derive(Clone)]
struct PodCuda {
    name: &'static str,
    /// The pod's row name in the tables: `namespace/pod/container`.
    key: String,
    kernels: LaunchBounds,
    graphs: LaunchBounds,
    device_bytes: u64,
}

/// The pods' own CUDA counts against the CUDA table of the tracer's last frame. Returns the
/// report lines and whether every pod agrees.
fn check_cuda(frame: &[String], pods: &[PodCuda]) -> (Vec<String>, bool) {
    let rows = cuda_rows(frame);
    let mut lines = vec![
        "CUDA, the pods' own count when the tracer's last table came out vs that table:".to_string(),
        format!(
            "{:<12}{:>11}{:>11}{:>9}{:>11}{:>11}{:>11}",
            "", "launches", "in table", "graphs", "in table", "CUDA MEM", "in table"
        ),
    ];
    let mut problems = Vec::new();
    for p in pods {
        let row = rows.get(&p.key);
        let cell = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        lines.push(format!(
            "  {:<10}{:>11}{:>11}{:>9}{:>11}{:>11}{:>11}",
            p.name,
            p.kernels.upper,
            cell(row.map(|r| r.launches.to_string())),
            p.graphs.upper,
            cell(row.map(|r| r.graphs.to_string())),
            tracer_core::format::human_bytes(p.device_bytes),
            cell(row.map(|r| r.mem_text.clone())),
        ));
        let Some(row) = row else {
            problems.push(format!("{}: no row in the CUDA table", p.name));
            continue;
        };
        if row.launches == 0 {
            problems.push(format!("{}: no launches", p.name));
        }
        for (what, b, seen) in [("launches", p.kernels, row.launches), ("graph launches", p.graphs, row.graphs)] {
            if !b.holds(seen) {
                problems.push(format!("{}: {seen} {what}, expected {}..={}", p.name, b.lower, b.upper));
            }
        }
        let (v, tol) = row.mem;
        if (v - p.device_bytes as f64).abs() > tol + 0.5 {
            problems.push(format!("{}: CUDA MEM {}", p.name, row.mem_text));
        }
    }
    let agree = problems.is_empty();
    if agree {
        lines.push("CUDA: the tracer agrees with every pod".into());
    } else {
        lines.push(format!("CUDA: the tracer DISAGREES: {}", problems.join("; ")));
    }
    (lines, agree)
}

/// The parts of the node other than the driver: an API server with the pods, the kubelet's
/// pod-resources socket, NVML (a fake libnvidia-ml.so.1 whose readings follow the fake driver and
/// the pods' declared SM activity, rewritten by a thread), and the tracer's config file naming them.
struct NodeDoubles {
    _rt: tokio::runtime::Runtime,
    _api: gpu_tracer_tests::kube_api::FakeApiServer,
    _kubelet: gpu_tracer_tests::pod_resources::FakePodResources,
    dir: PathBuf,
    /// The TOML config `gpu-tracer` gets.
    config: PathBuf,
    /// Stops the NVML model's thread on drop (before the directory goes).
    model: Option<gpu_tracer_tests::nvml_model::Follower>,
}

impl NodeDoubles {
    /// `extra_config`: TOML tables appended to the tracer's config (none of `[nvml]`,
    /// `[attribution]`, `[kubernetes]`, which this writes).
    fn start(
        driver: &FakeDriver,
        pods: &[(&PodSpec, PodCgroup)],
        node: &str,
        extra_config: &str,
    ) -> anyhow::Result<NodeDoubles> {
        use gpu_tracer_proto::podresources::v1 as pr;
        use gpu_tracer_tests::{
            kube_api::{FakeApiServer, FakePod},
            nvml_model::{Busy, NvmlModel, gpu_uuid},
            pod_resources::FakePodResources,
        };
        let dir = std::env::temp_dir().join(format!("gpu-tracer-sim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
        let api = rt.block_on(FakeApiServer::start()).context("starting the fake API server")?;
        let kubelet = rt.block_on(FakePodResources::start()).context("starting the fake pod-resources socket")?;
        let mut listed = Vec::new();
        for (spec, cg) in pods {
            let (ns, name) = spec.name.split_once('/').unwrap_or(("default", spec.name));
            let mut pod = FakePod::new(ns, name, node)
                .uid(cg.pod_uid())
                .label("team", spec.team)
                .label("app.kubernetes.io/name", name)
                .owner(spec.owner.0, spec.owner.1)
                .container(CONTAINER, 1, Some(&format!("{}://{}", runtime_scheme(spec.runtime), cg.container_id())));
            if spec.owner.0 == "ReplicaSet" {
                let hash = spec.owner.1.rsplit('-').next().unwrap_or_default();
                pod = pod.label("pod-template-hash", hash);
            }
            api.apply(pod.build());
            // GPU 0 is time-sliced (4 replicas): train-a holds replica 0, notebook-c replica 1.
            let id = if spec.gpu == 0 {
                format!("{}::{}", gpu_uuid(0), listed.iter().filter(|(g, _)| *g == 0).count())
            } else {
                gpu_uuid(spec.gpu)
            };
            listed.push((
                spec.gpu,
                pr::PodResources {
                    name: name.into(),
                    namespace: ns.into(),
                    containers: vec![pr::ContainerResources {
                        name: CONTAINER.into(),
                        devices: vec![pr::ContainerDevices {
                            resource_name: "nvidia.com/gpu".into(),
                            device_ids: vec![id],
                            topology: None,
                        }],
                        ..Default::default()
                    }],
                },
            ));
        }
        kubelet.set_pods(listed.into_iter().map(|(_, p)| p).collect());
        let mut allocatable: Vec<String> = (0..4).map(|r| format!("{}::{r}", gpu_uuid(0))).collect();
        allocatable.push(gpu_uuid(1));
        kubelet.set_allocatable(pr::AllocatableResourcesResponse {
            devices: vec![pr::ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: allocatable,
                topology: None,
            }],
            ..Default::default()
        });
        let kubeconfig = dir.join("kubeconfig");
        api.write_kubeconfig(&kubeconfig).context("writing the kubeconfig")?;

        let stats = driver.stats().context("reading the fake driver's stats")?;
        let model = NvmlModel::install(&dir.join("nvml"), &stats, RESERVED_BYTES)
            .context("installing the fake libnvidia-ml.so.1")?;
        let config = dir.join("gpu-tracer.toml");
        std::fs::write(
            &config,
            format!(
                "[nvml]\nmode = \"required\"\nlibrary = {:?}\n\n[attribution]\nprice_per_gpu_hour = {PRICE_PER_GPU_HOUR}\n\
                 idle_reservation_after_s = 5\n\n[kubernetes]\nmode = \"required\"\nnode_name = {node:?}\nkubeconfig = {:?}\n\
                 pod_resources_socket = {:?}\n{extra_config}",
                model.library(),
                kubeconfig,
                kubelet.socket()
            ),
        )?;
        // NVML follows the driver: every 250 ms, each pod's processes (read from its cgroup, so a
        // restarted process is followed) report the pod's SM share.
        let stats_path = driver.dev_dir().join(gpu_tracer_tests::fake_driver::stats::STATS_FILE_NAME);
        let busy_by_cgroup: Vec<(PathBuf, u32)> =
            pods.iter().map(|(s, cg)| (cg.path().to_path_buf(), s.sm_pct)).collect();
        let follower = model.follow(stats_path, Duration::from_millis(250), move || {
            let mut busy = BTreeMap::new();
            for (cg, sm) in &busy_by_cgroup {
                let procs = std::fs::read_to_string(cg.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                    busy.insert(pid, Busy { sm_pct: *sm, mem_pct: *sm / 2 });
                }
            }
            busy
        });
        Ok(NodeDoubles { _rt: rt, _api: api, _kubelet: kubelet, dir, config, model: Some(follower) })
    }
}

impl Drop for NodeDoubles {
    fn drop(&mut self) {
        drop(self.model.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn runtime_scheme(r: Runtime) -> &'static str {
    match r {
        Runtime::Containerd => "containerd",
        Runtime::CriO => "cri-o",
        _ => "docker",
    }
}

/// Every pod is named in the attribution blocks of the last table, and each block's TOTAL line
/// is there (the table re-splits shown values so that they add up; the exact sums are checked by
/// the attribution property tests and tests/tests/attribution.rs).
fn check_attribution(frame: &[String]) -> (Vec<String>, bool) {
    let text = frame.join("\n");
    let mut problems = Vec::new();
    for spec in &PODS {
        if !text.contains(&format!("{}/{CONTAINER}", spec.name)) && !text.contains(spec.name) {
            problems.push(format!("{} is not named", spec.name));
        }
    }
    let blocks = frame.iter().filter(|l| l.trim_start().starts_with("GPU ")).count();
    if blocks < GPUS as usize {
        problems.push(format!("{blocks} GPU blocks, expected {GPUS}"));
    }
    if problems.is_empty() {
        (vec![format!("attribution: {blocks} GPU blocks, every pod named by its Kubernetes name")], true)
    } else {
        (vec![format!("attribution: DISAGREES: {}", problems.join("; "))], false)
    }
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
        None => gpu_tracer_binary().context("or pass --tracer")?,
    };
    let libcuda = PathBuf::from(FAKE_LIBCUDA_DIR).join(LIBCUDA_VARIANT).join("libcuda.so.1");
    if !libcuda.is_file() {
        bail!("{} is missing: `cargo build --release -p gpu-tracer-tests` builds it", libcuda.display());
    }
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
    let extra: &'static [PodSpec] = if args.agent.is_some() { &AGENT_PODS } else { &[] };
    // Each agent-mode node probes its own copy of the library (uprobes are per inode), so that two
    // simulated nodes on one machine do not count each other's launches.
    let own_libcuda = match &args.agent {
        Some(_) => Some(LibcudaCopy::new(&libcuda, &args.node)?),
        None => None,
    };
    let libcuda = own_libcuda.as_ref().map_or(libcuda, |c| c.path.clone());
    let base: &'static [PodSpec] = &PODS;
    for spec in base.iter().chain(extra) {
        let cg = PodCgroup::create(spec.qos, spec.runtime)
            .with_context(|| format!("creating the cgroup of {}", spec.name))?;
        pods.push((spec, cg));
    }
    let mut workloads = Vec::new();
    for (spec, cg) in &pods {
        let mut w = Workload::builder(&dev_dir)
            .cgroup(cg)
            .driver_version(DRIVER_VERSION)
            .libcuda(&libcuda)
            .spawn()
            .with_context(|| format!("starting the workload of {}", spec.name))?;
        w.ok(&format!("init {}", spec.opens)).with_context(|| format!("{}: init", spec.name))?;
        w.ok("cuda-init").with_context(|| format!("{}: cuda-init", spec.name))?;
        workloads.push(w);
    }
    interrupted()?;

    // The rest of the node: an API server with the three pods, the kubelet's pod-resources socket
    // (train-a and notebook-c time-slice GPU 0 as replicas; infer-b has GPU 1), and NVML.
    let doubles = NodeDoubles::start(&driver, &pods, &args.node, &args.metrics_config())
        .context("starting the Kubernetes and NVML doubles")?;
    let setup_s = started.elapsed().as_secs_f64();
    if let Some(listen) = &args.agent {
        let node = Node { driver, pods, workloads, doubles, libcuda, dev_dir };
        let code = run_agent(args, listen, &tracer, node, setup_s);
        drop(own_libcuda);
        return code;
    }

    let mut legend = vec![format!(
        "gpu-tracer-sim: fake NVIDIA driver {DRIVER_VERSION}, {GPUS} GPUs x {} GiB, 3 pods",
        GPU_MEMORY_BYTES >> 30
    )];
    legend.push(format!(
        "(a fake API server names the pods, a fake kubelet socket says which GPU each holds, a fake \
         NVML reports the GPUs; price {PRICE_PER_GPU_HOUR:.2}/GPU-hour)"
    ));
    for (spec, _) in &pods {
        legend.push(format!(
            "  {:<20}{:<10}  gpu{}  SM {:>2}%  {}",
            spec.name,
            qos_name(spec.qos),
            spec.gpu,
            spec.sm_pct,
            spec.what,
        ));
    }
    legend.push(format!("every pod drives a fake libcuda.so.1 ({LIBCUDA_VARIANT} variant: entry points like 535's)"));
    for l in &legend {
        println!("{l}");
    }
    println!("devices: {}", dev_dir.display());
    println!("the workloads opened their GPU and loaded libcuda before the tracer starts:");
    println!("it finds their device fds in /proc; its uprobes on the library's inode reach");
    println!("the copies they already mapped");

    // The tracer.
    let mut top_cmd = Command::new(&tracer);
    top_cmd
        .arg("--dev-dir")
        .arg(&dev_dir)
        .arg("--simulated-devices")
        .args(["--driver-version", DRIVER_VERSION])
        .arg("--libcuda")
        .arg(&libcuda)
        .arg("--config")
        .arg(&doubles.config)
        .args(["top", "--per-process"])
        .args(["--interval-ms", &args.interval_ms.to_string(), "--duration", &args.duration.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    println!("+ {}", display(&top_cmd));
    let t0 = Instant::now();
    // Stopped (SIGTERM, then SIGKILL after 3 s) should the simulator end early.
    let mut top = ChildGuard::new(top_cmd.spawn().with_context(|| format!("starting {}", tracer.display()))?)
        .named("gpu-tracer top")
        .grace(Duration::from_secs(3));
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
    // Memory holds still for the last two or three tables (launches go on to the end).
    let quiet_window = Duration::from_millis(2500).max(interval * 2 + Duration::from_millis(500));
    let mut apps: Vec<JoinHandle<PodOutcome>> = Vec::new();
    let mut idle = workloads.into_iter();
    let mut frame: Vec<String> = Vec::new();
    let mut last_frame: Vec<String> = Vec::new();
    // When each complete table's first and last lines came in.
    let mut frame_started = None;
    let mut frame_times: Vec<(Instant, Instant)> = Vec::new();
    let mut frames = 0u64;
    let mut stop_asked = false;
    let mut top_status = None;
    loop {
        if stopping() && !stop_asked {
            stop_asked = true;
            top_status = top.stop();
        }
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Msg::Top(line)) if line.is_empty() => {
                // `top` ends every table with an empty line when its stdout is not a terminal.
                if frame.is_empty() {
                    continue;
                }
                screen.frame(&frame);
                last_frame = std::mem::take(&mut frame);
                frame_times.push((frame_started.take().unwrap_or_else(Instant::now), Instant::now()));
                frames += 1;
                if frames == 1 {
                    // The tracer is up (probes attached, /proc seeded): the pods start working.
                    let end = t0 + Duration::from_secs_f64(args.duration);
                    let now = Instant::now();
                    let quiet_at = end.checked_sub(quiet_window).unwrap_or(now).max(now);
                    apps = start_pods(&pods, idle.by_ref(), &dev_dir, &libcuda, t0, quiet_at, &tx);
                }
            }
            Ok(Msg::Top(line)) => {
                frame_started.get_or_insert_with(Instant::now);
                frame.push(line);
            }
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
    // From its last table to its exit (detaching the probes).
    let tracer_exit_s = frame_times.last().map_or(0.0, |(_, end)| end.elapsed().as_secs_f64());

    // The pods' memory is holding still (or they were told to stop): stop their launches and
    // collect them.
    let signalled = stop_asked || stopping();
    STOP.store(true, Ordering::SeqCst);
    let mut workloads: Vec<Workload> = idle.collect();
    let mut failures = Vec::new();
    // What each pod did through libcuda, in the order of `pods` (none if a thread was lost).
    let mut cuda_done = Vec::new();
    for h in apps {
        match h.join() {
            Ok(o) => {
                workloads.push(o.workload);
                failures.extend(o.error);
                cuda_done.push((o.issued, o.cuda_device_bytes));
            }
            Err(_) => failures.push(anyhow::anyhow!("a pod thread panicked")),
        }
    }
    while let Ok(msg) = rx.try_recv() {
        if let Msg::Activity(line) = msg {
            println!("{line}");
        }
    }

    // Check the tracer's last table against the driver's own view and the pods' own CUDA
    // counts, unless cut short.
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
        // The last table came out at `upper_cut`; it was taken after the one before it was out.
        let [.., (_, lower_cut), (upper_cut, _)] = frame_times[..] else { unreachable!("frames >= 2") };
        let pod_cuda: Vec<PodCuda> = pods
            .iter()
            .zip(&cuda_done)
            .map(|((spec, _), (issued, device_bytes))| PodCuda {
                name: short_name(spec),
                key: format!("{}/{CONTAINER}", spec.name),
                kernels: LaunchBounds::of(issued, |i| i.kernels, lower_cut, upper_cut),
                graphs: LaunchBounds::of(issued, |i| i.graphs, lower_cut, upper_cut),
                device_bytes: *device_bytes,
            })
            .collect();
        if pod_cuda.len() == pods.len() {
            let (lines, ok) = check_cuda(&last_frame, &pod_cuda);
            agree &= ok;
            for l in lines {
                println!("{l}");
            }
        } else {
            agree = false;
            println!("CUDA: not checked, {} of {} pods reported", pod_cuda.len(), pods.len());
        }
    }

    // The attribution blocks of the last table: every pod is named there, and the lines add up.
    if !signalled && top_status.success() && frames >= 2 {
        let (lines, ok) = check_attribution(&last_frame);
        agree &= ok;
        for l in lines {
            println!("{l}");
        }
    }

    let cleanup = Instant::now();
    drop(doubles);
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
        "took {:.1} s: setup {setup_s:.1} s, tracer {:.1} s ({frames} tables) + exit {tracer_exit_s:.1} s, \
         cleanup {cleanup_s:.1} s",
        started.elapsed().as_secs_f64(),
        tracer_s - tracer_exit_s,
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

// ----- agent mode ---------------------------------------------------------------------------------

/// A simulated node's parts, declared in the order they must go: the doubles, the workloads, the
/// pods' cgroups, then the driver.
struct Node {
    doubles: NodeDoubles,
    workloads: Vec<Workload>,
    pods: Vec<(&'static PodSpec, PodCgroup)>,
    driver: FakeDriver,
    libcuda: PathBuf,
    dev_dir: PathBuf,
}

/// This node's own copy of the fake libcuda (removed on drop).
struct LibcudaCopy {
    dir: PathBuf,
    path: PathBuf,
}

impl LibcudaCopy {
    fn new(src: &std::path::Path, node: &str) -> anyhow::Result<Self> {
        let safe: String = node.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
        let dir = std::env::temp_dir().join(format!("gpu-tracer-sim-{}-{safe}-libcuda", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("libcuda.so.1");
        std::fs::copy(src, &path).with_context(|| format!("copying {} to {}", src.display(), path.display()))?;
        Ok(LibcudaCopy { dir, path })
    }
}

impl Drop for LibcudaCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `--agent`: the real `gpu-tracer agent` serving /metrics on `listen` watches the node until
/// --duration ends or a signal; the pods start working once it serves.
fn run_agent(
    args: &Args,
    listen: &str,
    tracer: &std::path::Path,
    mut node: Node,
    setup_s: f64,
) -> anyhow::Result<ExitCode> {
    println!(
        "gpu-tracer-sim: node {}: fake NVIDIA driver {DRIVER_VERSION}, {GPUS} GPUs x {} GiB, {} pods, price \
         {PRICE_PER_GPU_HOUR:.2}/GPU-hour",
        args.node,
        GPU_MEMORY_BYTES >> 30,
        node.pods.len()
    );
    for (spec, _) in &node.pods {
        println!(
            "  {:<20}{:<10}  gpu{}  SM {:>2}%  {}",
            spec.name,
            qos_name(spec.qos),
            spec.gpu,
            spec.sm_pct,
            spec.what
        );
    }
    println!("devices: {}", node.dev_dir.display());
    let mut cmd = Command::new(tracer);
    cmd.arg("--dev-dir")
        .arg(&node.dev_dir)
        .arg("--simulated-devices")
        .args(["--driver-version", DRIVER_VERSION])
        .arg("--libcuda")
        .arg(&node.libcuda)
        .arg("--config")
        .arg(&node.doubles.config)
        .args(["agent", "--listen", listen, "--grpc-listen", &args.grpc_listen])
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped());
    println!("+ {}", display(&cmd));
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(args.duration);
    // The agent's log goes on to our stderr; its "serving http(s)://" line says the probes are
    // attached and the first snapshot is being made.
    let mut agent = AgentProcess::spawn_echoing(&mut cmd).with_context(|| format!("starting {}", tracer.display()))?;
    let (tx, rx) = channel();
    let mut apps: Vec<JoinHandle<PodOutcome>> = Vec::new();
    let mut pods_started = false;
    let mut exited_early = false;
    let agent_status = loop {
        if stopping() || Instant::now() >= end {
            break agent.stop().ok();
        }
        if agent.try_wait().is_some() {
            exited_early = true;
            break agent.wait().ok();
        }
        if !pods_started && agent.try_metrics_addr().is_some() {
            pods_started = true;
            let now = Instant::now();
            let quiet_at = match args.quiet_after {
                Some(q) => t0 + Duration::from_secs_f64(q.max(0.0)),
                None => end.checked_sub(Duration::from_millis(2500)).unwrap_or(now),
            }
            .max(now);
            println!(
                "t+{:4.1}s the agent serves {}://{listen}/metrics; the pods start working",
                t0.elapsed().as_secs_f64(),
                args.metrics_scheme()
            );
            let workloads = std::mem::take(&mut node.workloads);
            apps = start_pods(&node.pods, workloads, &node.dev_dir, &node.libcuda, t0, quiet_at, &tx);
        }
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Msg::Activity(line)) => println!("{line}"),
            Ok(Msg::Top(_) | Msg::TopEof) | Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
        }
    };
    let signalled = stopping();
    STOP.store(true, Ordering::SeqCst);
    let mut failures = Vec::new();
    for h in apps {
        match h.join() {
            Ok(o) => {
                node.workloads.push(o.workload);
                failures.extend(o.error);
            }
            Err(_) => failures.push(anyhow::anyhow!("a pod thread panicked")),
        }
    }
    while let Ok(msg) = rx.try_recv() {
        if let Msg::Activity(line) = msg {
            println!("{line}");
        }
    }
    let status = agent_status.map_or_else(|| "unknown (not reaped)".to_string(), |s| s.to_string());
    if exited_early {
        println!("gpu-tracer agent exited on its own after {:.1} s: {status}", t0.elapsed().as_secs_f64());
    } else {
        println!("gpu-tracer agent stopped after {:.1} s: {status}", t0.elapsed().as_secs_f64());
    }
    let cleanup = Instant::now();
    let Node { doubles, workloads, pods, driver, .. } = node;
    drop(doubles);
    let (n_workloads, n_pods) = (workloads.len(), pods.len());
    drop(workloads);
    drop(pods);
    let unmount = driver.stop();
    println!(
        "cleaned up: {n_workloads} workloads stopped, {n_pods} pod cgroups removed, fake driver {} (setup {setup_s:.1} s, \
         cleanup {:.1} s)",
        if unmount.is_ok() { "unmounted" } else { "unmount FAILED" },
        cleanup.elapsed().as_secs_f64()
    );
    for e in &failures {
        eprintln!("gpu-tracer-sim: a pod failed: {e:#}");
    }
    if let Err(e) = &unmount {
        eprintln!("gpu-tracer-sim: unmounting the fake driver: {e}");
    }
    if exited_early || !failures.is_empty() || unmount.is_err() {
        return Ok(ExitCode::FAILURE);
    }
    Ok(if signalled { ExitCode::from(INTERRUPTED) } else { ExitCode::SUCCESS })
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

    /// A frame's CUDA table as `top --per-process` prints it at 80 columns.
    fn cuda_frame() -> Vec<String> {
        [
            "──────────────────────────────────────────────────────────────────────────────",
            " CUDA (libcuda)          LAUNCH/s  LAUNCHES  GRAPHS  CUDA MEM  MANAGED  ALLOC/FREE",
            "══════════════════════════════════════════════════════════════════════════════",
            " ml/train-a/main             4040     70040     700   8.0 GiB        0         4/0",
            "   4242                      4040     70040     700   8.0 GiB        0         4/0",
            " research/notebook-c/main       0      8000       0   768 MiB  1.0 GiB         2/0",
            " serving/infer-b/main         600     10200       0         0        0         7/7",
            "──────────────────────────────────────────────────────────────────────────────",
            "per GPU: gpu0 8.2 GiB | gpu1 2.2 GiB",
        ]
        .map(String::from)
        .to_vec()
    }

    /// The same table at a width where the first column wraps (pod names split anywhere).
    fn wrapped_cuda_frame() -> Vec<String> {
        [
            "─────────────────────────────────────────────────────────────────────────────",
            " CUDA (libcuda)     LAUNCH/s  LAUNCHES  GRAPHS  CUDA MEM  MANAGED  ALLOC/FREE",
            "═════════════════════════════════════════════════════════════════════════════",
            " ml/train-a/main        4043     70040     700   8.0 GiB        0         4/0",
            "   5081                 4043     70040     700   8.0 GiB        0         4/0",
            " research/notebook-        0      8000       0   768 MiB  1.0 GiB         2/0",
            " c/main                                                                      ",
            " serving/infer-b/ma      600     10200       0         0        0         7/7",
            " in                                                                          ",
            "─────────────────────────────────────────────────────────────────────────────",
            "per GPU: gpu0 7.2 GiB | gpu1 2.5 GiB | unknown-gpu 0",
        ]
        .map(String::from)
        .to_vec()
    }

    #[test]
    fn cuda_rows_are_read_per_pod() {
        assert_eq!(cuda_rows(&wrapped_cuda_frame()), cuda_rows(&cuda_frame()));
        let rows = cuda_rows(&cuda_frame());
        assert_eq!(rows.len(), 3, "{rows:?}");
        let a = &rows["ml/train-a/main"];
        assert_eq!((a.launches, a.graphs, a.mem_text.as_str()), (70040, 700, "8.0 GiB"));
        let c = &rows["research/notebook-c/main"];
        assert_eq!((c.launches, c.mem_text.as_str()), (8000, "768 MiB"));
        assert_eq!(c.mem.0, (768u64 << 20) as f64);
        let b = &rows["serving/infer-b/main"];
        assert_eq!((b.launches, b.mem), (10200, (0.0, 0.0)));
        // No CUDA table, no rows.
        assert!(cuda_rows(&frame("per GPU: gpu0 1.0 GiB")).is_empty());
    }

    #[test]
    fn launch_bounds_allow_only_what_came_after_the_table() {
        let t = Instant::now();
        let at = |ms: u64| t + Duration::from_millis(ms);
        let cmd = |start: u64, end: u64, kernels: u64| Issued { start: at(start), end: at(end), kernels, graphs: 0 };
        // Tables came out at 1000 (previous) and 2000 (last).
        let issued = [cmd(0, 10, 100), cmd(500, 510, 100), cmd(1500, 1510, 100), cmd(2500, 2510, 100)];
        let b = LaunchBounds::of(&issued, |i| i.kernels, at(1000), at(2000));
        assert_eq!(b, LaunchBounds { lower: 200, upper: 300 });
        assert!(b.holds(200) && b.holds(250) && b.holds(300));
        assert!(!b.holds(199), "launches made before the previous table are lost");
        assert!(!b.holds(301), "launches made after the last table cannot be in it");
    }

    #[test]
    fn cuda_check_compares_every_pod() {
        let exact = |n: u64| LaunchBounds { lower: n, upper: n };
        let pods = [
            PodCuda {
                name: "train-a",
                key: "ml/train-a/main".into(),
                kernels: exact(70040),
                graphs: exact(700),
                device_bytes: 8 << 30,
            },
            PodCuda {
                name: "notebook-c",
                key: "research/notebook-c/main".into(),
                kernels: LaunchBounds { lower: 8000, upper: 9000 },
                graphs: exact(0),
                device_bytes: 768 << 20,
            },
            PodCuda {
                name: "infer-b",
                key: "serving/infer-b/main".into(),
                kernels: exact(10200),
                graphs: exact(0),
                device_bytes: 0,
            },
        ];
        let (lines, ok) = check_cuda(&cuda_frame(), &pods);
        assert!(ok, "{lines:#?}");
        for l in &lines {
            assert!(l.chars().count() <= 80, "{l:?} is {} columns", l.chars().count());
        }
        let mut wrong = pods.clone();
        wrong[2].kernels = exact(10300);
        wrong[0].device_bytes = 6 << 30;
        let (lines, ok) = check_cuda(&cuda_frame(), &wrong);
        assert!(!ok);
        let verdict = lines.last().unwrap();
        assert!(verdict.contains("infer-b: 10200 launches") && verdict.contains("train-a: CUDA MEM"), "{verdict}");
        // A pod missing from the table disagrees.
        wrong[1].key = "research/other/main".into();
        assert!(check_cuda(&cuda_frame(), &wrong).0.last().unwrap().contains("notebook-c: no row"));
    }

    #[test]
    fn legend_fits_80_columns() {
        for spec in &PODS {
            let l = format!(
                "  {:<20}{:<10}  gpu{}  SM {:>2}%  {}",
                spec.name,
                qos_name(spec.qos),
                spec.gpu,
                spec.sm_pct,
                spec.what
            );
            assert!(l.chars().count() <= 80, "{l:?} is {} columns", l.chars().count());
        }
    }
}
