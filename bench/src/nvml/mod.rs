//! Section 7: what one NVML pass (`NvmlSource::sample`) costs the agent on an 8-GPU × 100-process
//! node, against the fake `libnvidia-ml.so.1` (tests/fake-nvml), and the agent-side memory of that
//! node size: the NVML source with a sample plus an attributor fed for the full rightsizing window,
//! measured in a child process (`__rss`) so nothing else the bench did is in its RSS.
use std::{
    fmt::Write,
    hint::black_box,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail};
use fake_nvml::{ComputeMode, Device, Process, Scenario, UtilizationSample};
use tracer_agent::nvml::sampler::NvmlSource;
use tracer_core::attribution::Attributor;

use crate::{
    attribution::{CONTAINERS_PER_GPU, GPUS},
    sys,
};

/// Per-sample timings, µs.
#[derive(Default)]
pub struct Timings {
    pub wall_us: Vec<f64>,
    pub cpu_us: Vec<f64>,
}

impl Timings {
    fn time<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let (c0, w0) = (sys::thread_cpu_ns(), Instant::now());
        let out = black_box(f());
        self.wall_us.push(w0.elapsed().as_nanos() as f64 / 1e3);
        self.cpu_us.push((sys::thread_cpu_ns() - c0) as f64 / 1e3);
        out
    }
}

/// One configuration of the sampling measurement.
pub struct SampleRow {
    pub what: &'static str,
    pub timings: Timings,
    /// What the last sample held: (devices, processes, process-utilization samples, missing readings).
    pub seen: (usize, usize, usize, usize),
    /// What the scenario should give: (devices, processes, process-utilization samples).
    pub expected: (usize, usize, usize),
}

/// The child's `/proc/self/status` readings, kB: (VmRSS, VmHWM, RssAnon) at each point.
pub struct RssMeasured {
    pub start: (u64, u64, u64),
    pub after_nvml: (u64, u64, u64),
    pub after_attributor: (u64, u64, u64),
}

pub struct NvmlMeasured {
    pub rows: Vec<SampleRow>,
    pub rss: Result<RssMeasured, String>,
}

pub struct NvmlSection {
    pub result: Result<NvmlMeasured, String>,
}

impl NvmlSection {
    pub fn skipped(why: &str) -> Self {
        Self { result: Err(why.into()) }
    }
}

const GIB: u64 = 1 << 30;
/// NVML calls in one pass over the fake node without processes: the device count, then per GPU the
/// handle, 14 readings (uuid, name, minor, PCI, memory, utilization, power, energy, three clocks,
/// temperature, compute and MIG mode) and one size query for each of the three process lists and
/// process utilization (a non-empty list takes a second call to fill it).
const FLOOR_CALLS: u64 = 1 + GPUS * (1 + 14 + 4);

fn pid(g: u64, i: u64) -> u32 {
    (100_000 + g * 1_000 + i) as u32
}

/// The fake node: `GPUS` H200s (MIG off), `processes` compute processes each with one
/// process-utilization sample, every reading the sampler makes present.
pub fn scenario(processes: u64) -> Scenario {
    let mut s = Scenario::new("550.54.15").nvml_version("12.550.54.15").cuda_driver_version(12040);
    for g in 0..GPUS {
        let procs: Vec<Process> = (0..processes).map(|i| Process::new(pid(g, i), (i % 10 + 1) * GIB / 10)).collect();
        let used: u64 =
            procs.iter().map(|p| if let fake_nvml::UsedBytes::Bytes(b) = p.used_bytes { b } else { 0 }).sum();
        let total = 143_771u64 << 20;
        let d = Device::new(&format!("GPU-{g:08x}-0000-0000-0000-000000000000"))
            .name("NVIDIA H200")
            .minor(g as u32)
            .pci_bus_id(&format!("00000000:{:02X}:00.0", 0x18 + g * 0x10))
            .memory(total, 512 << 20, (used + (512 << 20)).min(total))
            .utilization(60, 30)
            .power_mw(450_000)
            .energy_mj(1_000_000_000)
            .energy_rate_mw(450_000)
            .clocks(1_980, 1_980, 3_201)
            .temperature_c(55)
            .compute_mode(ComputeMode::Default)
            .mig_mode(false, false)
            .compute_processes(procs)
            .graphics_processes(vec![])
            .mps_processes(vec![])
            .process_utilization(
                (0..processes)
                    .map(|i| UtilizationSample::new(pid(g, i), 1_700_000_000_000_000 + i, 25, 10, 0, 0))
                    .collect(),
            );
        s = s.device(d);
    }
    s
}

fn seen(sample: &tracer_core::nvml::model::NvmlSample) -> (usize, usize, usize, usize) {
    (
        sample.devices.len(),
        sample.devices.iter().map(|d| d.processes.len()).sum(),
        sample.devices.iter().map(|d| d.process_utilization.len()).sum(),
        sample.missing.len() + sample.devices.iter().map(|d| d.missing.len()).sum::<usize>(),
    )
}

fn open(lib: &Path) -> Result<NvmlSource> {
    NvmlSource::open_library(Some(lib)).with_context(|| format!("opening the fake NVML at {}", lib.display()))
}

fn measure(dir: &Path, samples: usize) -> Result<NvmlMeasured> {
    let n = CONTAINERS_PER_GPU;
    let (g, p) = (GPUS as usize, (GPUS * n) as usize);
    let lib = fake_nvml::install(dir, &scenario(0)).context("installing the fake libnvidia-ml.so.1")?;
    // Held for the whole measurement: the library stays loaded (one instance, its scenario parsed
    // once per change) while the per-pass sources below come and go.
    let mut keeper = open(&lib)?;
    let mut rows = Vec::new();

    // Steady passes over a source: per-call overhead with no processes, then with 100 per GPU (the
    // utilization samples were all returned by the first pass, so later passes get NOT_FOUND, as on
    // a node whose processes are idle).
    for (what, procs) in
        [("8 GPUs, no processes (per-call floor)", 0), ("8 GPUs × 100 processes, no new utilization samples", n)]
    {
        fake_nvml::write_scenario(dir, &scenario(procs)).context("writing the scenario")?;
        for _ in 0..20 {
            black_box(keeper.sample());
        }
        let mut t = Timings::default();
        let mut last = None;
        for _ in 0..samples {
            last = Some(t.time(|| keeper.sample()));
        }
        let last = last.context("no samples")?;
        rows.push(SampleRow { what, timings: t, seen: seen(&last), expected: (g, procs as usize * g, 0) });
    }

    // A fresh source per pass: its first pass returns every utilization sample (100 per GPU), as
    // every pass does on a busy node. Opening is not timed.
    let mut t = Timings::default();
    let mut last = None;
    for i in 0..samples / 4 + 20 {
        let mut source = open(&lib)?;
        if i < 20 {
            black_box(source.sample());
            continue;
        }
        last = Some(t.time(|| source.sample()));
    }
    let last = last.context("no samples")?;
    rows.push(SampleRow {
        what: "8 GPUs × 100 processes + 100 new utilization samples per GPU",
        timings: t,
        seen: seen(&last),
        expected: (g, p, p),
    });
    drop(keeper);
    let rss = rss_child(&lib).map_err(|e| format!("{e:#}"));
    Ok(NvmlMeasured { rows, rss })
}

fn rss_child(lib: &Path) -> Result<RssMeasured> {
    let exe = std::env::current_exe().context("locating the bench binary")?;
    let out = Command::new(exe).arg("__rss").arg(lib).output().context("running the __rss child")?;
    if !out.status.success() {
        bail!("__rss child failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
    let at = |key: &str| -> Result<(u64, u64, u64)> {
        match crate::values(&lines, key).first().map(Vec::as_slice) {
            Some([rss, hwm, anon]) => Ok((*rss as u64, *hwm as u64, *anon as u64)),
            _ => bail!("__rss child printed no `{key}` line"),
        }
    };
    Ok(RssMeasured { start: at("start")?, after_nvml: at("nvml")?, after_attributor: at("attributor")? })
}

fn status_now() -> String {
    let f = |k| sys::status_kb(k).unwrap_or(0);
    format!("{} {} {}", f("VmRSS"), f("VmHWM"), f("RssAnon"))
}

/// The `__rss <libnvidia-ml.so.1>` child: RSS at start, after opening NVML and taking one sample of
/// the 8 × 100 node, and after an attributor has been fed that node for its full rightsizing window.
/// Everything stays alive until the last reading.
pub fn rss_main(args: &[String]) -> Result<()> {
    let [lib] = args else { bail!("usage: __rss <path of the fake libnvidia-ml.so.1>") };
    println!("start {}", status_now());
    let mut source = open(Path::new(lib))?;
    let sample = source.sample();
    let (devices, processes, _, _) = seen(&sample);
    if devices as u64 != GPUS || processes as u64 != GPUS * CONTAINERS_PER_GPU {
        bail!("the fake NVML gave {devices} devices and {processes} processes, not {GPUS} × {CONTAINERS_PER_GPU}");
    }
    println!("nvml {}", status_now());
    let settings = crate::attribution::settings();
    let mut a = Attributor::new(&settings);
    let (_, snapshot) = crate::attribution::fill_history(&mut a, &settings);
    println!("attributor {}", status_now());
    black_box((&source, &sample, &a, &snapshot));
    Ok(())
}

pub fn section(dir: &Path, quick: bool) -> NvmlSection {
    crate::progress(&format!(
        "7: NVML sampling against the fake library, {GPUS} GPUs × {CONTAINERS_PER_GPU} processes"
    ));
    NvmlSection { result: measure(dir, if quick { 200 } else { 2_000 }).map_err(|e| format!("{e:#}")) }
}

/// Where the fake library is installed for section 7.
pub fn fake_dir(base: &Path) -> PathBuf {
    base.join("fake-nvml")
}

fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

impl NvmlSection {
    pub fn render(&self, s: &mut String) {
        let _ = writeln!(s, "## 7. NVML sampling and agent memory at 8 GPUs × 100 containers\n");
        let _ = writeln!(
            s,
            "**Method.** `tracer_agent::nvml::sampler::NvmlSource::sample` (one pass over every device: identity, \
             memory, utilization, power, energy, clocks, temperature, compute and MIG mode, the three process lists, \
             process utilization) against the fake `libnvidia-ml.so.1` of tests/fake-nvml with {GPUS} H200s, MIG off, \
             {CONTAINERS_PER_GPU} compute processes each; wall and thread CPU time per pass. **This measures the \
             agent's side only** (nvml-wrapper, the sampler's copies and merges) plus the fake's own per-call cost \
             (a `stat` of its scenario file and a mutex, about a microsecond): a real NVML call is an ioctl into the \
             NVIDIA driver, typically tens of µs each, and a pass makes about 20 per GPU, so on a GPU node a pass \
             likely costs milliseconds, which only a measurement there shows — `cargo xtask gpu-check` is the place. Run \
             alone with `cargo xtask bench --only 7` (or `--only 6,7`).\n"
        );
        let m = match &self.result {
            Err(e) => {
                let _ = writeln!(s, "not measured: {e}\n");
                return;
            }
            Ok(m) => m,
        };
        let _ = writeln!(
            s,
            "| per `sample()` | passes | wall µs median | wall µs p99 | thread CPU µs median | thread CPU µs p99 | \
             devices / processes / utilization samples seen |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---|");
        for r in &m.rows {
            let t = &r.timings;
            let ok = (r.seen.0, r.seen.1, r.seen.2) == r.expected && r.seen.3 == 0;
            let _ = writeln!(
                s,
                "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {} / {} / {}{} |",
                r.what,
                t.wall_us.len(),
                sys::median(&t.wall_us),
                crate::attribution::percentile(&t.wall_us, 99.0),
                sys::median(&t.cpu_us),
                crate::attribution::percentile(&t.cpu_us, 99.0),
                r.seen.0,
                r.seen.1,
                r.seen.2,
                if ok {
                    " ✓".to_string()
                } else {
                    format!(
                        " **expected {} / {} / {}, {} readings missing**",
                        r.expected.0, r.expected.1, r.expected.2, r.seen.3
                    )
                }
            );
        }
        let med = |i: usize| m.rows.get(i).map_or(f64::NAN, |r| sys::median(&r.timings.wall_us));
        let _ = writeln!(
            s,
            "\nThe last row is what a busy node gives every interval (each pass returns the utilization samples taken \
             since the last); it is made with a new source per pass (opening not timed), since the fake returns a \
             sample only once. The first row is the per-call part: about {FLOOR_CALLS} calls, {:.1} µs each \
             (nvml-wrapper and the fake). What 800 processes and their utilization samples add on the agent's side \
             is the last row less the first: {:.0} µs per pass.\n",
            med(0) / FLOOR_CALLS as f64,
            med(2) - med(0)
        );
        let _ = writeln!(
            s,
            "**Agent memory at this node size.** A child process of the bench (no eBPF, no other state) reads \
             `/proc/self/status` at start, after opening NVML and taking one pass of this node, and after an \
             `Attributor` has been fed the 8 × 100 node of section 6 for its full rightsizing window (one interval \
             per history bucket; the history keeps one entry per bucket, so a longer feed holds no more), with the \
             source, the sample, the attributor and its last snapshot all alive:\n"
        );
        match &m.rss {
            Err(e) => {
                let _ = writeln!(s, "not measured: {e}\n");
            }
            Ok(r) => {
                let _ = writeln!(s, "| point | VmRSS MiB | VmHWM MiB | RssAnon MiB |");
                let _ = writeln!(s, "|---|---:|---:|---:|");
                for (name, v) in [
                    ("start (the bench binary, nothing built)", r.start),
                    ("+ NVML source and one 8 × 100 sample", r.after_nvml),
                    ("+ attributor with full history, last snapshot", r.after_attributor),
                ] {
                    let _ = writeln!(s, "| {name} | {:.1} | {:.1} | {:.1} |", mib(v.0), mib(v.1), mib(v.2));
                }
                let grown = r.after_attributor.0.saturating_sub(r.start.0);
                let peak = r.after_attributor.1.saturating_sub(r.start.0);
                let _ = writeln!(
                    s,
                    "\nThis node size adds {:.1} MiB of RSS ({:.1} MiB for NVML: the loaded library and the sample; \
                     {:.1} MiB for attribution), peak {:.1} MiB over the start; the agent's whole RSS on such a node \
                     is about section 4's plus this. The fake library is smaller than the real `libnvidia-ml.so.1`, \
                     whose mapped pages (mostly file-backed, shared with other NVML users) add to RssFile.\n",
                    mib(grown),
                    mib(r.after_nvml.0.saturating_sub(r.start.0)),
                    mib(r.after_attributor.0.saturating_sub(r.after_nvml.0)),
                    mib(peak)
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
