//! Section 12: `gpu-tracer profile`'s outputs, offline on one core: a synthetic recording of a
//! busy workload (launches on several threads and streams, allocations, synchronisations) written
//! as a Perfetto trace, summarised, and rendered as the HTML report; beside it, in the same run,
//! the same launches as the `events` stream writes them (length-delimited `gputracer.v1.Event`),
//! the format the trace replaces for a deep dive.
use std::{
    fmt::Write as _,
    io::{self, Write},
    time::Instant,
};

use gpu_tracer_proto::{prost::Message, v1};
use tracer_client::profile::{html, perfetto, summary};
use tracer_core::profile::{Call, Launch, MemoryCall, MemoryKind, Process, Recording, Target};

/// Launches in the synthetic recording (a tenth with --quick).
const LAUNCHES: u64 = 1_000_000;
const THREADS: u32 = 4;
const STREAMS: u64 = 2;
const KERNELS: usize = 40;
/// A synchronisation every this many launches per thread; an allocation and a free every this many.
const SYNC_EVERY: u64 = 100;
const ALLOC_EVERY: u64 = 50;

pub struct Measured {
    launches: u64,
    calls: usize,
    memory: usize,
    trace_bytes: u64,
    trace_s: f64,
    events_bytes: u64,
    events_s: f64,
    summary_s: f64,
    html_bytes: usize,
    html_s: f64,
}

pub struct ProfileSection {
    pub result: Result<Measured, String>,
}

impl ProfileSection {
    pub fn skipped(why: &str) -> Self {
        Self { result: Err(why.into()) }
    }
}

/// A sink that counts what is written to it.
struct Count(u64);

impl Write for Count {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0 += b.len() as u64;
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A workload's recording: `n` launches 2 µs apart, round robin over threads, streams and kernels.
fn recording(n: u64) -> Recording {
    let t0 = 1_000_000_000u64;
    let mut rec = Recording { start_ktime_ns: t0, ..Default::default() };
    let tgid = 4242;
    let mut p = Process { comm: "python3".into(), pod: "ml/train-0/trainer".into(), ..Default::default() };
    for t in 0..THREADS {
        p.threads.insert(tgid + t, t0);
    }
    rec.processes.insert(tgid, p);
    let names: Vec<String> = (0..KERNELS).map(|k| format!("void at::native::kernel_{k}<float, 128>(Params)")).collect();
    for i in 0..n {
        let ts = t0 + i * 2_000;
        let tid = tgid + (i % THREADS as u64) as u32;
        let stream = 0x5000 + (i % STREAMS);
        rec.launches.push(Launch {
            ktime_ns: ts,
            tgid,
            tid,
            entry_point: "cuLaunchKernel".into(),
            name: names[(i as usize * 7) % KERNELS].clone(),
            named: true,
            function: 0xf000 + (i % KERNELS as u64),
            stream,
            grid: [128, 2, 1],
            block: [256, 1, 1],
            shared_mem_bytes: 4096,
        });
        if i % SYNC_EVERY == SYNC_EVERY - 1 {
            rec.calls.push(Call {
                start_ktime_ns: ts + 100,
                end_ktime_ns: ts + 1_500,
                tgid,
                tid,
                entry_point: "cuStreamSynchronize".into(),
                class: "synchronize".into(),
                stream: Some(stream),
                event: None,
                bytes: 0,
                direction: String::new(),
                is_async: false,
                result: 0,
            });
        }
        if i % ALLOC_EVERY == 0 {
            let ptr = 0x7000_0000_0000 + i * 0x20_0000;
            for (kind, at) in [(MemoryKind::CudaAlloc, ts + 500), (MemoryKind::CudaFree, ts + 1_900)] {
                rec.memory.push(MemoryCall {
                    // An allocation is a 100 ns call (inside the synchronisation when both fall on one thread).
                    start_ktime_ns: if kind == MemoryKind::CudaAlloc { at - 100 } else { at },
                    ktime_ns: at,
                    tgid,
                    tid,
                    entry_point: if kind == MemoryKind::CudaAlloc { "cuMemAlloc_v2" } else { "cuMemFree_v2" }.into(),
                    kind,
                    ptr,
                    bytes: 2 << 20,
                    success: true,
                });
            }
        }
    }
    rec.end_ktime_ns = t0 + n * 2_000;
    rec.events_seen = n + rec.calls.len() as u64 + rec.memory.len() as u64;
    rec.ended_by = "duration".into();
    rec
}

/// The launches as `gpu-tracer events` writes them (what a deep dive recorded before `profile`).
fn events_bytes(rec: &Recording) -> u64 {
    let mut out = Count(0);
    let mut buf = Vec::with_capacity(256);
    for l in &rec.launches {
        let ev = v1::Event {
            header: Some(v1::Header {
                kind: v1::EventKind::CudaLaunch as i32,
                ktime_ns: l.ktime_ns,
                tgid: l.tgid,
                pid: l.tid,
                comm: "python3".into(),
                cgroup_id: 77,
                ..Default::default()
            }),
            payload: Some(v1::event::Payload::CudaLaunch(v1::CudaLaunch {
                entry_point: l.entry_point.clone(),
                function: l.function,
                kernel_name: l.name.clone(),
                stream: l.stream,
                grid: l.grid.to_vec(),
                block: l.block.to_vec(),
                shared_mem_bytes: l.shared_mem_bytes,
            })),
            ..Default::default()
        };
        buf.clear();
        ev.encode_length_delimited(&mut buf).expect("a Vec grows");
        out.write_all(&buf).expect("counting");
    }
    out.0
}

pub fn section(quick: bool) -> ProfileSection {
    let n = if quick { LAUNCHES / 10 } else { LAUNCHES };
    let rec = recording(n);
    let t = Instant::now();
    let stats = match perfetto::write(&rec, 10_000_000, u64::MAX, Count(0)) {
        Ok(s) => s,
        Err(e) => return ProfileSection { result: Err(format!("writing the trace: {e}")) },
    };
    let trace_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let events = events_bytes(&rec);
    let events_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let s = summary::summarize(&rec, &Target::Pid(4242), 10_000_000, stats.clone());
    let summary_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let page = html::render(&rec, &s);
    let html_s = t.elapsed().as_secs_f64();
    ProfileSection {
        result: Ok(Measured {
            launches: n,
            calls: rec.calls.len(),
            memory: rec.memory.len(),
            trace_bytes: stats.bytes,
            trace_s,
            events_bytes: events,
            events_s,
            summary_s,
            html_bytes: page.len(),
            html_s,
        }),
    }
}

impl ProfileSection {
    pub fn render(&self, s: &mut String) {
        let _ = writeln!(s, "## 12. Profile outputs: trace, summary, HTML report\n");
        let _ = writeln!(
            s,
            "**Method.** Offline, one core: a synthetic recording of one process — {LAUNCHES} launches 2 µs apart, \
             round robin over {THREADS} threads, {STREAMS} streams and {KERNELS} kernel names of PyTorch-like length, \
             a `cuStreamSynchronize` every {SYNC_EVERY} launches, a 2 MiB `cuMemAlloc_v2` and its free every \
             {ALLOC_EVERY} — written by `profile::perfetto::write` to a byte-counting sink (the same code \
             `gpu-tracer profile` runs after its window), then summarised (`profile::summary::summarize`) and \
             rendered as the HTML report (`profile::html::render`). Baseline in the same run: the same launches \
             encoded as `gpu-tracer events` writes them (length-delimited `gputracer.v1.Event`, kernel name in each). \
             Run alone with `cargo xtask bench --only 12`.\n"
        );
        match &self.result {
            Err(e) => {
                let _ = writeln!(s, "Not measured: {e}\n");
            }
            Ok(m) => {
                let per = |b: u64| b as f64 / m.launches as f64;
                let _ = writeln!(s, "| output | bytes | bytes per launch | time | launches per second |");
                let _ = writeln!(s, "|---|---:|---:|---:|---:|");
                let _ = writeln!(
                    s,
                    "| Perfetto trace ({} launches, {} synchronisations, {} allocations and frees) | {} | {:.1} | {:.3} s | {:.2} M |",
                    m.launches,
                    m.calls,
                    m.memory,
                    m.trace_bytes,
                    per(m.trace_bytes),
                    m.trace_s,
                    m.launches as f64 / m.trace_s / 1e6
                );
                let _ = writeln!(
                    s,
                    "| baseline: the launches as `events` protobuf | {} | {:.1} | {:.3} s | {:.2} M |",
                    m.events_bytes,
                    per(m.events_bytes),
                    m.events_s,
                    m.launches as f64 / m.events_s / 1e6
                );
                let _ = writeln!(
                    s,
                    "| summary | — | — | {:.3} s | {:.2} M |",
                    m.summary_s,
                    m.launches as f64 / m.summary_s / 1e6
                );
                let _ = writeln!(
                    s,
                    "| HTML report | {} | — | {:.3} s | {:.2} M |\n",
                    m.html_bytes,
                    m.html_s,
                    m.launches as f64 / m.html_s / 1e6
                );
                let _ = writeln!(
                    s,
                    "The trace takes {:.2}× the bytes of the `events` stream per launch (two instants per launch — on its \
                     thread and on its stream — with interned names, against one message each carrying the name), \
                     written at {:.2}× its rate.\n",
                    m.trace_bytes as f64 / m.events_bytes as f64,
                    (m.launches as f64 / m.trace_s) / (m.launches as f64 / m.events_s)
                );
            }
        }
    }
}
