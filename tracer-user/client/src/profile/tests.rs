use std::collections::{HashMap, HashSet};

use gpu_tracer_proto::{
    perfetto::{Trace, debug_annotation, trace_packet, track_descriptor, track_event},
    v1::{self, event::Payload},
};
use prost::Message;

use super::{perfetto, summary};
use tracer_core::profile::{Limits, Recorder, Recording, Target};

const T0: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

fn ev(tgid: u32, tid: u32, t: u64, payload: Payload) -> v1::Event {
    v1::Event {
        header: Some(v1::Header {
            ktime_ns: t,
            tgid,
            pid: tid,
            comm: "train".into(),
            cgroup_id: 77,
            ..Default::default()
        }),
        payload: Some(payload),
        ..Default::default()
    }
}

fn launch(name: &str, stream: u64) -> Payload {
    Payload::CudaLaunch(v1::CudaLaunch {
        entry_point: "cuLaunchKernel".into(),
        function: 0xf00,
        kernel_name: name.into(),
        stream,
        grid: vec![128, 2, 1],
        block: vec![32, 4, 2],
        shared_mem_bytes: 4096,
    })
}

fn alloc(ptr: u64, bytes: u64) -> Payload {
    Payload::CudaAlloc(v1::CudaAlloc { entry_point: "cuMemAlloc_v2".into(), result: 0, success: true, ptr, bytes })
}

fn free(ptr: u64, bytes: u64) -> Payload {
    Payload::CudaFree(v1::CudaFree { entry_point: "cuMemFree_v2".into(), ptr, bytes_released: bytes })
}

/// A known schedule: two threads of process 10 launch on two streams, allocate and free; process
/// 11 (another workload) and an event from before the window are left out.
fn schedule() -> Recording {
    let mut r = Recorder::new(Target::Pid(10), Limits::default(), T0);
    r.event(&ev(10, 10, T0 - 1, launch("before", 0x5))); // before the window
    for i in 0..30 {
        r.event(&ev(10, 10, T0 + i * MS, launch("gemm", 0x5)));
    }
    for i in 0..10 {
        r.event(&ev(10, 12, T0 + 500 * MS + i * MS, launch("softmax", 0x6)));
    }
    r.event(&ev(11, 11, T0 + 5 * MS, launch("other", 0x5)));
    r.event(&ev(10, 10, T0 + 40 * MS, alloc(0xa000, 1 << 20)));
    r.event(&ev(10, 12, T0 + 41 * MS, alloc(0xb000, 4 << 20)));
    r.event(&ev(10, 10, T0 + 600 * MS, free(0xa000, 1 << 20)));
    r.event(&ev(10, 10, T0 + 601 * MS, free(0xdead, 0))); // allocated before the window
    r.finish(T0 + 2000 * MS, "duration", 0)
}

fn decode(rec: &Recording, max: u64) -> (Trace, perfetto::TraceStats) {
    let mut out = Vec::new();
    let stats = perfetto::write(rec, 100 * MS, max, &mut out).unwrap();
    assert_eq!(stats.bytes, out.len() as u64);
    (Trace::decode(out.as_slice()).expect("a Trace"), stats)
}

/// The structural rules a trace reader relies on: every track declared before its first event,
/// slices balanced per track, every interned name defined before use, timestamps in order.
fn check_structure(t: &Trace) -> HashMap<u64, Vec<(String, track_event::Type)>> {
    let mut declared = HashSet::new();
    let mut names: HashMap<u64, String> = HashMap::new();
    let (mut ann_names, mut strings) = (HashSet::new(), HashSet::new());
    let mut depth: HashMap<u64, i64> = HashMap::new();
    let mut last_ts = 0;
    let mut by_track: HashMap<u64, Vec<(String, track_event::Type)>> = HashMap::new();
    for (i, p) in t.packet.iter().enumerate() {
        assert_eq!(
            p.optional_trusted_packet_sequence_id,
            Some(trace_packet::OptionalTrustedPacketSequenceId::TrustedPacketSequenceId(1))
        );
        if i == 0 {
            assert_eq!(p.sequence_flags, Some(1), "the first packet clears the incremental state");
        }
        if let Some(d) = &p.interned_data {
            for n in &d.event_names {
                names.insert(n.iid(), n.name().to_string());
            }
            for n in &d.debug_annotation_names {
                assert!(ann_names.insert(n.iid()), "annotation name iid {} interned twice", n.iid());
            }
            for v in &d.debug_annotation_string_values {
                assert!(strings.insert(v.iid()), "string iid {} interned twice", v.iid());
            }
        }
        match &p.data {
            Some(trace_packet::Data::TrackDescriptor(d)) => {
                if let Some(parent) = d.parent_uuid {
                    assert!(declared.contains(&parent), "parent declared first");
                }
                assert!(declared.insert(d.uuid()), "uuid declared once");
            }
            Some(trace_packet::Data::TrackEvent(e)) => {
                assert!(declared.contains(&e.track_uuid()), "track declared before use");
                assert!(p.timestamp() >= last_ts, "in time order");
                last_ts = p.timestamp();
                let name = match &e.name_field {
                    Some(track_event::NameField::NameIid(iid)) => names.get(iid).expect("interned before use").clone(),
                    _ => String::new(),
                };
                for a in &e.debug_annotations {
                    match (&a.name_field, &a.value) {
                        (Some(debug_annotation::NameField::NameIid(i)), v) => {
                            assert!(ann_names.contains(i), "annotation name iid {i} used before it is interned");
                            if let Some(debug_annotation::Value::StringValueIid(j)) = v {
                                assert!(strings.contains(j), "string iid {j} used before it is interned");
                            }
                        }
                        other => panic!("annotation names are interned: {other:?}"),
                    }
                }
                let d = depth.entry(e.track_uuid()).or_default();
                match e.r#type() {
                    track_event::Type::SliceBegin => *d += 1,
                    track_event::Type::SliceEnd => *d -= 1,
                    _ => {}
                }
                assert!(*d >= 0, "an end without a begin");
                by_track.entry(e.track_uuid()).or_default().push((name, e.r#type()));
            }
            None => panic!("an empty packet"),
        }
    }
    assert!(depth.values().all(|d| *d == 0), "every slice ends: {depth:?}");
    by_track
}

#[test]
fn recorder_keeps_the_target_inside_the_window() {
    let rec = schedule();
    assert_eq!(rec.launches.len(), 40);
    assert_eq!(rec.memory.len(), 4);
    assert_eq!(rec.processes.keys().copied().collect::<Vec<_>>(), vec![10]);
    assert_eq!(rec.processes[&10].threads.len(), 2);
    assert_eq!(rec.events_seen, 44);
}

#[test]
fn trace_declares_tracks_before_use_and_counts_match_the_schedule() {
    let rec = schedule();
    let (t, stats) = decode(&rec, u64::MAX);
    let by_track = check_structure(&t);
    let tracks: HashMap<u64, String> = t
        .packet
        .iter()
        .filter_map(|p| match &p.data {
            Some(trace_packet::Data::TrackDescriptor(d)) => Some((
                d.uuid(),
                d.thread
                    .as_ref()
                    .map(|th| format!("thread {}", th.tid()))
                    .or(d.process.as_ref().map(|p| format!("process {}", p.process_name())))
                    .unwrap_or_else(|| match &d.static_or_dynamic_name {
                        Some(track_descriptor::StaticOrDynamicName::Name(n)) => n.clone(),
                        None => String::new(),
                    }),
            )),
            _ => None,
        })
        .collect();
    let count = |track: &str, name: &str| -> usize {
        let uuid = tracks
            .iter()
            .find(|(_, n)| n.as_str() == track)
            .map(|(u, _)| *u)
            .unwrap_or_else(|| panic!("{track}: {tracks:?}"));
        by_track.get(&uuid).map_or(0, |v| v.iter().filter(|(n, _)| n == name).count())
    };
    assert_eq!(count("thread 10", "gemm"), 30);
    assert_eq!(count("thread 12", "softmax"), 10);
    assert_eq!(count("stream 0x5", "gemm"), 30);
    assert_eq!(count("stream 0x6", "softmax"), 10);
    assert_eq!(count("thread 10", "cuMemAlloc_v2") + count("thread 12", "cuMemAlloc_v2"), 2);
    assert_eq!(count("thread 10", "cuMemFree_v2"), 2);
    assert!(tracks.values().any(|n| n == "process train [10]"));
    // Idle gaps of >= 100 ms: from the last gemm (29 ms) to the first softmax (500 ms), and from
    // the last softmax (509 ms) to the end (2000 ms).
    assert_eq!(count("GPU submission", "idle: nothing submitted"), 2);
    assert_eq!((stats.slices, stats.instants, stats.flows), (2, 84, 2));
    // The CUDA memory counter: 0, +1 MiB, +4 MiB, -1 MiB.
    let counter: Vec<i64> = t
        .packet
        .iter()
        .filter_map(|p| match &p.data {
            Some(trace_packet::Data::TrackEvent(e)) if e.r#type() == track_event::Type::Counter => {
                match e.counter_value_field {
                    Some(track_event::CounterValueField::CounterValue(v)) => Some(v),
                    _ => None,
                }
            }
            _ => None,
        })
        .collect();
    assert_eq!(counter, vec![0, 1 << 20, 5 << 20, 4 << 20]);
}

#[test]
fn a_flow_joins_each_allocation_to_its_free() {
    let (t, _) = decode(&schedule(), u64::MAX);
    let mut begun = HashSet::new();
    let mut ended = 0;
    for p in &t.packet {
        if let Some(trace_packet::Data::TrackEvent(e)) = &p.data {
            begun.extend(e.flow_ids.iter().copied());
            for id in &e.terminating_flow_ids {
                assert!(begun.contains(id), "a flow ends after it begins");
                ended += 1;
            }
        }
    }
    assert_eq!((begun.len(), ended), (2, 1), "0xb000 is never freed; 0xdead was allocated before");
}

#[test]
fn the_size_limit_cuts_the_trace_cleanly_and_says_so() {
    let rec = schedule();
    let (full, _) = decode(&rec, u64::MAX);
    let whole: usize = full.encoded_len();
    let (t, stats) = decode(&rec, whole as u64 / 2);
    assert!(stats.bytes <= whole as u64 / 2 + 64, "{stats:?}");
    assert!(stats.packets_over_limit > 0);
    check_structure(&t);
}

#[test]
fn summary_numbers_equal_the_schedule() {
    let rec = schedule();
    let s = summary::summarize(&rec, &Target::Pid(10), 100 * MS, Default::default());
    assert_eq!(s.launches.total, 40);
    assert_eq!(s.launches.per_entry_point["cuLaunchKernel"], 40);
    assert_eq!(s.launches.per_stream["stream 0x5"], 30);
    assert_eq!(s.launches.unnamed, 0);
    assert_eq!((s.top_kernels[0].name.as_str(), s.top_kernels[0].launches), ("gemm", 30));
    assert_eq!((s.top_kernels[0].grid.as_str(), s.top_kernels[0].block.as_str()), ("128x2x1", "32x4x2"));
    assert_eq!(s.launch_rate.per_bucket, vec![40, 0]);
    assert_eq!((s.cuda_memory.allocs, s.cuda_memory.alloc_bytes), (2, 5 << 20));
    assert_eq!((s.cuda_memory.frees, s.cuda_memory.freed_bytes), (2, 1 << 20));
    assert_eq!((s.cuda_memory.net_bytes, s.cuda_memory.peak_bytes), (4 << 20, 5 << 20));
    assert!((s.cuda_memory.peak_at_s - 0.041).abs() < 1e-9);
    assert_eq!((s.leak_candidates_total, s.leak_candidates_bytes), (1, 4 << 20));
    assert_eq!((s.leak_candidates[0].ptr.as_str(), s.leak_candidates[0].tid), ("0xb000", 12));
    assert_eq!(s.idle.gaps, 2);
    assert!((s.idle.total_s - (0.471 + 1.491)).abs() < 1e-9, "{:?}", s.idle);
    assert_eq!(s.processes[0].threads, 2);
    assert_eq!(s.gpu_time.unknown_share, 1.0);
    let text = summary::render(&s);
    assert!(text.contains("gemm") && text.contains("leak candidates"), "{text}");
}

#[test]
fn the_event_limit_is_counted_not_silent() {
    let mut r = Recorder::new(Target::cgroup(77), Limits { max_events: 5 }, T0);
    for i in 0..8 {
        r.event(&ev(10, 10, T0 + i, launch("k", 1)));
    }
    assert!(r.limit_reached());
    let rec = r.finish(T0 + 10, "event limit", 3);
    assert_eq!((rec.launches.len(), rec.events_seen, rec.events_over_limit, rec.tracer_dropped), (5, 8, 3, 3));
}

#[test]
fn a_process_exit_ends_its_idle_time_and_its_leaks() {
    let mut r = Recorder::new(Target::Pid(10), Limits::default(), T0);
    r.event(&ev(10, 10, T0 + MS, alloc(0xa, 100)));
    r.event(&ev(10, 10, T0 + 2 * MS, launch("k", 1)));
    r.event(&ev(10, 10, T0 + 300 * MS, Payload::ProcessExit(v1::ProcessExit {})));
    assert!(r.target_exited());
    let rec = r.finish(T0 + 1000 * MS, "workload exited", 0);
    let s = summary::summarize(&rec, &Target::Pid(10), 100 * MS, Default::default());
    assert_eq!(s.leak_candidates_total, 0, "an exited process's memory is released");
    assert_eq!(s.idle.gaps, 1);
    assert!((s.idle.total_s - 0.298).abs() < 1e-9, "{:?}", s.idle);
}

fn sync_call(entry: &str, stream: Option<u64>, result: u32) -> Payload {
    Payload::CudaCall(v1::CudaCall {
        entry_point: entry.into(),
        class: "synchronize".into(),
        result,
        success: result == 0,
        stream,
        ..Default::default()
    })
}

/// `ev` with the header's duration set (a timed call returning at `t` after `d` ns).
fn timed(tgid: u32, tid: u32, t: u64, d: u64, p: Payload) -> v1::Event {
    let mut e = ev(tgid, tid, t, p);
    e.header.as_mut().unwrap().duration_ns = d;
    e
}

#[test]
fn synchronisations_bound_the_kernels_before_them_and_are_slices_on_their_thread() {
    let mut r = Recorder::new(Target::Pid(10), Limits::default(), T0);
    for i in 0..30 {
        r.event(&ev(10, 10, T0 + i * MS, launch("gemm", 0x5)));
    }
    // cuStreamSynchronize(0x5) from 30 to 45 ms: the 30 gemms ran within [0, 45 ms].
    r.event(&timed(10, 10, T0 + 45 * MS, 15 * MS, sync_call("cuStreamSynchronize", Some(0x5), 0)));
    for i in 0..10 {
        r.event(&ev(10, 12, T0 + 500 * MS + i * MS, launch("softmax", 0x6)));
    }
    // A launch during the context synchronisation (from 600 to 620 ms) is not covered by it.
    r.event(&ev(10, 12, T0 + 610 * MS, launch("late", 0x6)));
    r.event(&timed(10, 10, T0 + 620 * MS, 20 * MS, sync_call("cuCtxSynchronize", None, 0)));
    // A failed synchronisation bounds nothing.
    r.event(&timed(10, 12, T0 + 700 * MS, MS, sync_call("cuStreamSynchronize", Some(0x6), 999)));
    let rec = r.finish(T0 + 2000 * MS, "duration", 0);
    let (b, not) = super::intervals::bounded_intervals(&rec);
    assert_eq!(not, 1, "the late launch: {b:#?}");
    let got: Vec<(u64, u64, u64, u64)> =
        b.iter().map(|b| (b.stream, (b.start_ktime_ns - T0) / MS, (b.end_ktime_ns - T0) / MS, b.kernels)).collect();
    assert_eq!(got, vec![(0x5, 0, 45, 30), (0x6, 500, 620, 10)]);
    let s = summary::summarize(&rec, &Target::Pid(10), 100 * MS, Default::default());
    assert_eq!((s.gpu_time.launches_bounded, s.gpu_time.launches_not_bounded), (40, 1));
    assert!((s.gpu_time.bounded_share - 0.165 / 2.0).abs() < 1e-9, "{:?}", s.gpu_time);
    assert_eq!(s.synchronisation.len(), 2);
    assert_eq!((s.synchronisation[0].tid, s.synchronisation[0].calls), (10, 2));
    assert!((s.synchronisation[0].blocked_ms - 35.0).abs() < 1e-9);
    assert_eq!(s.synchronisation[0].per_entry_point["cuCtxSynchronize"], 1);
    // The bounded time per kernel: [0, 45 ms] is all gemm's, [500, 620 ms] all softmax's; the late
    // launch has none.
    let by_time: Vec<(&str, f64, f64)> = s
        .top_kernels_by_bounded_time
        .iter()
        .map(|k| (k.name.as_str(), (k.bounded_ms * 1e3).round() / 1e3, (k.bounded_share * 1e3).round() / 1e3))
        .collect();
    assert_eq!(by_time, vec![("softmax", 120.0, 0.727), ("gemm", 45.0, 0.273)]);
    assert_eq!(s.top_kernels.iter().find(|k| k.name == "late").map(|k| k.bounded_ms), Some(0.0));
    // The estimate of what it cost: 41 launches and 3 timed calls at the benchmark's per-call costs.
    let c = &s.session.estimated_cost;
    assert_eq!((c.launches, c.timed_calls), (41, 3));
    assert!((c.total_ms - (41.0 * 1830.0 + 3.0 * 1637.0) / 1e6).abs() < 1e-9, "{c:?}");
    assert!((c.share_of_window - c.total_ms / 2000.0).abs() < 1e-12);

    let (t, stats) = decode(&rec, u64::MAX);
    let by_track = check_structure(&t);
    let slices = |name: &str| -> usize {
        by_track.values().flatten().filter(|(n, ty)| n == name && *ty == track_event::Type::SliceBegin).count()
    };
    assert_eq!(slices("cuStreamSynchronize"), 2);
    assert_eq!(slices("cuCtxSynchronize"), 1);
    assert_eq!(slices("ran within (bounded at sync)"), 2);
    assert!(stats.slices >= 5);
}

#[test]
fn overlapping_bounds_on_one_stream_merge() {
    let mut r = Recorder::new(Target::Pid(10), Limits::default(), T0);
    r.event(&ev(10, 10, T0 + MS, launch("a", 0x5)));
    // Thread 11 launches while thread 10's synchronisation (2..10 ms) is in progress; its own
    // synchronisation (9..20 ms) bounds it: [5, 20] overlaps [1, 10], so one interval [1, 20].
    r.event(&ev(10, 11, T0 + 5 * MS, launch("b", 0x5)));
    r.event(&timed(10, 10, T0 + 10 * MS, 8 * MS, sync_call("cuStreamSynchronize", Some(0x5), 0)));
    r.event(&timed(10, 11, T0 + 20 * MS, 11 * MS, sync_call("cuStreamSynchronize", Some(0x5), 0)));
    let rec = r.finish(T0 + 100 * MS, "duration", 0);
    let (b, not) = super::intervals::bounded_intervals(&rec);
    assert_eq!(not, 0);
    assert_eq!(b.len(), 1, "{b:#?}");
    assert_eq!(((b[0].start_ktime_ns - T0) / MS, (b[0].end_ktime_ns - T0) / MS, b[0].kernels), (1, 20, 2));
    check_structure(&decode(&rec, u64::MAX).0);
}

fn event_call(entry: &str, class: &str, event: u64, stream: Option<u64>, result: u32) -> Payload {
    Payload::CudaCall(v1::CudaCall {
        entry_point: entry.into(),
        class: class.into(),
        result,
        success: result == 0,
        stream,
        event: Some(event),
        ..Default::default()
    })
}

#[test]
fn an_event_seen_complete_bounds_the_launches_before_its_record() {
    let mut r = Recorder::new(Target::Pid(10), Limits::default(), T0);
    for i in 0..5 {
        r.event(&ev(10, 10, T0 + i * MS, launch("gemm", 0x5)));
    }
    // cuEventRecord(E, 0x5) at 10 ms; then 3 more launches on 0x5 after the record.
    r.event(&timed(10, 10, T0 + 10 * MS, 0, event_call("cuEventRecord", "record", 0xe, Some(0x5), 0)));
    for i in 0..3 {
        r.event(&ev(10, 10, T0 + (11 + i) * MS, launch("gemm", 0x5)));
    }
    // Polling: not ready (bounds nothing), then cuEventSynchronize(E) returns at 40 ms: the 5
    // launches before the record ran within [0, 40]; the 3 after it are not bounded by it.
    r.event(&timed(10, 10, T0 + 20 * MS, MS, event_call("cuEventQuery", "query", 0xe, None, 600)));
    r.event(&timed(10, 10, T0 + 40 * MS, 15 * MS, event_call("cuEventSynchronize", "synchronize", 0xe, None, 0)));
    // An event on another stream (0x6) recorded at 50 ms and found complete by a query at 70 ms.
    r.event(&ev(10, 11, T0 + 45 * MS, launch("softmax", 0x6)));
    r.event(&timed(10, 11, T0 + 50 * MS, 0, event_call("cuEventRecord", "record", 0xf, Some(0x6), 0)));
    r.event(&timed(10, 11, T0 + 70 * MS, MS, event_call("cuEventQuery", "query", 0xf, None, 0)));
    // An event synchronised that was never recorded in the window bounds nothing.
    r.event(&timed(10, 11, T0 + 80 * MS, MS, event_call("cuEventSynchronize", "synchronize", 0x99, None, 0)));
    let rec = r.finish(T0 + 100 * MS, "duration", 0);
    let (b, not) = super::intervals::bounded_intervals(&rec);
    let got: Vec<(u64, u64, u64, u64, &str)> = b
        .iter()
        .map(|b| (b.stream, (b.start_ktime_ns - T0) / MS, (b.end_ktime_ns - T0) / MS, b.kernels, b.by.as_str()))
        .collect();
    assert_eq!(got, vec![(0x5, 0, 40, 5, "cuEventSynchronize"), (0x6, 45, 70, 1, "cuEventQuery")]);
    assert_eq!(not, 3, "the launches after the record");
    check_structure(&decode(&rec, u64::MAX).0);
}

/// The report is one file with everything inlined (no URL is fetched), and names from the
/// workload (a kernel may be called anything) cannot break out of the page.
#[test]
fn html_report_is_self_contained_and_escapes_what_the_workload_names() {
    let mut r = Recorder::new(Target::Pid(10), Limits::default(), T0);
    r.event(&ev(10, 10, T0 + MS, launch("</script><img src=x onerror=alert(1)>", 0x5)));
    r.event(&ev(10, 10, T0 + 2 * MS, launch("gemm<float>", 0x5)));
    r.event(&ev(10, 10, T0 + 3 * MS, alloc(0xa, 1 << 20)));
    r.event(&timed(10, 10, T0 + 9 * MS, 5 * MS, sync_call("cuStreamSynchronize", Some(0x5), 0)));
    let rec = r.finish(T0 + 1000 * MS, "duration", 0);
    let s = summary::summarize(&rec, &Target::Pid(10), 100 * MS, Default::default());
    let page = crate::profile::html::render(&rec, &s);
    if let Ok(dir) = std::env::var("GPU_TRACER_KEEP_REPORT") {
        std::fs::write(std::path::Path::new(&dir).join("unit-report.html"), &page).unwrap();
    }
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert_eq!(page.matches("<script>").count(), 2, "uPlot and the page's own script, inline");
    assert!(!page.contains("src=\"http") && !page.contains("href=\"http"), "nothing fetched");
    assert!(page.contains("gemm&lt;float&gt;"), "names escaped in tables");
    assert!(!page.contains("</script><img"), "a name cannot close the script");
    for id in ["memory", "rate", "kernels", "sync"] {
        assert!(page.contains(&format!("<div class=\"plot\" id=\"{id}\">")), "{id}");
    }
    assert!(page.contains("No NVML readings in the window"), "no plot where NVML gave nothing");

    // With NVML's passes: a plot of the GPU the workload used, and its table.
    let mut rec = rec;
    for (i, pct) in [30u32, 50, 70].into_iter().enumerate() {
        rec.gpu_samples.push(v1::GpuSample {
            ktime_ns: T0 + 100 * MS + i as u64 * 300 * MS,
            index: 0,
            gpu_pct: Some(pct),
            power_mw: Some(200_000),
            processes: vec![v1::GpuProcessSample { pid: 10, sm_pct: Some(pct - 10), ..Default::default() }],
            ..Default::default()
        });
    }
    let page = crate::profile::html::render(&rec, &s);
    assert!(page.contains("<div class=\"plot\" id=\"gpu\">"));
    assert!(page.contains("\"gpu_labels\":[\"GPU 0 utilization %\",\"GPU 0 SM % of this workload\"]"), "{page}");
    assert!(page.contains("\"gpu\":[[0.1,0.4,0.7],[30.0,50.0,70.0],[20.0,40.0,60.0]]"));
    assert!(
        page.contains("<td>0.400</td><td>0</td><td>50</td><td>40</td><td>200.0</td><td>-</td><td>-</td><td>-</td>")
    );
}

#[test]
fn an_allocation_is_a_slice_from_entry_to_return_and_the_counter_moves_at_return() {
    let mut r = Recorder::new(Target::Pid(10), Limits::default(), T0);
    // cuMemAlloc_v2 from 10 to 13 ms, with the driver's RM_ALLOC inside it (11 to 12 ms).
    let rm = Payload::RmAlloc(v1::RmAlloc { handle: 0xcafe, bytes: 2 << 20, success: true, ..Default::default() });
    r.event(&timed(10, 10, T0 + 12 * MS, MS, rm));
    r.event(&timed(10, 10, T0 + 13 * MS, 3 * MS, alloc(0xa000, 2 << 20)));
    // One that began before the window (at -1 ms) is drawn from the window's start.
    r.event(&timed(10, 10, T0 + 20 * MS, 21 * MS, alloc(0xb000, 1 << 20)));
    r.event(&ev(10, 10, T0 + 30 * MS, free(0xa000, 2 << 20)));
    let rec = r.finish(T0 + 100 * MS, "duration", 0);
    let starts: Vec<u64> = rec.memory.iter().map(|m| (m.start_ktime_ns - T0) / MS).collect();
    assert_eq!(starts, vec![11, 10, 0, 30]);

    let (t, stats) = decode(&rec, u64::MAX);
    let by_track = check_structure(&t);
    let thread: Vec<(String, track_event::Type)> =
        by_track.values().find(|v| v.iter().any(|(n, _)| n == "cuMemFree_v2")).unwrap().clone();
    use track_event::Type::{Instant, SliceBegin, SliceEnd};
    assert_eq!(
        thread.iter().map(|(n, t)| (n.as_str(), *t)).collect::<Vec<_>>(),
        vec![
            ("cuMemAlloc_v2", SliceBegin),   // 0xb000 at 0 ms (clamped), returns at 20 ms
            ("cuMemAlloc_v2", SliceBegin),   // 0xa000 at 10 ms
            ("NV_ESC_RM_ALLOC", SliceBegin), // 11 ms
            ("", SliceEnd),                  // 12 ms
            ("", SliceEnd),                  // 13 ms
            ("", SliceEnd),                  // 20 ms
            ("cuMemFree_v2", Instant),       // 30 ms
        ]
    );
    // Three calls, and the window's idle time (nothing was submitted).
    assert_eq!((stats.slices, stats.flows), (4, 2));
    // The counters move at the returns: the driver's at 12 ms, CUDA's at 13 and 20 ms, the free at 30.
    let counters: Vec<(u64, i64)> = t
        .packet
        .iter()
        .filter_map(|p| match &p.data {
            Some(trace_packet::Data::TrackEvent(e)) if e.r#type() == track_event::Type::Counter => {
                match e.counter_value_field {
                    Some(track_event::CounterValueField::CounterValue(v)) if p.timestamp() > T0 => {
                        Some(((p.timestamp() - T0) / MS, v))
                    }
                    _ => None,
                }
            }
            _ => None,
        })
        .collect();
    assert_eq!(counters, vec![(12, 2 << 20), (13, 2 << 20), (20, 3 << 20), (30, 1 << 20)]);
}

#[test]
fn bounded_time_is_split_among_the_launches_an_interval_bounds() {
    let mut r = Recorder::new(Target::Pid(10), Limits::default(), T0);
    // 3 gemm and 1 relu on stream 0x5 from 0 to 3 ms, synchronised from 5 to 40 ms: 40 ms bounded,
    // 10 ms a launch. A gemm on another stream is not bounded by that synchronisation.
    for (i, name) in ["gemm", "relu", "gemm", "gemm"].into_iter().enumerate() {
        r.event(&ev(10, 10, T0 + i as u64 * MS, launch(name, 0x5)));
    }
    r.event(&ev(10, 10, T0 + 2 * MS, launch("gemm", 0x6)));
    r.event(&timed(10, 10, T0 + 40 * MS, 35 * MS, sync_call("cuStreamSynchronize", Some(0x5), 0)));
    let rec = r.finish(T0 + 100 * MS, "duration", 0);
    let s = summary::summarize(&rec, &Target::Pid(10), 100 * MS, Default::default());
    let by_time: Vec<(&str, u64, f64)> =
        s.top_kernels_by_bounded_time.iter().map(|k| (k.name.as_str(), k.launches, k.bounded_ms)).collect();
    assert_eq!(by_time, vec![("gemm", 4, 30.0), ("relu", 1, 10.0)]);
    assert!((s.top_kernels_by_bounded_time[0].bounded_share - 0.75).abs() < 1e-12);
    assert!(summary::render(&s).contains("by bounded time"));
}
