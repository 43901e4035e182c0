//! Section 5c: how long attaching and detaching one library's uprobes takes.
//!
//! `Probes::load` with only the cuda family on the library (every entry point it has, placed as in
//! production), then the uprobes detached, then the rest of the teardown (every program and map fd
//! closed). Three ways, alternating in each round: perf-event links one after the other (what
//! dropping the programs does: the first baseline), perf-event links all at once
//! (`Probes::detach_cuda`, the fallback on kernels before 6.6), and multi-uprobe links (one per
//! program, what the agent uses where the kernel has them), also all at once.
use std::{fmt::Write as _, path::Path, time::Instant};

use anyhow::{Result, bail};
use tracer_agent::probe::Probes;
use tracer_core::{
    config::{Config, CudaAttach, Families},
    decode,
    model::probes::FamilyStatus,
};

use super::LibInfo;
use crate::{progress, sys};

/// How the links are attached and detached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    PerfOneByOne,
    PerfAllAtOnce,
    Multi,
}

impl Way {
    const ALL: [Way; 3] = [Way::PerfOneByOne, Way::PerfAllAtOnce, Way::Multi];

    fn label(self) -> &'static str {
        match self {
            Way::PerfOneByOne => "perf events, one by one (before)",
            Way::PerfAllAtOnce => "perf events, all at once (the fallback)",
            Way::Multi => "**multi-uprobe links**, all at once (the agent)",
        }
    }
}

/// One load, detach and teardown.
#[derive(Clone, Debug)]
pub struct DetachRun {
    pub way: Way,
    pub links: usize,
    pub load_ms: f64,
    pub detach_ms: f64,
    pub teardown_ms: f64,
}

/// The runs of one library.
pub struct DetachRow {
    pub lib: String,
    pub result: Result<Vec<DetachRun>, String>,
}

fn once(path: &Path, way: Way) -> Result<DetachRun> {
    let cfg = Config {
        families: Families { driver: false, lifecycle: false, cuda: true },
        cuda_libraries: vec![path.to_path_buf()],
        cuda_attach: if way == Way::Multi { CudaAttach::UprobeMulti } else { CudaAttach::PerfEvent },
        ..Config::default()
    };
    let abi = tracer_common::nv::DriverAbi::for_version(tracer_common::nv::DEFAULT_DRIVER_VERSION);
    let t0 = Instant::now();
    let mut probes =
        Probes::load(&cfg, &abi, &decode::plan::capture_plans(&abi), &decode::plan::alloc_param_sizes(&abi))?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    if !matches!(probes.report.cuda, FamilyStatus::Attached { .. }) {
        bail!("cuda family not attached: {:?}", probes.report.cuda);
    }
    let expected = probes.cuda_link_count();
    let t1 = Instant::now();
    let links = if way == Way::PerfOneByOne { probes.detach_cuda_one_by_one() } else { probes.detach_cuda() };
    let detach_ms = t1.elapsed().as_secs_f64() * 1e3;
    if links != expected || links == 0 {
        bail!("detached {links} of {expected} links");
    }
    let t2 = Instant::now();
    drop(probes);
    let teardown_ms = t2.elapsed().as_secs_f64() * 1e3;
    Ok(DetachRun { way, links, load_ms, detach_ms, teardown_ms })
}

/// Measure `rounds` rounds of every way on each library that exists.
pub fn measure(libs: &[LibInfo], rounds: u32) -> Vec<DetachRow> {
    let mut rows = Vec::new();
    for l in libs.iter().filter(|l| l.short == "real") {
        let mut runs = Vec::new();
        let mut error = None;
        if !l.path.is_file() {
            error = Some(format!("{} is missing", l.path.display()));
        }
        for round in 0..rounds {
            if error.is_some() {
                break;
            }
            progress(&format!("5c: {} round {}/{rounds}", l.short, round + 1));
            for way in Way::ALL {
                match once(&l.path, way) {
                    Ok(r) => runs.push(r),
                    Err(e) => error = Some(format!("{e:#}")),
                }
            }
        }
        rows.push(DetachRow {
            lib: l.label.clone(),
            result: match error {
                Some(e) => Err(e),
                None => Ok(runs),
            },
        });
    }
    rows
}

/// The 5c block of the report.
pub fn render(s: &mut String, rows: &[DetachRow], rounds: u32) {
    let _ = writeln!(s, "### 5c. Attaching and detaching one library's uprobes\n");
    let _ = writeln!(
        s,
        "**Method.** `Probes::load` with only the cuda family and `cuda_libraries` = the library: the object loaded, \
         every entry point the library has placed and attached as in production (uprobes and return probes). Three \
         ways: **perf events, one by one** (`cuda_attach = \"perf-event\"`: one perf-event link per probe, each \
         dropped after the other, as dropping the programs does: how the agent stopped before); **perf events, all \
         at once** (`Probes::detach_cuda`: each link dropped on a thread of its own, so the kernel's RCU grace \
         periods, which every uprobe unregistration waits for, overlap: the fallback on kernels before 6.6); \
         **multi-uprobe links** (`cuda_attach = \"uprobe-multi\"`, what `auto` picks on 6.6+: one \
         `BPF_TRACE_UPROBE_MULTI` link per program carrying all its offsets, which the kernel unregisters under \
         one grace period; dropped all at once). Load + attach includes loading the programs (for multi links a \
         second copy of the cuda programs, `cuda::attach::multi`). Last, the rest of the teardown (every program \
         and map fd closed). {rounds} rounds, alternating the three ways; the cell is the median (min–max) in ms.\n"
    );
    let _ = writeln!(s, "| library | detach | links | load + attach | detach | rest of the teardown | stop in all |");
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|");
    for row in rows {
        match &row.result {
            Err(e) => {
                let _ = writeln!(s, "| {} | not measured: {} | | | | | |", row.lib, e.replace('\n', " "));
            }
            Ok(runs) => {
                for way in Way::ALL {
                    let r: Vec<&DetachRun> = runs.iter().filter(|r| r.way == way).collect();
                    if r.is_empty() {
                        continue;
                    }
                    let cell = |f: fn(&DetachRun) -> f64| {
                        let v: Vec<f64> = r.iter().map(|x| f(x)).collect();
                        format!("{:.0} ({:.0}–{:.0})", sys::median(&v), sys::min(&v), sys::max(&v))
                    };
                    let _ = writeln!(
                        s,
                        "| {} | {} | {} | {} | {} | {} | {} |",
                        row.lib,
                        way.label(),
                        r[0].links,
                        cell(|x| x.load_ms),
                        cell(|x| x.detach_ms),
                        cell(|x| x.teardown_ms),
                        cell(|x| x.detach_ms + x.teardown_ms),
                    );
                }
            }
        }
    }
    s.push('\n');
}
