use std::sync::Arc;

use ratatui::{Terminal, backend::TestBackend};
use tracer_core::{
    attribution::{
        AttributionInput, Attributor, ContainerInput, ContainerKey, GpuInput, ProcessInput,
        input::{EnergyInput, EnergySource},
    },
    config::AttributionSettings,
    identity::ContainerIdentity,
    nvml::model::MemoryInfo,
};

use super::*;

const GIB: u64 = 1 << 30;

/// A node with `gpus` GPUs and `pods` pods on each (namespaces `ml` and `serving`), one interval
/// attributed with NVML's readings, energy and a price.
fn node(gpus: u32, pods: u64) -> AgentSnapshot {
    let mut containers = std::collections::BTreeMap::new();
    let mut identities = std::collections::BTreeMap::new();
    let mut inputs = Vec::new();
    for g in 0..gpus {
        let mut processes = Vec::new();
        for i in 0..pods {
            let id = 1000 + u64::from(g) * 100 + i;
            let ns = if i % 2 == 0 { "ml" } else { "serving" };
            let name = format!("{ns}/job-{g}-{i}/main");
            containers.insert(ContainerKey(id), ContainerInput { name: Some(name), request: None });
            identities.insert(
                id,
                ContainerIdentity {
                    cgroup_id: id,
                    namespace: Some(ns.into()),
                    pod: Some(format!("job-{g}-{i}")),
                    container: Some("main".into()),
                    ..Default::default()
                },
            );
            processes.push(ProcessInput {
                pid: 100 + id as u32,
                container: Some(ContainerKey(id)),
                // Uneven sizes: rounding each line to MiB alone would not add up.
                nvml_used_bytes: Some((i + 1) * GIB / 3 + 12_345),
                nvml_sm_pct: Some(3.0 + i as f64 * 1.37),
                ..Default::default()
            });
        }
        inputs.push(GpuInput {
            uuid: format!("GPU-{g}1111111-2222-3333-4444-555555555555"),
            index: Some(g),
            name: Some("NVIDIA H200".into()),
            share_of_gpu_ppm: 1_000_000,
            memory: Some(MemoryInfo { total: 140 * GIB, reserved: GIB / 2, used: 60 * GIB, free: 79 * GIB + GIB / 2 }),
            sm_activity_pct: Some(77),
            energy: Some(EnergyInput { delta_mj: 612_345, source: EnergySource::Counter }),
            processes,
            ..Default::default()
        });
    }
    let settings =
        AttributionSettings { price_per_gpu_hour: Some(3.49), idle_reservation_after_s: 0, ..Default::default() };
    let mut a = Attributor::new(&settings);
    let attribution = a.update(&AttributionInput {
        start_unix_ns: 1_700_000_000_000_000_000,
        interval_ns: 1_000_000_000,
        gpus: inputs,
        containers,
    });
    AgentSnapshot { attribution: Some(Arc::new(attribution)), containers: identities, ..Default::default() }
}

fn screen(s: &AgentSnapshot, v: &mut View, w: u16, h: u16) -> Vec<String> {
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    t.draw(|f| draw(f, Some(s), v)).unwrap();
    let b = t.backend().buffer().clone();
    (0..h).map(|y| (0..w).map(|x| b[(x, y)].symbol().to_string()).collect::<String>()).collect()
}

/// The pod block: each numeric column (memory, SM, power, cost), cut at the header's offsets,
/// for the rows between the header and the total row, and the total row's.
fn block(lines: &[String]) -> (Vec<[f64; 4]>, [f64; 4]) {
    let start = lines.iter().position(|l| l.contains("POD (namespace/pod/container)")).expect("the pod header");
    let header: Vec<char> = lines[start].chars().collect();
    let find = |name: &str| -> usize {
        let h: String = header.iter().collect();
        h.find(name).map(|byte| h[..byte].chars().count()).unwrap_or_else(|| panic!("no {name} column"))
    };
    let cols = [find("MEM MiB"), find("SM %"), find("W "), find("COST/h")];
    let ends = [cols[1], cols[2], cols[3], cols[3] + 8];
    let cells = |l: &str| -> [f64; 4] {
        let c: Vec<char> = l.chars().collect();
        std::array::from_fn(|i| {
            let cell: String = c[cols[i].min(c.len())..ends[i].min(c.len())].iter().collect();
            cell.trim().parse::<f64>().unwrap_or(0.0)
        })
    };
    let mut rows = Vec::new();
    for l in &lines[start + 1..] {
        if l.trim_start().starts_with("total ") {
            return (rows, cells(l));
        }
        rows.push(cells(l));
    }
    panic!("no total row:\n{}", lines.join("\n"));
}

/// Each numeric column adds up to the total row, exactly as printed; the rows above it.
fn adds_up(lines: &[String]) -> usize {
    let (rows, total) = block(lines);
    for col in 0..4 {
        let sum: f64 = rows.iter().map(|r| r[col]).sum();
        assert!(
            (sum - total[col]).abs() < 1e-6 && total[col] > 0.0,
            "column {col}: {sum} printed vs total {}:\n{}",
            total[col],
            lines.join("\n")
        );
    }
    rows.len()
}

#[test]
fn printed_columns_add_up_and_two_gpus_fit_80x24() {
    let s = node(2, 5);
    let mut v = View::new("test".into(), Duration::from_secs(1));
    let lines = screen(&s, &mut v, 80, 24);
    let text = lines.join("\n");
    println!("{text}");
    // Both GPUs, then GPU 0's block: 5 pods, 3 remainder lines, all adding up.
    assert!(text.contains(">0") && lines.iter().any(|l| l.trim_start().starts_with("1 ")), "{text}");
    assert!(text.contains("GPU 0 · NVIDIA H200"), "{text}");
    assert_eq!(adds_up(&lines), 8, "{text}");
    assert!(text.contains("143360"), "the memory total (140 GiB in MiB):\n{text}");
    // The GPU row's used/total is the block's: total − free.
    assert!(text.contains("62976/143360") || text.contains("/143360"), "{text}");
    // ↓ chooses GPU 1.
    v.key(KeyEvent::from(KeyCode::Down));
    let lines = screen(&s, &mut v, 80, 24);
    assert!(lines.join("\n").contains("GPU 1 · NVIDIA H200"));
    adds_up(&lines);
}

#[test]
fn many_pods_and_gpus_still_fit_and_add_up() {
    // 8 GPUs × 30 pods at 80×24: the pods that do not fit are one line with their sums.
    let s = node(8, 30);
    let mut v = View::new("test".into(), Duration::from_secs(1));
    let lines = screen(&s, &mut v, 80, 24);
    let text = lines.join("\n");
    println!("{text}");
    assert!(text.contains("more (PgUp/PgDn)"), "{text}");
    adds_up(&lines);
    v.key(KeyEvent::from(KeyCode::PageDown));
    adds_up(&screen(&s, &mut v, 80, 24));
    // 200×50: all eight GPUs and more pods, with launches and PIDs.
    let lines = screen(&s, &mut v, 200, 50);
    let text = lines.join("\n");
    for g in 0..8 {
        assert!(
            lines.iter().any(|l| l.trim_start().trim_start_matches('>').starts_with(&format!("{g} "))),
            "GPU {g}:\n{text}"
        );
    }
    assert!(text.contains("LAUNCHES") && text.contains("PIDS"), "{text}");
    adds_up(&lines);
}

#[test]
fn a_namespace_filter_keeps_the_totals() {
    let s = node(1, 6);
    let mut v = View::new("test".into(), Duration::from_secs(1));
    for k in [KeyCode::Char('n'), KeyCode::Char('m'), KeyCode::Char('l'), KeyCode::Enter] {
        assert!(v.key(KeyEvent::from(k)));
    }
    assert_eq!(v.namespace.as_deref(), Some("ml"));
    let lines = screen(&s, &mut v, 80, 24);
    let text = lines.join("\n");
    assert!(text.contains("ns=ml") && text.contains("other namespaces (3 pods)"), "{text}");
    assert!(!text.contains("serving/"), "{text}");
    assert_eq!(adds_up(&lines), 3 + 1 + 3, "{text}");
}

#[test]
fn keys_sort_pause_help_details_and_quit() {
    let s = node(1, 3);
    let mut v = View::new("test".into(), Duration::from_secs(1));
    v.key(KeyEvent::from(KeyCode::Char('s')));
    assert_eq!(v.sort, SortKey::Sm);
    v.key(KeyEvent::from(KeyCode::Char('p')));
    assert!(screen(&s, &mut v, 80, 24)[0].contains("PAUSED"));
    v.key(KeyEvent::from(KeyCode::Char('?')));
    assert!(screen(&s, &mut v, 80, 24).join("\n").contains("filter by namespace"));
    v.key(KeyEvent::from(KeyCode::Char('x')));
    assert!(!v.help);
    v.key(KeyEvent::from(KeyCode::Char('d')));
    assert!(v.details);
    assert!(v.key(KeyEvent::from(KeyCode::Esc)) && !v.details);
    assert!(!v.key(KeyEvent::from(KeyCode::Char('q'))));
    assert!(!v.key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)));
}

#[test]
fn apportioned_parts_add_up_to_the_rounded_total() {
    for values in [vec![1u128, 1, 1], vec![1_048_575, 1_048_577, 3], vec![0, 0], vec![5_000_000, 1, 2, 999_999]] {
        let (parts, total) = apportion(&values, 1 << 20);
        assert_eq!(parts.iter().sum::<u128>(), total, "{values:?}");
        assert_eq!(total, (values.iter().sum::<u128>() + (1 << 19)) / (1 << 20));
    }
}
