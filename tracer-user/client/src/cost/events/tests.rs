use std::sync::Arc;
use tracer_core::model::AgentSnapshot;

use prost::Message as _;

use super::*;
use tracer_core::cost::bill::BillWriter;
use tracer_core::{
    attribution::{AttributionInput, Attributor, ContainerInput, ContainerKey, GpuInput, ProcessInput},
    config::AttributionSettings,
    cost::{GroupBy, Policy, Report},
    nvml::model::MemoryInfo,
};

const GIB: u64 = 1 << 30;
const T0: u64 = 1_700_000_000_000_000_000;

/// An agent's snapshots, one per 1 s interval: two containers sharing one priced GPU (one of them
/// leaves after `leave_at` intervals), the rest idle.
fn snapshots(n: u64, leave_at: u64) -> Vec<AgentSnapshot> {
    let settings = AttributionSettings { price_per_gpu_hour: Some(3.6), ..Default::default() };
    let mut a = Attributor::new(&settings);
    (0..n)
        .map(|i| {
            let mut processes = vec![ProcessInput {
                pid: 10,
                container: Some(ContainerKey(1)),
                nvml_used_bytes: Some(20 * GIB),
                nvml_sm_pct: Some(40.0 + (i % 7) as f64),
                ..Default::default()
            }];
            if i < leave_at {
                processes.push(ProcessInput {
                    pid: 20,
                    container: Some(ContainerKey(2)),
                    nvml_used_bytes: Some(10 * GIB),
                    nvml_sm_pct: Some(13.0),
                    ..Default::default()
                });
            }
            let gpu = GpuInput {
                uuid: "GPU-a".into(),
                index: Some(0),
                minor: Some(0),
                share_of_gpu_ppm: 1_000_000,
                memory: Some(MemoryInfo { total: 80 * GIB, reserved: GIB, used: 31 * GIB, free: 48 * GIB }),
                sm_activity_pct: Some(70),
                processes,
                ..Default::default()
            };
            let containers = [(1, "ml/train-0/main"), (2, "web/infer-0/server")]
                .into_iter()
                .map(|(k, name)| (ContainerKey(k), ContainerInput { name: Some(name.into()), request: None }))
                .collect();
            let input = AttributionInput {
                start_unix_ns: T0 + i * 1_000_000_000,
                interval_ns: 1_000_000_000,
                gpus: vec![gpu],
                containers,
            };
            AgentSnapshot { attribution: Some(Arc::new(a.update(&input))), ..Default::default() }
        })
        .collect()
}

/// The events a `BillWriter` writes over `snaps`, with the final bill; as a length-delimited stream.
fn record(w: &mut BillWriter, snaps: &[AgentSnapshot], end: bool) -> Vec<v1::Event> {
    let mut out: Vec<v1::Event> = snaps.iter().filter_map(|s| w.due(s, 1)).collect();
    if end && let Some(ev) = w.event(snaps.last().unwrap(), 2) {
        out.push(ev);
    }
    out
}

fn stream(events: &[v1::Event]) -> Vec<u8> {
    let mut buf = Vec::new();
    for ev in events {
        ev.encode_length_delimited(&mut buf).unwrap();
    }
    buf
}

fn total(s: &AgentSnapshot) -> i128 {
    s.attribution.as_ref().unwrap().bill.total as i128
}

#[test]
fn bills_are_written_once_a_minute_of_attribution_time_the_first_one_marked() {
    let snaps = snapshots(200, 90);
    let mut w = BillWriter::new("node-a".into(), T0 - 5_000_000_000);
    let events = record(&mut w, &snaps, false);
    // Intervals ending at 1 s, 61 s, 121 s, 181 s.
    let ends: Vec<u64> = events
        .iter()
        .map(|e| match &e.payload {
            Some(Payload::Bill(b)) => (b.end_unix_ns - T0) / 1_000_000_000,
            _ => panic!("not a bill"),
        })
        .collect();
    assert_eq!(ends, [1, 61, 121, 181]);
    let firsts: Vec<bool> = events.iter().map(|e| matches!(&e.payload, Some(Payload::Bill(b)) if b.first)).collect();
    assert_eq!(firsts, [true, false, false, false]);
    assert_eq!(events[0].header.as_ref().unwrap().kind, v1::EventKind::Bill as i32);
    // Each adds up like the agent's bill.
    for e in &events {
        let Some(Payload::Bill(b)) = &e.payload else { unreachable!() };
        let sum: u64 = b.containers.iter().map(|c| c.nano).sum::<u64>()
            + b.idle_nano
            + b.driver_reserved_nano
            + b.unattributed_nano
            + b.evicted_nano;
        assert_eq!(sum, b.total_nano);
    }
    // A snapshot without a price or before the first interval writes nothing.
    let mut w = BillWriter::new("node-a".into(), 0);
    assert!(w.due(&AgentSnapshot::default(), 1).is_none());
}

#[test]
fn a_recording_from_the_agents_start_bills_its_whole_life_exactly() {
    let snaps = snapshots(200, 90);
    let mut w = BillWriter::new("node-a".into(), T0);
    let events = record(&mut w, &snaps, true);
    let input = from_bytes(&stream(&events), "rec.pb").unwrap();
    let r = Report::build(input, &[GroupBy::Pod], Policy::Lines);
    assert_eq!(r.total_nano, total(snaps.last().unwrap()));
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    // The container that left keeps what it was charged (no identities here: named as /metrics
    // names a container that is not a pod's).
    let web = r.rows.iter().find(|x| x.key == ["web/infer-0/server"]).unwrap_or_else(|| panic!("{:?}", r.rows));
    assert!(web.nano > 0);
}

#[test]
fn a_recording_that_starts_late_counts_from_its_first_bill_and_restarts_from_zero() {
    let snaps = snapshots(200, 90);
    // Process 1 of node-a: the recording starts after its first bills (a subscriber that joined).
    let mut w1 = BillWriter::new("node-a".into(), T0);
    let all1 = record(&mut w1, &snaps, false);
    let late = &all1[2..];
    // Process 2 of node-a (restarted): its whole life.
    let snaps2 = snapshots(130, 1000);
    let mut w2 = BillWriter::new("node-a".into(), T0 + 500_000_000_000);
    let p2 = record(&mut w2, &snaps2, true);
    // node-b: whole life, different prices do not matter to the sum.
    let mut w3 = BillWriter::new("node-b".into(), T0);
    let p3 = record(&mut w3, &snaps[..100], true);
    let mut events: Vec<v1::Event> = late.to_vec();
    events.extend(p2);
    events.extend(p3);
    // Other events in between are skipped.
    events.insert(1, v1::Event { header: Some(v1::Header::default()), ..Default::default() });
    let input = from_bytes(&stream(&events), "rec.pb").unwrap();

    let at = |e: &v1::Event| match &e.payload {
        Some(Payload::Bill(b)) => b.total_nano as i128,
        _ => unreachable!(),
    };
    let want = (at(late.last().unwrap()) - at(&late[0])) + total(snaps2.last().unwrap()) + total(&snaps[99]);
    let r = Report::build(input, &[GroupBy::Node, GroupBy::Namespace], Policy::Lines);
    assert_eq!(r.total_nano, want);
    let w = r.warnings.join("\n");
    assert!(w.contains("node-a: 2 agent processes"), "{w}");
    assert!(w.contains("the recording started after its agent"), "{w}");
    assert!(!w.contains("node-b"), "{w}");
}

#[test]
fn bad_files_are_named_errors_and_a_cut_last_event_is_a_warning() {
    let snaps = snapshots(70, 1000);
    let mut w = BillWriter::new("node-a".into(), T0);
    let bytes = stream(&record(&mut w, &snaps, true));
    // JSON lines.
    let e = from_bytes(b"{\"kind\":\"bill\"}\n", "x.json").unwrap_err();
    assert!(e.to_string().contains("no --json"), "{e}");
    // Garbage from the start.
    let e = from_bytes(&[0x05, 0xff, 0xff, 0xff, 0xff, 0xff], "junk").unwrap_err();
    assert!(matches!(e, EventsCostError::Garbage { offset: 0, .. }), "{e}");
    // Events without a bill.
    let plain = stream(&[v1::Event { header: Some(v1::Header::default()), ..Default::default() }]);
    let e = from_bytes(&plain, "plain.pb").unwrap_err();
    assert!(e.to_string().contains("no Bill events in 1 events"), "{e}");
    // Cut inside the last event: the bill up to the one before, with a warning.
    let mut cut = bytes.clone();
    cut.truncate(bytes.len() - 3);
    let input = from_bytes(&cut, "cut.pb").unwrap();
    assert!(input.warnings.iter().any(|w| w.contains("ends inside an event")), "{:?}", input.warnings);
    let whole = from_bytes(&bytes, "rec.pb").unwrap();
    let sum = |i: &CostInput| i.charges.iter().map(|c| c.nano).sum::<i128>();
    assert_eq!(sum(&whole), total(snaps.last().unwrap()));
    assert!(sum(&input) < sum(&whole) && sum(&input) > 0);
}
