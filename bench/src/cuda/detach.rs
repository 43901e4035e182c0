//! Section 5c: how long attaching and detaching one library's uprobes takes.
//!
//! `Probes::load` with only the cuda family on the library (every entry point it has, placed as in
//! production), then the uprobes detached either one after the other (what dropping the programs
//! does, the baseline) or all at once (`Probes::detach_cuda`, what the agent does), then the rest
//! of the teardown (every program and map fd closed). Rounds alternate the two ways.
use std::{fmt::Write as _, path::Path, time::Instant};

use anyhow::{Result, bail};
use tracer_user::{
    config::{Config, Families},
    decode,
    probe::{FamilyStatus, Probes},
};

use super::LibInfo;
use crate::{progress, sys};

/// One load, detach and teardown.
#[derive(Clone, Debug)]
pub struct DetachRun {
    pub concurrent: bool,
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

fn once(path: &Path, concurrent: bool) -> Result<DetachRun> {
    let cfg = Config {
        families: Families { driver: false, lifecycle: false, cuda: true },
        cuda_libraries: vec![path.to_path_buf()],
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
    let links = if concurrent { probes.detach_cuda() } else { probes.detach_cuda_one_by_one() };
    let detach_ms = t1.elapsed().as_secs_f64() * 1e3;
    if links != expected || links == 0 {
        bail!("detached {links} of {expected} links");
    }
    let t2 = Instant::now();
    drop(probes);
    let teardown_ms = t2.elapsed().as_secs_f64() * 1e3;
    Ok(DetachRun { concurrent, links, load_ms, detach_ms, teardown_ms })
}

/// Measure `rounds` rounds of both ways on each library that exists.
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
            for concurrent in [false, true] {
                match once(&l.path, concurrent) {
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
         every entry point the library has placed and attached as in production (uprobes and return probes, each a \
         perf-event link). Then the cuda links are detached either **one by one** (each dropped after the other, as \
         dropping the programs does: the way the agent stopped before) or **all at once** (`Probes::detach_cuda`: \
         each link dropped on a thread of its own, so the kernel's RCU grace periods, which every uprobe \
         unregistration waits for, overlap; what the agent now does on every stop and when a late libcuda copy is \
         detached); last, the rest of the teardown (every program and map fd closed). {rounds} rounds, alternating \
         the two ways; the cell is the median (min–max) in ms.\n"
    );
    let _ = writeln!(s, "| library | detach | links | load + attach | detach | rest of the teardown | stop in all |");
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|");
    for row in rows {
        match &row.result {
            Err(e) => {
                let _ = writeln!(s, "| {} | not measured: {} | | | | | |", row.lib, e.replace('\n', " "));
            }
            Ok(runs) => {
                for concurrent in [false, true] {
                    let r: Vec<&DetachRun> = runs.iter().filter(|r| r.concurrent == concurrent).collect();
                    if r.is_empty() {
                        continue;
                    }
                    let cell = |f: fn(&DetachRun) -> f64| {
                        let v: Vec<f64> = r.iter().map(|x| f(x)).collect();
                        format!("{:.0} ({:.0}–{:.0})", sys::median(&v), sys::min(&v), sys::max(&v))
                    };
                    let way = if concurrent { "**all at once** (the agent)" } else { "one by one (before)" };
                    let _ = writeln!(
                        s,
                        "| {} | {way} | {} | {} | {} | {} | {} |",
                        row.lib,
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
