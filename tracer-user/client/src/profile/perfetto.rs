//! A [`Recording`] as a Perfetto trace (the native protobuf format, `perfetto.protos.Trace`), for
//! ui.perfetto.dev: one process track per process (named after its pod when known) with a thread
//! track per thread, a track per CUDA stream, counter tracks for the memory each ledger saw
//! allocated in the window, a "GPU submission" track with the idle gaps, and flows from each
//! allocation to its free.
//!
//! Packets are written as they are made (`Trace.packet` framing, field 1), so a trace is never
//! held whole in memory; every track descriptor comes before the first event on it; event names
//! are interned on one packet sequence.
use std::{
    collections::{BTreeMap, HashMap},
    io::{self, Write},
};

use gpu_tracer_proto::perfetto::{
    CounterDescriptor, DebugAnnotation, DebugAnnotationName, EventName, InternedData, InternedString,
    ProcessDescriptor, ThreadDescriptor, TracePacket, TrackDescriptor, TrackEvent, counter_descriptor::Unit,
    debug_annotation, trace_packet, track_descriptor, track_event,
};
use prost::Message;

use super::intervals::{bounded_intervals, idle_gaps};
use tracer_core::profile::{HeldAtStart, MemoryCall, MemoryKind, Recording};

/// The one packet sequence every packet is written on.
const SEQUENCE: u32 = 1;

/// A track of the trace, before it has a uuid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Track {
    Process(u32),
    Thread(u32, u32),
    Stream(u32, u64),
    CudaMemory(u32),
    DriverMemory(u32),
    Submission(u32),
    /// One NVML reading of one GPU (by NVML index).
    Gpu(u32, GpuCounter),
}

/// The NVML counters drawn per GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum GpuCounter {
    Utilization,
    WorkloadSm,
    Power,
    MemoryUsed,
    WorkloadMemory,
    SmClock,
}

impl GpuCounter {
    const ALL: [GpuCounter; 6] = [
        GpuCounter::Utilization,
        GpuCounter::WorkloadSm,
        GpuCounter::Power,
        GpuCounter::MemoryUsed,
        GpuCounter::WorkloadMemory,
        GpuCounter::SmClock,
    ];

    /// The track's name after `GPU n: ` and its unit.
    fn describe(self) -> (&'static str, CounterDescriptor) {
        let bytes = CounterDescriptor { unit: Some(Unit::SizeBytes as i32), unit_name: None };
        let named = |u: &str| CounterDescriptor { unit: None, unit_name: Some(u.to_string()) };
        match self {
            GpuCounter::Utilization => ("utilization % (NVML, whole GPU)", named("%")),
            GpuCounter::WorkloadSm => ("SM % of this workload (NVML per process)", named("%")),
            GpuCounter::Power => ("power W (NVML)", named("W")),
            GpuCounter::MemoryUsed => ("memory used (NVML, whole GPU)", bytes),
            GpuCounter::WorkloadMemory => ("memory of this workload (NVML per process)", bytes),
            GpuCounter::SmClock => ("SM clock MHz (NVML)", named("MHz")),
        }
    }

    /// This counter's value in sample `g`, if NVML gave it.
    fn value(self, rec: &Recording, g: &gpu_tracer_proto::v1::GpuSample) -> Option<f64> {
        match self {
            GpuCounter::Utilization => g.gpu_pct.map(f64::from),
            GpuCounter::WorkloadSm => tracer_core::profile::gpus::workload_share(rec, g).0.map(f64::from),
            GpuCounter::Power => g.power_mw.map(|p| f64::from(p) / 1e3),
            GpuCounter::MemoryUsed => g.memory_used_bytes.map(|b| b as f64),
            GpuCounter::WorkloadMemory => tracer_core::profile::gpus::workload_share(rec, g).1.map(|b| b as f64),
            GpuCounter::SmClock => g.sm_clock_mhz.map(f64::from),
        }
    }
}

/// What a written trace holds, for the summary and the progress line.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TraceStats {
    pub packets: u64,
    pub bytes: u64,
    pub tracks: u64,
    pub slices: u64,
    pub instants: u64,
    pub counter_values: u64,
    pub flows: u64,
    /// Packets left out because the trace reached its size limit.
    pub packets_over_limit: u64,
}

/// Writes packets with `Trace.packet` framing, interning event names on [`SEQUENCE`].
struct Writer<W: Write> {
    out: W,
    /// Interned on the sequence, each kind with its own iids: event names, annotation names,
    /// annotation string values.
    names: foldhash::HashMap<String, u64>,
    strings: foldhash::HashMap<String, u64>,
    /// `XxYxZ` strings of launch shapes, by shape (formatted once).
    shapes: foldhash::HashMap<[u32; 3], u64>,
    /// Interned since the last packet: sent with the next one (the one that uses it).
    pending: InternedData,
    first: bool,
    max_bytes: u64,
    /// No track event written yet (the annotation names go with the first).
    first_event: bool,
    /// The size limit was reached: from then on only the ends of open slices are written.
    full: bool,
    /// Tracks with slices begun and not yet ended, and how many (slices nest: a driver call inside
    /// the allocation that made it).
    open: HashMap<u64, u32>,
    stats: TraceStats,
}

impl<W: Write> Writer<W> {
    /// Write `p` unless the size limit was reached (`always`: the end of an open slice, written
    /// past the limit so that every slice in the file is closed). Says whether it was written.
    fn packet(&mut self, mut p: TracePacket, always: bool) -> io::Result<bool> {
        p.optional_trusted_packet_sequence_id =
            Some(trace_packet::OptionalTrustedPacketSequenceId::TrustedPacketSequenceId(SEQUENCE));
        if self.first {
            p.first_packet_on_sequence = Some(true);
            p.sequence_flags = Some(trace_packet::SequenceFlags::SeqIncrementalStateCleared as u32);
            self.first = false;
        } else if matches!(p.data, Some(trace_packet::Data::TrackEvent(_))) {
            p.sequence_flags = Some(trace_packet::SequenceFlags::SeqNeedsIncrementalState as u32);
        }
        let len = p.encoded_len();
        let framed = 1 + prost::length_delimiter_len(len) + len;
        if !always && (self.full || self.stats.bytes + framed as u64 > self.max_bytes) {
            self.full = true;
            self.stats.packets_over_limit += 1;
            return Ok(false);
        }
        let mut buf = Vec::with_capacity(framed);
        buf.push(0x0a); // Trace.packet: field 1, length-delimited
        p.encode_length_delimited(&mut buf).expect("a Vec grows");
        self.out.write_all(&buf)?;
        self.stats.bytes += buf.len() as u64;
        self.stats.packets += 1;
        Ok(true)
    }

    /// The iid of annotation string `v`, interned with the next packet when new.
    fn string(&mut self, v: &str) -> u64 {
        if let Some(&iid) = self.strings.get(v) {
            return iid;
        }
        let iid = self.strings.len() as u64 + 1;
        self.strings.insert(v.to_string(), iid);
        self.pending
            .debug_annotation_string_values
            .push(InternedString { iid: Some(iid), str: Some(v.as_bytes().to_vec()) });
        iid
    }

    /// The iid of a launch shape's `XxYxZ` string.
    fn shape(&mut self, d: [u32; 3]) -> u64 {
        if let Some(&iid) = self.shapes.get(&d) {
            return iid;
        }
        let iid = self.string(&format!("{}x{}x{}", d[0], d[1], d[2]));
        self.shapes.insert(d, iid);
        iid
    }

    /// The iid of event name `n`, interned with the next packet when new.
    fn name(&mut self, n: &str) -> u64 {
        if let Some(&iid) = self.names.get(n) {
            return iid;
        }
        let iid = self.names.len() as u64 + 1;
        self.names.insert(n.to_string(), iid);
        self.pending.event_names.push(EventName { iid: Some(iid), name: Some(n.to_string()) });
        iid
    }

    fn descriptor(&mut self, d: TrackDescriptor) -> io::Result<()> {
        self.stats.tracks += 1;
        self.packet(TracePacket { data: Some(trace_packet::Data::TrackDescriptor(d)), ..Default::default() }, false)
            .map(|_| ())
    }

    fn event(&mut self, ts: u64, name: Option<&str>, mut e: TrackEvent) -> io::Result<()> {
        let track = e.track_uuid.unwrap_or(0);
        let kind = e.r#type.unwrap_or(0);
        let end = kind == track_event::Type::SliceEnd as i32;
        if end && !self.open.contains_key(&track) {
            return Ok(()); // its begin was left out at the size limit
        }
        if let Some(n) = name {
            e.name_field = Some(track_event::NameField::NameIid(self.name(n)));
        }
        if self.first_event {
            self.first_event = false;
            self.pending.debug_annotation_names = ANNOTATIONS
                .iter()
                .enumerate()
                .map(|(i, a)| DebugAnnotationName { iid: Some(i as u64 + 1), name: Some(a.to_string()) })
                .collect();
        }
        let p = std::mem::take(&mut self.pending);
        let empty = p.event_names.is_empty()
            && p.debug_annotation_names.is_empty()
            && p.debug_annotation_string_values.is_empty();
        let interned = (!empty).then_some(p);
        let flows = e.flow_ids.len() as u64;
        let p = TracePacket {
            timestamp: Some(ts),
            interned_data: interned,
            data: Some(trace_packet::Data::TrackEvent(e)),
            ..Default::default()
        };
        // Past the size limit nothing with a name or annotations is written again, so what was
        // interned with a packet that was left out is never referred to.
        if !self.packet(p, end)? {
            return Ok(());
        }
        if kind == track_event::Type::SliceBegin as i32 {
            *self.open.entry(track).or_default() += 1;
            self.stats.slices += 1;
        } else if end {
            if let Some(n) = self.open.get_mut(&track) {
                *n -= 1;
                if *n == 0 {
                    self.open.remove(&track);
                }
            }
        } else if kind == track_event::Type::Instant as i32 {
            self.stats.instants += 1;
        } else if kind == track_event::Type::Counter as i32 {
            self.stats.counter_values += 1;
        }
        self.stats.flows += flows;
        Ok(())
    }
}

/// Every annotation name the trace uses, interned once with the first event (iid = index + 1), so
/// an annotation costs a varint, not its name, and building one allocates nothing.
const ANNOTATIONS: [&str; 19] = [
    "entry_point",
    "grid",
    "block",
    "shared_mem_bytes",
    "stream",
    "function",
    "thread",
    "bytes",
    "bytes_released",
    "ptr",
    "handle",
    "success",
    "result",
    "event",
    "async",
    "direction",
    "kernels",
    "bounded_by",
    "meaning",
];

fn ann(name: &str, value: debug_annotation::Value) -> DebugAnnotation {
    let i = ANNOTATIONS.iter().position(|a| *a == name).expect("every annotation name is in ANNOTATIONS");
    DebugAnnotation { name_field: Some(debug_annotation::NameField::NameIid(i as u64 + 1)), value: Some(value) }
}

fn uint(name: &str, v: u64) -> DebugAnnotation {
    ann(name, debug_annotation::Value::UintValue(v))
}

/// A string annotation whose value is interned (`iid` from [`Writer::string`]).
fn text(name: &str, iid: u64) -> DebugAnnotation {
    ann(name, debug_annotation::Value::StringValueIid(iid))
}

fn ptr(name: &str, v: u64) -> DebugAnnotation {
    ann(name, debug_annotation::Value::PointerValue(v))
}

fn on(track: u64, t: track_event::Type) -> TrackEvent {
    TrackEvent { track_uuid: Some(track), r#type: Some(t as i32), ..Default::default() }
}

/// One thing to draw, ordered by time (then by kind, so that a slice's end sorts before a slice
/// that begins at the same instant).
enum Item<'a> {
    Launch(&'a tracer_core::profile::Launch),
    /// A memory call: an instant when it has no duration (a free seen at entry), else a slice
    /// from its entry (`end: false`) to its return (`end: true`, where the counter moves).
    Memory {
        i: usize,
        end: Option<bool>,
    },
    Gap {
        tgid: u32,
        end: bool,
    },
    Call {
        call: &'a tracer_core::profile::Call,
        end: bool,
    },
    Bounded {
        b: &'a super::intervals::Bounded,
        end: bool,
    },
    Gpu(&'a gpu_tracer_proto::v1::GpuSample),
}

/// Write `rec` as a Perfetto trace to `out`, at most `max_bytes` long. `idle_gap_ns` is the
/// shortest gap between submissions drawn as idle.
pub fn write<W: Write>(rec: &Recording, idle_gap_ns: u64, max_bytes: u64, out: W) -> io::Result<TraceStats> {
    let mut w = Writer {
        out,
        names: Default::default(),
        strings: Default::default(),
        shapes: Default::default(),
        pending: InternedData::default(),
        first_event: true,
        first: true,
        max_bytes,
        full: false,
        open: Default::default(),
        stats: TraceStats::default(),
    };
    // Every track, in a fixed order, each with the uuid it is declared with.
    let mut tracks: BTreeMap<Track, u64> = BTreeMap::new();
    for (&tgid, p) in &rec.processes {
        tracks.insert(Track::Process(tgid), 0);
        for &tid in p.threads.keys() {
            tracks.insert(Track::Thread(tgid, tid), 0);
        }
        tracks.insert(Track::Submission(tgid), 0);
    }
    for l in &rec.launches {
        tracks.insert(Track::Stream(l.tgid, l.stream), 0);
    }
    for m in &rec.memory {
        let t = match m.kind {
            MemoryKind::CudaAlloc | MemoryKind::CudaFree => Track::CudaMemory(m.tgid),
            MemoryKind::DriverAlloc | MemoryKind::DriverFree => Track::DriverMemory(m.tgid),
        };
        tracks.insert(t, 0);
    }
    // A process of the workload that held memory when the window began has its counters even
    // if the window moved none of it.
    for (&tgid, h) in rec.held_at_start.iter().flatten() {
        if rec.processes.contains_key(&tgid) {
            if h.cuda_bytes > 0 {
                tracks.insert(Track::CudaMemory(tgid), 0);
            }
            if h.driver_bytes > 0 {
                tracks.insert(Track::DriverMemory(tgid), 0);
            }
        }
    }
    // NVML's counters of the GPUs shown, only those with at least one value.
    let gpu_samples = tracer_core::profile::gpus::shown(rec);
    for g in &gpu_samples {
        for c in GpuCounter::ALL {
            if c.value(rec, g).is_some() {
                tracks.insert(Track::Gpu(g.index, c), 0);
            }
        }
    }
    let gpu_names: BTreeMap<u32, String> = gpu_samples.iter().map(|g| (g.index, g.name.clone())).collect();
    for (i, uuid) in tracks.values_mut().enumerate() {
        *uuid = i as u64 + 1;
    }
    for (track, &uuid) in &tracks {
        let parent = |tgid: u32| tracks.get(&Track::Process(tgid)).copied();
        let d = match *track {
            Track::Process(tgid) => {
                let p = &rec.processes[&tgid];
                TrackDescriptor {
                    uuid: Some(uuid),
                    process: Some(ProcessDescriptor {
                        pid: Some(tgid as i32),
                        cmdline: Vec::new(),
                        process_name: Some(p.display_name(tgid)),
                        process_labels: [&p.pod, &p.cgroup_path]
                            .into_iter()
                            .filter(|s| !s.is_empty())
                            .cloned()
                            .collect(),
                    }),
                    ..Default::default()
                }
            }
            Track::Thread(tgid, tid) => TrackDescriptor {
                uuid: Some(uuid),
                parent_uuid: parent(tgid),
                thread: Some(ThreadDescriptor {
                    pid: Some(tgid as i32),
                    tid: Some(tid.into()),
                    thread_name: Some(format!("thread {tid}")),
                }),
                ..Default::default()
            },
            Track::Stream(tgid, stream) => named(uuid, parent(tgid), stream_name(stream), None),
            Track::CudaMemory(tgid) => named(
                uuid,
                parent(tgid),
                if rec.held_at_start.is_some() { "CUDA memory held" } else { "CUDA memory allocated in window" }.into(),
                Some(CounterDescriptor { unit: Some(Unit::SizeBytes as i32), unit_name: None }),
            ),
            Track::DriverMemory(tgid) => named(
                uuid,
                parent(tgid),
                if rec.held_at_start.is_some() { "driver memory held" } else { "driver memory allocated in window" }
                    .into(),
                Some(CounterDescriptor { unit: Some(Unit::SizeBytes as i32), unit_name: None }),
            ),
            Track::Submission(tgid) => named(uuid, parent(tgid), "GPU submission".into(), None),
            Track::Gpu(index, c) => {
                let (what, unit) = c.describe();
                let name = match gpu_names.get(&index).filter(|n| !n.is_empty()) {
                    Some(n) => format!("GPU {index} ({n}): {what}"),
                    None => format!("GPU {index}: {what}"),
                };
                named(uuid, None, name, Some(unit))
            }
        };
        w.descriptor(d)?;
    }

    // Everything to draw, in time order.
    let gaps = idle_gaps(rec, idle_gap_ns);
    let mut items: Vec<(u64, u8, Item<'_>)> = Vec::new();
    for l in &rec.launches {
        items.push((l.ktime_ns, 1, Item::Launch(l)));
    }
    for (i, m) in rec.memory.iter().enumerate() {
        if m.start_ktime_ns < m.ktime_ns {
            items.push((m.start_ktime_ns, 1, Item::Memory { i, end: Some(false) }));
            items.push((m.ktime_ns, 0, Item::Memory { i, end: Some(true) }));
        } else {
            items.push((m.ktime_ns, 1, Item::Memory { i, end: None }));
        }
    }
    for g in &gaps {
        items.push((g.start_ktime_ns, 1, Item::Gap { tgid: g.tgid, end: false }));
        items.push((g.end_ktime_ns, 0, Item::Gap { tgid: g.tgid, end: true }));
    }
    for c in &rec.calls {
        items.push((c.start_ktime_ns, 1, Item::Call { call: c, end: false }));
        // A call that returned in the nanosecond it began ends after its begin, not before.
        let order = if c.end_ktime_ns <= c.start_ktime_ns { 2 } else { 0 };
        items.push((c.end_ktime_ns.max(c.start_ktime_ns), order, Item::Call { call: c, end: true }));
    }
    let (bounded, _) = bounded_intervals(rec);
    for b in &bounded {
        items.push((b.start_ktime_ns, 1, Item::Bounded { b, end: false }));
        items.push((b.end_ktime_ns, 0, Item::Bounded { b, end: true }));
    }
    for g in &gpu_samples {
        items.push((g.ktime_ns, 1, Item::Gpu(g)));
    }
    items.sort_by_key(|(ts, order, _)| (*ts, *order));

    // Counters start at what each process held when the window began, where the agent's ledgers
    // said (`profile --connect`), else at 0 (the window's allocations alone).
    let mut level: HashMap<Track, i64> = HashMap::new();
    for (track, &uuid) in &tracks {
        let held = |tgid: u32, f: fn(&HeldAtStart) -> u64| {
            rec.held_at_start.as_ref().and_then(|h| h.get(&tgid)).map_or(0, |h| f(h) as i64)
        };
        let start = match *track {
            Track::CudaMemory(tgid) => held(tgid, |h| h.cuda_bytes),
            Track::DriverMemory(tgid) => held(tgid, |h| h.driver_bytes),
            _ => continue,
        };
        level.insert(*track, start);
        let mut e = on(uuid, track_event::Type::Counter);
        e.counter_value_field = Some(track_event::CounterValueField::CounterValue(start));
        w.event(rec.start_ktime_ns, None, e)?;
    }
    // Live CUDA allocations in the window: pointer → flow id.
    let mut flows: HashMap<(u32, u64), u64> = HashMap::new();
    let mut next_flow = 1u64;
    for (ts, _, item) in items {
        match item {
            Item::Gpu(g) => {
                for c in GpuCounter::ALL {
                    if let (Some(v), Some(&track)) = (c.value(rec, g), tracks.get(&Track::Gpu(g.index, c))) {
                        let mut e = on(track, track_event::Type::Counter);
                        e.counter_value_field = Some(track_event::CounterValueField::DoubleCounterValue(v));
                        w.event(ts, None, e)?;
                    }
                }
            }
            Item::Launch(l) => {
                let annotations = vec![
                    text("entry_point", w.string(&l.entry_point)),
                    text("grid", w.shape(l.grid)),
                    text("block", w.shape(l.block)),
                    uint("shared_mem_bytes", l.shared_mem_bytes.into()),
                    ptr("stream", l.stream),
                    ptr("function", l.function),
                ];
                let mut e = on(tracks[&Track::Thread(l.tgid, l.tid)], track_event::Type::Instant);
                e.categories = vec!["launch".into()];
                e.debug_annotations = annotations;
                w.event(ts, Some(&l.name), e)?;
                let mut s = on(tracks[&Track::Stream(l.tgid, l.stream)], track_event::Type::Instant);
                s.categories = vec!["launch".into()];
                s.debug_annotations = vec![uint("thread", l.tid.into())];
                w.event(ts, Some(&l.name), s)?;
            }
            Item::Memory { i, end } => {
                let m = &rec.memory[i];
                let thread = tracks[&Track::Thread(m.tgid, m.tid)];
                if end == Some(true) {
                    w.event(ts, None, on(thread, track_event::Type::SliceEnd))?;
                    if let Some((counter, v)) = memory_level(&mut level, m) {
                        let mut c = on(tracks[&counter], track_event::Type::Counter);
                        c.counter_value_field = Some(track_event::CounterValueField::CounterValue(v));
                        w.event(ts, None, c)?;
                    }
                    continue;
                }
                let kind = if end.is_none() { track_event::Type::Instant } else { track_event::Type::SliceBegin };
                let mut e = on(thread, kind);
                e.categories = vec!["memory".into()];
                e.debug_annotations = vec![
                    uint(
                        if matches!(m.kind, MemoryKind::CudaFree | MemoryKind::DriverFree) {
                            "bytes_released"
                        } else {
                            "bytes"
                        },
                        m.bytes,
                    ),
                    ptr(
                        if matches!(m.kind, MemoryKind::DriverAlloc | MemoryKind::DriverFree) {
                            "handle"
                        } else {
                            "ptr"
                        },
                        m.ptr,
                    ),
                    ann("success", debug_annotation::Value::BoolValue(m.success)),
                ];
                match m.kind {
                    MemoryKind::CudaAlloc if m.success && m.ptr != 0 => {
                        let id = next_flow;
                        next_flow += 1;
                        flows.insert((m.tgid, m.ptr), id);
                        e.flow_ids = vec![id];
                    }
                    MemoryKind::CudaFree => {
                        if let Some(id) = flows.remove(&(m.tgid, m.ptr)) {
                            e.terminating_flow_ids = vec![id];
                        }
                    }
                    _ => {}
                }
                w.event(ts, Some(&m.entry_point), e)?;
                // The counter moves when the call returns: now for an instant, at the slice's end otherwise.
                if end.is_none()
                    && let Some((counter, v)) = memory_level(&mut level, m)
                {
                    let mut c = on(tracks[&counter], track_event::Type::Counter);
                    c.counter_value_field = Some(track_event::CounterValueField::CounterValue(v));
                    w.event(ts, None, c)?;
                }
            }
            Item::Call { call: c, end } => {
                let track = tracks[&Track::Thread(c.tgid, c.tid)];
                if end {
                    w.event(ts, None, on(track, track_event::Type::SliceEnd))?;
                    continue;
                }
                let mut e = on(track, track_event::Type::SliceBegin);
                e.categories = vec![c.class.clone()];
                let mut a = vec![uint("result", c.result.into())];
                if let Some(st) = c.stream {
                    a.push(ptr("stream", st));
                }
                if let Some(ev) = c.event {
                    a.push(ptr("event", ev));
                }
                if c.class == "copy" || c.class == "memset" {
                    a.push(uint("bytes", c.bytes));
                    a.push(ann("async", debug_annotation::Value::BoolValue(c.is_async)));
                }
                if !c.direction.is_empty() {
                    a.push(text("direction", w.string(&c.direction)));
                }
                e.debug_annotations = a;
                w.event(ts, Some(&c.entry_point), e)?;
            }
            Item::Bounded { b, end } => {
                let track = tracks[&Track::Stream(b.tgid, b.stream)];
                if end {
                    w.event(ts, None, on(track, track_event::Type::SliceEnd))?;
                    continue;
                }
                let mut e = on(track, track_event::Type::SliceBegin);
                e.categories = vec!["bounded".into()];
                e.debug_annotations = vec![
                    uint("kernels", b.kernels),
                    text("bounded_by", w.string(&b.by)),
                    text("meaning", w.string("these kernels ran somewhere inside this interval; not a duration")),
                ];
                w.event(ts, Some("ran within (bounded at sync)"), e)?;
            }
            Item::Gap { tgid, end } => {
                let track = tracks[&Track::Submission(tgid)];
                if end {
                    w.event(ts, None, on(track, track_event::Type::SliceEnd))?;
                } else {
                    w.event(ts, Some("idle: nothing submitted"), on(track, track_event::Type::SliceBegin))?;
                }
            }
        }
    }
    w.out.flush()?;
    Ok(w.stats)
}

/// Apply a memory call to its ledger's level: the counter track and its new value, or `None`
/// when the call changes nothing (a failed allocation, a free of unknown size).
fn memory_level(level: &mut HashMap<Track, i64>, m: &MemoryCall) -> Option<(Track, i64)> {
    let (counter, delta) = match m.kind {
        MemoryKind::CudaAlloc => (Track::CudaMemory(m.tgid), if m.success { m.bytes as i64 } else { 0 }),
        MemoryKind::CudaFree => (Track::CudaMemory(m.tgid), -(m.bytes as i64)),
        MemoryKind::DriverAlloc => (Track::DriverMemory(m.tgid), if m.success { m.bytes as i64 } else { 0 }),
        MemoryKind::DriverFree => (Track::DriverMemory(m.tgid), -(m.bytes as i64)),
    };
    if delta == 0 {
        return None;
    }
    let v = level.entry(counter).or_default();
    *v += delta;
    Some((counter, *v))
}

fn named(uuid: u64, parent: Option<u64>, name: String, counter: Option<CounterDescriptor>) -> TrackDescriptor {
    TrackDescriptor {
        uuid: Some(uuid),
        parent_uuid: parent,
        static_or_dynamic_name: Some(track_descriptor::StaticOrDynamicName::Name(name)),
        counter,
        ..Default::default()
    }
}

/// The name of a stream's track (`0` is the legacy default stream).
pub(crate) fn stream_name(stream: u64) -> String {
    match stream {
        0 => "stream 0 (default)".into(),
        // CU_STREAM_LEGACY and CU_STREAM_PER_THREAD.
        1 => "stream legacy default".into(),
        2 => "stream per-thread default".into(),
        s => format!("stream {s:#x}"),
    }
}
