use super::*;
use tracer_core::{
    attribution::{
        AttributionInput, Attributor, ContainerInput, GpuInput, GpuRequest, ProcessInput,
        input::{EnergyInput, EnergySource},
    },
    config::AttributionSettings,
    nvml::model::MemoryInfo,
};

const GIB: u64 = 1 << 30;

fn node(pods: u64) -> AttributionSnapshot {
    let mut containers = std::collections::BTreeMap::new();
    let processes = (0..pods)
        .map(|i| {
            let k = ContainerKey(1000 + i);
            containers.insert(
                k,
                ContainerInput {
                    name: Some(format!("ml-team-{i}/inference-server-7d9f8b6c5-x{i:02}")),
                    // Half asked for a whole GPU, half for a time-slicing replica.
                    request: Some(if i % 2 == 0 {
                        GpuRequest::WholeGpus { count: 1 }
                    } else {
                        GpuRequest::Fraction { fraction: 1.0 / pods as f64 }
                    }),
                },
            );
            ProcessInput {
                pid: 100 + i as u32,
                container: Some(k),
                nvml_used_bytes: Some((i + 1) * GIB / 16),
                nvml_sm_pct: Some((i % 7) as f64 * 0.37),
                ..Default::default()
            }
        })
        .chain([ProcessInput { pid: 9, nvml_used_bytes: Some(GIB), nvml_sm_pct: Some(1.0), ..Default::default() }])
        .collect();
    let gpu = GpuInput {
        uuid: "GPU-11111111-2222-3333-4444-555555555555".into(),
        index: Some(3),
        name: Some("NVIDIA H200".into()),
        share_of_gpu_ppm: 1_000_000,
        memory: Some(MemoryInfo { total: 140 * GIB, reserved: GIB / 2, used: 40 * GIB, free: 99 * GIB + GIB / 2 }),
        sm_activity_pct: Some(77),
        energy: Some(EnergyInput { delta_mj: 612_345, source: EnergySource::Counter }),
        processes,
        ..Default::default()
    };
    let settings =
        AttributionSettings { price_per_gpu_hour: Some(3.49), idle_reservation_after_s: 0, ..Default::default() };
    let mut a = Attributor::new(&settings);
    a.update(&AttributionInput {
        start_unix_ns: 1_700_000_000_000_000_000,
        interval_ns: 1_000_000_000,
        gpus: vec![gpu],
        containers,
    })
}

/// The numbers of one column, parsed from the table rows between the header and the total.
fn column(out: &str, col: usize) -> (Vec<f64>, f64) {
    let rows: Vec<Vec<&str>> =
        out.lines().filter(|l| l.contains('%') && !l.contains(':')).map(|l| l.split_whitespace().collect()).collect();
    let value = |r: &Vec<&str>| -> Option<f64> {
        let v = r[r.len() - col];
        v.trim_end_matches('%').parse().ok()
    };
    let total = rows.iter().find(|r| r.contains(&"total")).and_then(value).unwrap();
    let parts = rows.iter().filter(|r| !r.contains(&"total")).filter_map(value).collect();
    (parts, total)
}

#[test]
fn thirty_pods_fit_in_80_columns_and_add_up() {
    let s = node(30);
    let out = render_attribution(&s, 80);
    if std::env::var_os("SHOW_TOP").is_some() {
        println!("{out}");
    }
    for line in out.lines() {
        assert!(line.chars().count() <= 80, "too wide ({}): {line}", line.chars().count());
    }
    // One line per container: every name is on a row with its numbers.
    let rows = out.lines().filter(|l| l.contains("ml-team-") && !l.contains(':'));
    assert_eq!(rows.filter(|l| l.contains('%')).count(), 30, "{out}");
    for name in ["driver_reserved", "unattributed", "idle", "free", "total"] {
        assert!(out.lines().any(|l| l.contains(name)), "{name} missing:\n{out}");
    }
    // Columns from the right: COST/h (1), ENERGY (2), SM% (3), MEM% (4).
    for col in 1..=4 {
        let (parts, total) = column(&out, col);
        let sum: f64 = parts.iter().sum();
        assert!((sum - total).abs() < 1e-6, "column {col}: rows sum to {sum}, total says {total}\n{out}");
    }
    let (_, cost) = column(&out, 1);
    assert_eq!(cost, 3.49);
    let (_, energy) = column(&out, 2);
    assert_eq!(energy, 612.3);
    // A whole GPU for a 1g.18gb job: a rightsizing marker and footnote; 1/30 of a GPU is less
    // than the smallest MIG profile: none.
    assert!(out.contains("↓ ml-team-0/"), "{out}");
    assert!(out.contains("→ MIG 1g.18gb (asked 1 GPU)"), "{out}");
    assert!(!out.contains("↓ ml-team-1/"), "{out}");
}

#[test]
fn idle_reservations_are_marked() {
    let mut s = node(2);
    s.containers[0].idle_reservation = Some(tracer_core::attribution::IdleReservation {
        since_unix_ns: s.start_unix_ns - 600_000_000_000,
        held_bytes: GIB,
    });
    let out = render_attribution(&s, 80);
    assert!(out.contains("! ml-team-0/"), "{out}");
    assert!(out.contains("ran nothing for 10 min"), "{out}");
    assert_eq!(duration(59), "59 s");
    assert_eq!(duration(7200), "2 h");
    assert!(out.lines().any(|l| l.contains("ml-team-0/") && l.contains("!↓")), "{out}");
}

#[test]
fn without_price_or_readings_it_says_so() {
    let mut a = Attributor::new(&AttributionSettings::default());
    let s = a.update(&AttributionInput {
        interval_ns: 1_000_000_000,
        gpus: vec![GpuInput { uuid: "GPU-x".into(), ..Default::default() }],
        ..Default::default()
    });
    let out = render_attribution(&s, 80);
    assert!(out.contains("no price configured"), "{out}");
    assert!(out.contains("no memory reading"), "{out}");
    assert!(out.contains("no process on this GPU"), "{out}");
}

/// The bill lines as a person reads them: the printed parts, added up, give the printed total
/// (one precision for the whole line), on a node whose parts are of very different sizes.
#[test]
fn the_printed_bill_adds_up_as_printed() {
    for pods in [1, 3, 30] {
        let out = render_attribution(&node(pods), 200);
        let bill = out.lines().find(|l| l.starts_with("bill so far")).expect("bill line");
        let rest = out.lines().find(|l| l.starts_with("  + idle")).expect("second bill line");
        // `bill so far T = containers C` and `  + idle I + driver reserved D + unattributed U`.
        let numbers: Vec<&str> = bill
            .split_whitespace()
            .chain(rest.split_whitespace())
            .filter(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()))
            .collect();
        assert_eq!(numbers.len(), 5, "{bill}\n{rest}");
        let units = |s: &str| -> (u128, usize) {
            let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
            (format!("{whole}{frac}").parse().unwrap(), frac.len())
        };
        let (total, decimals) = units(numbers[0]);
        let parts: Vec<(u128, usize)> = numbers[1..].iter().map(|n| units(n)).collect();
        assert!(parts.iter().all(|(_, d)| *d == decimals), "one precision: {bill}\n{rest}");
        assert_eq!(parts.iter().map(|(u, _)| u).sum::<u128>(), total, "{bill}\n{rest}");
    }
}

/// The MEMORY column as a person reads it: one unit for the whole column, and the rows above
/// `total` add up to the printed total.
#[test]
fn the_printed_memory_column_adds_up_as_printed() {
    for pods in [1, 3, 30] {
        let out = render_attribution(&node(pods), 200);
        let mut rows = Vec::new();
        let mut total = None;
        for l in out.lines().filter(|l| l.contains('%') && !l.contains(':')) {
            let r: Vec<&str> = l.split_whitespace().collect();
            // From the right: COST/h, ENERGY J, SM%, MEM%, then the memory cell (`7.5 GiB`, `0` or `-`).
            let (value, unit) = match r[r.len() - 5] {
                u @ ("B" | "KiB" | "MiB" | "GiB" | "TiB") => (r[r.len() - 6], Some(u)),
                v => (v, None),
            };
            if value == "-" {
                continue;
            }
            let (whole, frac) = value.split_once('.').unwrap_or((value, ""));
            // The header row (`MEMORY MEM% …`) is not a number.
            let Ok(v) = format!("{whole}{frac}").parse::<u64>() else { continue };
            let tenths = v * if frac.is_empty() { 10 } else { 1 };
            if r.contains(&"total") {
                total = Some((tenths, unit));
            } else {
                rows.push((tenths, unit));
            }
        }
        let (total, unit) = total.expect("a total row");
        assert!(rows.iter().all(|(v, u)| *v == 0 || *u == unit), "one unit:\n{out}");
        assert_eq!(rows.iter().map(|(v, _)| v).sum::<u64>(), total, "\n{out}");
    }
}
