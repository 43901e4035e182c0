//! Attribution tests: examples a user would check by hand, and property tests that every line adds
//! up exactly whatever the input.
use crate::attribution::gpu::attribute_gpu;
use std::collections::BTreeMap;

use proptest::prelude::*;

use super::{
    gpu::{ComputeMethod, CostBasis, FULL, GpuAttribution, MemorySource},
    input::{EnergyInput, EnergySource},
    rightsizing::Fit,
    *,
};
use crate::{
    config::{AttributionSettings, CostPolicy, UnusedCost},
    nvml::model::{
        DeviceSample, GpuProcess, MemoryInfo, MigInstance, Missing, NvmlSample, ProcessUtilization, Utilization,
    },
};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const SEC: u64 = 1_000_000_000;

fn proc(pid: u32, container: Option<u64>, used: Option<u64>, sm: Option<f64>) -> ProcessInput {
    ProcessInput {
        pid,
        container: container.map(ContainerKey),
        nvml_used_bytes: used,
        nvml_sm_pct: sm,
        ..Default::default()
    }
}

fn settings(price: Option<f64>, policy: CostPolicy, unused: UnusedCost) -> AttributionSettings {
    AttributionSettings { price_per_gpu_hour: price, cost_policy: policy, unused_cost: unused, ..Default::default() }
}

/// Every line of one GPU adds up exactly.
fn check_gpu(g: &GpuAttribution) {
    if let Some(m) = &g.memory {
        let sum: u128 = g.containers.iter().map(|c| c.memory_bytes as u128).sum::<u128>()
            + m.driver_reserved as u128
            + m.unattributed as u128
            + m.free as u128;
        assert_eq!(sum, m.total as u128, "memory lines of {}", g.uuid);
        let d = m.unattributed_detail;
        assert_eq!(d.host_processes + d.mps_server + d.other, m.unattributed);
    }
    let c = &g.compute;
    let sum: u64 =
        g.containers.iter().map(|c| c.sm_millipct as u64).sum::<u64>() + c.unattributed as u64 + c.idle as u64;
    assert_eq!(sum, FULL as u64, "compute lines of {}", g.uuid);
    if let Some(e) = &g.energy {
        let sum: u128 = g.containers.iter().map(|c| c.energy_mj.unwrap() as u128).sum::<u128>()
            + e.unattributed as u128
            + e.idle as u128;
        assert_eq!(sum, e.delta_mj as u128, "energy lines of {}", g.uuid);
    }
    if let Some(k) = &g.cost {
        let sum: u128 = g.containers.iter().map(|c| c.cost_nano.unwrap() as u128).sum::<u128>()
            + k.idle as u128
            + k.driver_reserved as u128
            + k.unattributed as u128;
        assert_eq!(sum, k.price_nano as u128, "cost lines of {}", g.uuid);
    }
}

/// The bill so far adds up: kept containers + the lines = total.
fn check_bill(a: &Attributor, s: &AttributionSnapshot) {
    let b = s.bill;
    let containers: u128 = s.containers.iter().map(|c| c.cumulative_cost_nano as u128).sum();
    assert_eq!(containers, a.containers_cost());
    assert_eq!(
        containers + b.idle as u128 + b.driver_reserved as u128 + b.unattributed as u128 + b.evicted as u128,
        b.total as u128,
        "bill so far"
    );
}

fn line(g: &GpuAttribution, k: u64) -> &gpu::ContainerLine {
    g.containers.iter().find(|c| c.container == ContainerKey(k)).expect("container line")
}

fn three_pods() -> AttributionInput {
    let gpu = GpuInput {
        uuid: "GPU-11111111-2222-3333-4444-555555555555".into(),
        index: Some(0),
        name: Some("NVIDIA A100-SXM4-80GB".into()),
        share_of_gpu_ppm: 1_000_000,
        // v2 semantics: total = reserved + used + free.
        memory: Some(MemoryInfo {
            total: 80 * GIB,
            reserved: 512 * MIB,
            used: 36 * GIB,
            free: 80 * GIB - 512 * MIB - 36 * GIB,
        }),
        sm_activity_pct: Some(85),
        energy: Some(EnergyInput { delta_mj: 100_000, source: EnergySource::Counter }),
        processes: vec![
            proc(101, Some(1), Some(20 * GIB), Some(50.0)),
            proc(102, Some(2), Some(10 * GIB), Some(20.0)),
            proc(103, Some(3), Some(5 * GIB), Some(10.0)),
        ],
        ..Default::default()
    };
    let containers = [(1, "team-a/train-0"), (2, "team-b/serve-1"), (3, "team-c/notebook")]
        .into_iter()
        .map(|(k, n)| (ContainerKey(k), ContainerInput { name: Some(n.into()), request: None }))
        .collect();
    AttributionInput { start_unix_ns: 1_700_000_000 * SEC, interval_ns: SEC, gpus: vec![gpu], containers }
}

#[test]
fn three_containers_time_slicing_one_80_gib_gpu() {
    // 3.60 per GPU-hour: one second costs 0.001 = 1 000 000 nano.
    let mut a = Attributor::new(&settings(Some(3.6), CostPolicy::MemoryTime, UnusedCost::Lines));
    let s = a.update(&three_pods());
    let g = &s.gpus[0];
    check_gpu(g);
    assert_eq!(g.sharing, SharingMode::TimeSlicing, "{}", g.sharing_reason);
    assert_eq!(g.compute.method, ComputeMethod::ProcessSamples);
    // Memory: 20 + 10 + 5 GiB to the pods; 1 GiB used by nobody (contexts); 0.5 GiB reserved.
    let m = g.memory.unwrap();
    assert_eq!(
        [line(g, 1).memory_bytes, line(g, 2).memory_bytes, line(g, 3).memory_bytes],
        [20 * GIB, 10 * GIB, 5 * GIB]
    );
    assert_eq!(m.driver_reserved, 512 * MIB);
    assert_eq!(m.unattributed, GIB);
    assert_eq!(m.unattributed_detail.other, GIB);
    assert_eq!(m.free, 80 * GIB - 512 * MIB - 36 * GIB);
    assert!(!m.scaled_down && !m.inconsistent);
    assert_eq!(line(g, 1).memory_source, MemorySource::Nvml);
    // Compute: 50 / 20 / 10 %, the device saw 85 % busy: 5 % unattributed, 15 % idle.
    assert_eq!([line(g, 1).sm_millipct, line(g, 2).sm_millipct, line(g, 3).sm_millipct], [50_000, 20_000, 10_000]);
    assert_eq!((g.compute.unattributed, g.compute.idle), (5_000, 15_000));
    // Energy: 100 J split the same way.
    let e = g.energy.unwrap();
    assert_eq!(
        [line(g, 1).energy_mj, line(g, 2).energy_mj, line(g, 3).energy_mj],
        [Some(50_000), Some(20_000), Some(10_000)]
    );
    assert_eq!((e.unattributed, e.idle), (5_000, 15_000));
    // Cost by memory-time: 20/80, 10/80, 5/80 of the second's price; free memory is idle.
    let c = g.cost.unwrap();
    assert_eq!(c.price_nano, 1_000_000);
    assert_eq!(c.basis, CostBasis::MemoryTime);
    assert_eq!(
        [line(g, 1).cost_nano, line(g, 2).cost_nano, line(g, 3).cost_nano],
        [Some(250_000), Some(125_000), Some(62_500)]
    );
    assert_eq!((c.driver_reserved, c.unattributed, c.idle), (6_250, 12_500, 543_750));
    assert_eq!(format_currency(s.bill.total), "0.0010");
    check_bill(&a, &s);
    // An hour of seconds is exactly 3.60.
    let mut input = three_pods();
    for i in 1..3600 {
        input.start_unix_ns += SEC;
        let s = a.update(&input);
        if i % 600 == 0 {
            check_bill(&a, &s);
        }
    }
    let s = a.update(&AttributionInput { interval_ns: 0, ..input });
    assert_eq!(s.bill.total, 3_600_000_000);
    assert_eq!(format_currency(s.bill.total), "3.60");
    let team_a = s.containers.iter().find(|c| c.container == ContainerKey(1)).unwrap();
    assert_eq!(team_a.cumulative_cost_nano, 900_000_000);
    check_bill(&a, &s);
}

#[test]
fn policies_and_spreading() {
    let input = three_pods();
    let run = |policy, unused| {
        let mut a = Attributor::new(&AttributionSettings {
            price_per_node_hour: Some(3.6),
            cost_policy: policy,
            unused_cost: unused,
            blend_memory_weight: 0.5,
            ..Default::default()
        });
        let s = a.update(&input);
        check_gpu(&s.gpus[0]);
        check_bill(&a, &s);
        s.gpus[0].clone()
    };
    // Compute-time: 50/20/10 % of the price; idle 15 %, unattributed 5 %.
    let g = run(CostPolicy::ComputeTime, UnusedCost::Lines);
    assert_eq!(line(&g, 1).cost_nano, Some(500_000));
    assert_eq!((g.cost.unwrap().idle, g.cost.unwrap().unattributed), (150_000, 50_000));
    // Spread: the three pods pay everything, 50:20:10.
    let g = run(CostPolicy::ComputeTime, UnusedCost::Spread);
    assert_eq!(
        [line(&g, 1).cost_nano, line(&g, 2).cost_nano, line(&g, 3).cost_nano],
        [Some(625_000), Some(250_000), Some(125_000)]
    );
    // Blended 50/50: (250 000 + 500 000) / 2 for team a... each half split on its own.
    let g = run(CostPolicy::Blended, UnusedCost::Lines);
    assert_eq!(g.cost.unwrap().basis, CostBasis::Blended);
    assert_eq!(line(&g, 1).cost_nano, Some(125_000 + 250_000));
    // Request-based without requests falls back to memory-time, and says so.
    let g = run(CostPolicy::RequestBased, UnusedCost::Lines);
    assert_eq!(g.cost.unwrap().basis, CostBasis::MemoryTime);
    // With requests: 1/2, 1/4, 1/8 of the GPU; 1/8 nobody asked for is idle.
    let mut input = three_pods();
    input.gpus[0].requested_fraction =
        [(1, 0.5), (2, 0.25), (3, 0.125)].into_iter().map(|(k, f)| (ContainerKey(k), f)).collect();
    let mut a = Attributor::new(&settings(Some(3.6), CostPolicy::RequestBased, UnusedCost::Lines));
    let g = &a.update(&input).gpus[0];
    check_gpu(g);
    assert_eq!(
        [line(g, 1).cost_nano, line(g, 2).cost_nano, line(g, 3).cost_nano],
        [Some(500_000), Some(250_000), Some(125_000)]
    );
    assert_eq!(g.cost.unwrap().idle, 125_000);
}

#[test]
fn mps_server_memory_is_unattributed_and_launches_split_compute() {
    let gpu = GpuInput {
        uuid: "GPU-aaaaaaaa".into(),
        share_of_gpu_ppm: 1_000_000,
        memory: Some(MemoryInfo { total: 80 * GIB, reserved: 0, used: 8 * GIB + 27 * MIB, free: 72 * GIB - 27 * MIB }),
        sm_activity_pct: Some(60),
        processes: vec![
            ProcessInput { pid: 50, is_mps_server: true, nvml_used_bytes: Some(27 * MIB), ..Default::default() },
            proc(51, Some(1), Some(6 * GIB), None),
            proc(52, Some(2), Some(2 * GIB), None),
        ],
        launches: [(ContainerKey(1), 300), (ContainerKey(2), 100)].into_iter().collect(),
        ..Default::default()
    };
    let g = attribute_gpu(&gpu, &|_| None, None);
    check_gpu(&g);
    assert_eq!(g.sharing, SharingMode::Mps, "{}", g.sharing_reason);
    assert!(g.sharing_reason.contains("pid 50"));
    assert_eq!(g.memory.unwrap().unattributed_detail.mps_server, 27 * MIB);
    assert_eq!(g.compute.method, ComputeMethod::LaunchCounts);
    assert_eq!((line(&g, 1).sm_millipct, line(&g, 2).sm_millipct), (45_000, 15_000));
    assert_eq!((g.compute.unattributed, g.compute.idle), (0, 40_000));
}

#[test]
fn a_host_process_is_unattributed() {
    let gpu = GpuInput {
        uuid: "GPU-bbbbbbbb".into(),
        share_of_gpu_ppm: 1_000_000,
        memory: Some(MemoryInfo { total: 16 * GIB, reserved: 0, used: 6 * GIB, free: 10 * GIB }),
        sm_activity_pct: Some(30),
        processes: vec![proc(1, Some(7), Some(4 * GIB), Some(20.0)), proc(2, None, Some(2 * GIB), Some(10.0))],
        ..Default::default()
    };
    let g = attribute_gpu(&gpu, &|_| None, None);
    check_gpu(&g);
    assert_eq!(g.sharing, SharingMode::TimeSlicing);
    let m = g.memory.unwrap();
    assert_eq!((m.unattributed_detail.host_processes, m.unattributed), (2 * GIB, 2 * GIB));
    assert_eq!((g.compute.unattributed, g.compute.idle), (10_000, 70_000));
    assert_eq!(g.containers.len(), 1);
}

#[test]
fn processes_over_used_are_scaled_down_and_flagged() {
    let gpu = GpuInput {
        uuid: "GPU-c".into(),
        memory: Some(MemoryInfo { total: 10 * GIB, reserved: GIB, used: 4 * GIB, free: 5 * GIB }),
        processes: vec![proc(1, Some(1), Some(6 * GIB), Some(80.0)), proc(2, Some(2), Some(2 * GIB), Some(70.0))],
        ..Default::default()
    };
    let g = attribute_gpu(&gpu, &|_| None, None);
    check_gpu(&g);
    let m = g.memory.unwrap();
    assert!(m.scaled_down);
    assert_eq!((line(&g, 1).memory_bytes, line(&g, 2).memory_bytes), (3 * GIB, GIB));
    // 150 % of samples: clamped to 100 in proportion.
    assert!(g.compute.clamped);
    assert_eq!(line(&g, 1).sm_millipct + line(&g, 2).sm_millipct, FULL);
}

/// An H200 with MIG: two instances, processes of three containers, no utilization.
fn mig_sample(energy_mj: u64, mono: u64) -> NvmlSample {
    let inst = |i: u32, profile: &str, mem: u64, pids: &[u32]| MigInstance {
        index: i,
        uuid: format!("MIG-{i}000000-0000"),
        name: Some(format!("NVIDIA H200 MIG {profile}")),
        memory: Some(MemoryInfo {
            total: mem,
            reserved: 0,
            used: pids.len() as u64 * GIB,
            free: mem - pids.len() as u64 * GIB,
        }),
        processes: pids
            .iter()
            .map(|&pid| GpuProcess { pid, used_bytes: Some(GIB), compute: true, ..Default::default() })
            .collect(),
        ..Default::default()
    };
    NvmlSample {
        taken_unix_ns: 1_700_000_000 * SEC + mono,
        taken_mono_ns: mono,
        devices: vec![DeviceSample {
            index: 0,
            uuid: "GPU-h200".into(),
            name: Some("NVIDIA H200".into()),
            minor: Some(0),
            memory: Some(MemoryInfo {
                total: 143_771 * MIB,
                reserved: 0,
                used: 3 * GIB,
                free: 143_771 * MIB - 3 * GIB,
            }),
            energy_mj: Some(energy_mj),
            mig_enabled: Some(true),
            mig_instances: vec![inst(0, "3g.71gb", 71 * GIB, &[10, 11]), inst(1, "1g.18gb", 17 * GIB, &[20])],
            missing: vec![Missing { what: "utilization".into(), reason: "NotSupported".into() }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn owner(pid: u32) -> Option<ProcessOwner> {
    let k = match pid {
        10 => 1,
        11 => 2,
        20 => 3,
        _ => return None,
    };
    Some(ProcessOwner {
        container: Some(ContainerKey(k)),
        display_name: Some(format!("pod-{k}")),
        is_mps_server: false,
    })
}

#[test]
fn mig_instances_use_launch_counts() {
    let prev = mig_sample(1_000_000, SEC);
    let cur = mig_sample(1_000_000 + 70_000, 2 * SEC);
    let launches = [(ContainerKey(1), 750), (ContainerKey(2), 250), (ContainerKey(3), 10)].into_iter().collect();
    let input = input_from_sample(&cur, Some(&prev), owner, |_, _| ProcessLedgers::default(), &launches);
    assert_eq!(input.interval_ns, SEC);
    // Two instances and the 3 slices with no instance.
    assert_eq!(input.gpus.len(), 3);
    assert_eq!(input.gpus.iter().map(|g| g.share_of_gpu_ppm).sum::<u32>(), 1_000_000);
    assert_eq!(input.gpus.iter().map(|g| g.energy.unwrap().delta_mj).sum::<u64>(), 70_000);
    assert_eq!(input.gpus[0].mig_profile.as_deref(), Some("3g.71gb"));
    assert_eq!(input.containers[&ContainerKey(1)].name.as_deref(), Some("pod-1"));
    let mut a = Attributor::new(&settings(Some(7.2), CostPolicy::ComputeTime, UnusedCost::Lines));
    let s = a.update(&input);
    for g in &s.gpus {
        check_gpu(g);
        assert_eq!(g.sharing, SharingMode::Mig, "{}", g.sharing_reason);
    }
    let big = &s.gpus[0];
    assert_eq!(big.compute.method, ComputeMethod::LaunchCounts);
    assert_eq!((line(big, 1).sm_millipct, line(big, 2).sm_millipct), (75_000, 25_000));
    // 3/7 of a 7.20 GPU-hour for one second: 0.000857142 (rounded down over the hour).
    assert_eq!(big.cost.unwrap().price_nano, 857_142);
    assert_eq!(s.gpus[1].containers.len(), 1);
    assert_eq!(s.gpus[2].compute.idle, FULL, "unpartitioned slices run nothing");
    check_bill(&a, &s);
    assert_eq!(s.bill.total, 2_000_000, "7.20 / 3600 = 0.002");
}

#[test]
fn adapter_energy_reset_power_and_process_samples() {
    let dev = |energy: Option<u64>, power: Option<u32>| DeviceSample {
        uuid: "GPU-x".into(),
        memory: Some(MemoryInfo { total: 10 * GIB, reserved: 0, used: 2 * GIB, free: 8 * GIB }),
        utilization: Some(Utilization { gpu_pct: 40, memory_pct: 5 }),
        energy_mj: energy,
        power_mw: power,
        processes: vec![
            GpuProcess { pid: 7, used_bytes: Some(GIB), ..Default::default() },
            GpuProcess { pid: 8, ..Default::default() },
        ],
        process_utilization: vec![
            ProcessUtilization { pid: 7, sm_pct: 30, ..Default::default() },
            ProcessUtilization { pid: 7, sm_pct: 10, ..Default::default() },
        ],
        ..Default::default()
    };
    let sample =
        |d: DeviceSample, mono: u64| NvmlSample { taken_mono_ns: mono, devices: vec![d], ..Default::default() };
    let own = |pid: u32| Some(ProcessOwner { container: Some(ContainerKey(pid as u64)), ..Default::default() });
    let none = BTreeMap::new();
    let led = |pid: u32, _| ProcessLedgers { driver_bytes: Some(pid as u64 * MIB), cuda_bytes: None };
    // Counter went backwards: the new reading is the energy since the reset.
    let i = input_from_sample(
        &sample(dev(Some(500), None), 2 * SEC),
        Some(&sample(dev(Some(9_000), None), SEC)),
        own,
        led,
        &none,
    );
    assert_eq!(i.gpus[0].energy, Some(EnergyInput { delta_mj: 500, source: EnergySource::CounterReset }));
    // No counter: mean power × time, 2 s of 150 W = 300 J.
    let i = input_from_sample(
        &sample(dev(None, Some(100_000)), 3 * SEC),
        Some(&sample(dev(None, Some(200_000)), SEC)),
        own,
        led,
        &none,
    );
    assert_eq!(i.gpus[0].energy, Some(EnergyInput { delta_mj: 300_000, source: EnergySource::PowerTimesInterval }));
    // Process samples averaged per PID; a listed PID without samples was idle (0).
    let p = &i.gpus[0].processes;
    assert_eq!((p[0].nvml_sm_pct, p[1].nvml_sm_pct), (Some(20.0), Some(0.0)));
    assert_eq!(p[1].driver_ledger_bytes, Some(8 * MIB));
    // PID 8 has no NVML figure: its memory comes from the driver ledger.
    let g = attribute_gpu(&i.gpus[0], &|_| None, None);
    assert_eq!(line(&g, 8).memory_source, MemorySource::DriverLedger);
    assert_eq!(line(&g, 8).memory_bytes, 8 * MIB);
    // First sample: a zero-length interval and no energy.
    let i = input_from_sample(&sample(dev(Some(1), None), SEC), None, own, led, &none);
    assert_eq!((i.interval_ns, i.gpus[0].energy), (0, None));
}

#[test]
fn idle_reservation_and_rightsizing() {
    let s = AttributionSettings { idle_reservation_after_s: 10, rightsizing_window_s: 120, ..Default::default() };
    let mut a = Attributor::new(&s);
    let mut input = three_pods();
    input.containers.get_mut(&ContainerKey(3)).unwrap().request = Some(GpuRequest::WholeGpus { count: 1 });
    // Container 3 holds 5 GiB and runs nothing from now on.
    input.gpus[0].processes[2].nvml_sm_pct = Some(0.0);
    let mut last = None;
    for i in 0..12 {
        input.start_unix_ns = 1_700_000_000 * SEC + i * SEC;
        last = Some(a.update(&input));
        let c3 = &last.as_ref().unwrap().containers[2];
        assert_eq!(c3.idle_reservation.is_some(), i >= 9, "after {} s", i + 1);
    }
    let s = last.unwrap();
    let c3 = &s.containers[2];
    assert_eq!(c3.idle_reservation.unwrap().held_bytes, 5 * GIB);
    let r = c3.rightsizing.as_ref().unwrap();
    assert_eq!(r.peak_memory_bytes, 5 * GIB);
    // 80 GiB A100: 5 GiB + 20 % fits 1g.10gb, much less than the whole GPU it asked for.
    assert_eq!(r.fit, Fit::MigProfile { profile: "1g.10gb".into() });
    assert!(r.over_requested);
    // It runs again: the flag clears.
    input.gpus[0].processes[2].nvml_sm_pct = Some(5.0);
    input.start_unix_ns += SEC;
    assert!(a.update(&input).containers[2].idle_reservation.is_none());
}

#[test]
fn containers_are_bounded_and_the_bill_still_adds_up() {
    let mut a = Attributor::with_max_containers(&settings(Some(1.0), CostPolicy::MemoryTime, UnusedCost::Lines), 16);
    let mut s = None;
    for i in 0..26 {
        let gpu = GpuInput {
            uuid: "GPU-z".into(),
            share_of_gpu_ppm: 1_000_000,
            memory: Some(MemoryInfo { total: 10 * GIB, reserved: 0, used: GIB, free: 9 * GIB }),
            processes: vec![proc(1, Some(i), Some(GIB), Some(10.0))],
            ..Default::default()
        };
        s = Some(a.update(&AttributionInput {
            start_unix_ns: i * SEC,
            interval_ns: SEC,
            gpus: vec![gpu],
            ..Default::default()
        }));
    }
    let s = s.unwrap();
    assert_eq!(s.containers.len(), 16);
    assert_eq!(s.counters.evicted_containers, 10);
    assert!(s.bill.evicted > 0);
    check_bill(&a, &s);
}

/// A printed amount in units of its last decimal, and how many decimals it has.
fn printed_units(s: &str) -> (u128, usize) {
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    (format!("{whole}{frac}").parse().unwrap(), frac.len())
}

#[test]
fn a_total_and_its_parts_are_printed_with_one_precision_and_add_up() {
    // The line the issue was filed on: 0.0018 + 0.02 + 0.0002 printed under a total of 0.03.
    let (total, parts) = format_currency_parts(26_000_000, &[1_800_000, 24_000_000, 200_000, 0]);
    assert_eq!(total, "0.0260");
    assert_eq!(parts, ["0.0018", "0.0240", "0.0002", "0.0000"]);
    // Rounding: the parts are split from the printed total, not rounded one by one.
    let (total, parts) = format_currency_parts(3_000_000_000, &[1_000_000_000; 3]);
    assert_eq!(total, "3.00");
    assert_eq!(parts, ["1.00", "1.00", "1.00"]);
    let (total, parts) = format_currency_parts(20_000_000, &[6_666_667, 6_666_667, 6_666_666]);
    assert_eq!(total, "0.0200");
    assert_eq!(parts.iter().map(|p| printed_units(p).0).sum::<u128>(), 200);
    // Nothing at all.
    assert_eq!(format_currency_parts(0, &[0, 0]), ("0.000000".to_string(), vec!["0.000000".to_string(); 2]));
}

#[test]
fn currency_formatting() {
    assert_eq!(format_currency(3_600_000_000), "3.60");
    assert_eq!(format_currency(1_000_000), "0.0010");
    assert_eq!(format_currency(999), "0.000001");
    assert_eq!(format_currency(0), "0.000000");
    assert_eq!(format_fixed(1_234_567_890, 2), "1.23");
    assert_eq!(format_fixed(1_235_000_000, 2), "1.24");
}

// ---------------------------------------------------------------------------------------------
// Property tests: garbage in, exact sums out, never a panic.

fn arb_memory() -> impl Strategy<Value = Option<MemoryInfo>> {
    prop::option::of((any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>(), 0u64..(200 * GIB)).prop_map(
        |(a, b, c, d, sane)| {
            // Half garbage, half near-consistent.
            if a % 2 == 0 {
                MemoryInfo { total: a, reserved: b, free: c, used: d }
            } else {
                let reserved = b % (sane / 8 + 1);
                let used = c % (sane - reserved + 1);
                MemoryInfo { total: sane, reserved, used, free: sane - reserved - used }
            }
        },
    ))
}

fn arb_process() -> impl Strategy<Value = ProcessInput> {
    (
        0u32..50,
        prop::option::of(0u64..12),
        prop::bool::weighted(0.1),
        prop::option::of(prop_oneof![any::<u64>(), 0u64..(40 * GIB)]),
        prop::option::of(prop_oneof![any::<f64>(), 0.0f64..120.0]),
        prop::option::of(any::<u64>()),
        prop::option::of(any::<u64>()),
    )
        .prop_map(|(pid, c, mps, used, sm, d, cu)| ProcessInput {
            pid,
            container: c.map(ContainerKey),
            is_mps_server: mps,
            nvml_used_bytes: used,
            nvml_sm_pct: sm,
            driver_ledger_bytes: d,
            cuda_ledger_bytes: cu,
        })
}

fn arb_gpu() -> impl Strategy<Value = GpuInput> {
    (
        0u32..4,
        prop::option::of("[1-7]g\\.[0-9]{1,3}gb"),
        0u32..=1_000_000,
        arb_memory(),
        prop::option::of(0u32..300),
        prop::option::of(any::<u64>()),
        prop::collection::vec(arb_process(), 0..12),
        prop::collection::btree_map((0u64..14).prop_map(ContainerKey), any::<u64>(), 0..6),
        prop::collection::btree_map((0u64..14).prop_map(ContainerKey), any::<f64>(), 0..4),
    )
        .prop_map(|(id, profile, share, memory, activity, energy, processes, launches, requested)| GpuInput {
            uuid: format!("GPU-{id}"),
            parent_uuid: profile.as_ref().map(|_| "GPU-parent".into()),
            mig_profile: profile,
            share_of_gpu_ppm: share,
            memory,
            sm_activity_pct: activity,
            energy: energy.map(|delta_mj| EnergyInput { delta_mj, source: EnergySource::Counter }),
            processes,
            launches,
            requested_fraction: requested,
            ..Default::default()
        })
}

fn arb_policy() -> impl Strategy<Value = (CostPolicy, UnusedCost, f64)> {
    (
        prop_oneof![
            Just(CostPolicy::MemoryTime),
            Just(CostPolicy::ComputeTime),
            Just(CostPolicy::Blended),
            Just(CostPolicy::RequestBased)
        ],
        prop_oneof![Just(UnusedCost::Lines), Just(UnusedCost::Spread)],
        prop_oneof![any::<f64>(), 0.0f64..1.0],
    )
}

proptest! {
    /// Whatever the amounts, the printed parts add up to the printed total, all with one
    /// precision, each within one printed unit of its exact amount.
    #[test]
    fn printed_parts_add_up_to_the_printed_total(parts in prop::collection::vec(0u64..2_000_000_000_000, 1..8)) {
        let total: u64 = parts.iter().sum();
        let (t, ps) = format_currency_parts(total, &parts);
        let (t_units, decimals) = printed_units(&t);
        let mut sum = 0u128;
        for (p, exact) in ps.iter().zip(&parts) {
            let (units, d) = printed_units(p);
            prop_assert_eq!(d, decimals, "{} vs {}", p, t);
            let unit = 10u128.pow(9 - decimals as u32);
            prop_assert!((units * unit).abs_diff(*exact as u128) < 2 * unit, "{} for {}", p, exact);
            sum += units;
        }
        prop_assert_eq!(sum, t_units, "{:?} under {}", ps, t);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn every_gpu_adds_up(gpu in arb_gpu(), price in any::<u64>(), (policy, unused, w) in arb_policy()) {
        let blend = if w.is_finite() { (w.clamp(0.0, 1.0) * 1e6) as u32 } else { 0 };
        let cost = gpu::CostParams { price_nano: price, policy, blend_memory_ppm: blend, unused };
        let g = attribute_gpu(&gpu, &|k| Some(format!("c{}", k.0)), Some(cost));
        check_gpu(&g);
        // Nothing above its total.
        for c in &g.containers {
            prop_assert!(c.sm_millipct <= FULL);
            if let Some(m) = &g.memory { prop_assert!(c.memory_bytes <= m.total); }
        }
    }

    #[test]
    fn the_bill_adds_up_over_intervals(
        intervals in prop::collection::vec(
            (prop::collection::vec(arb_gpu(), 0..4), 0u64..(3_600 * SEC)), 1..6),
        price in prop::option::of(0.0f64..100_000.0),
        node in any::<bool>(),
        (policy, unused, w) in arb_policy(),
    ) {
        let s = AttributionSettings {
            price_per_gpu_hour: price.filter(|_| !node),
            price_per_node_hour: price.filter(|_| node),
            cost_policy: policy,
            unused_cost: unused,
            blend_memory_weight: w,
            idle_reservation_after_s: 60,
            rightsizing_window_s: 600,
            ..Default::default()
        };
        let mut a = Attributor::new(&s);
        let mut t = 1_700_000_000 * SEC;
        let mut billed: u128 = 0;
        for (gpus, dt) in intervals {
            let input = AttributionInput { start_unix_ns: t, interval_ns: dt, gpus, containers: BTreeMap::new() };
            let snap = a.update(&input);
            for g in &snap.gpus {
                check_gpu(g);
                billed += g.cost.map_or(0, |c| c.price_nano) as u128;
            }
            check_bill(&a, &snap);
            prop_assert_eq!(snap.bill.total as u128, billed);
            // The snapshot survives a JSON round trip (it goes to exporters as is).
            let json = serde_json::to_string(&snap).unwrap();
            let back: AttributionSnapshot = serde_json::from_str(&json).unwrap();
            prop_assert_eq!(back.bill, snap.bill);
            t += dt;
        }
    }

    #[test]
    fn the_adapter_never_panics(
        energy in prop::collection::vec(prop::option::of(any::<u64>()), 2),
        power in prop::collection::vec(prop::option::of(any::<u32>()), 2),
        mono in prop::collection::vec(any::<u64>(), 2),
        mig in any::<bool>(),
        names in prop::collection::vec(prop::option::of("[ -~]{0,30}"), 0..4),
        mem in arb_memory(),
        samples in prop::collection::vec((0u32..6, any::<u32>()), 0..10),
    ) {
        let mk = |i: usize| NvmlSample {
            taken_mono_ns: mono[i],
            devices: vec![DeviceSample {
                uuid: "GPU-p".into(),
                memory: mem,
                energy_mj: energy[i],
                power_mw: power[i],
                mig_enabled: Some(mig),
                mig_instances: names.iter().enumerate().map(|(j, n)| MigInstance {
                    uuid: format!("MIG-{j}"),
                    name: n.clone(),
                    memory: mem,
                    processes: vec![GpuProcess { pid: j as u32, ..Default::default() }],
                    ..Default::default()
                }).collect(),
                processes: (0..6).map(|pid| GpuProcess { pid, used_bytes: Some(GIB), ..Default::default() }).collect(),
                process_utilization: samples.iter().map(|&(pid, sm_pct)| ProcessUtilization { pid, sm_pct, ..Default::default() }).collect(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let own = |pid: u32| pid.is_multiple_of(2).then(|| ProcessOwner { container: Some(ContainerKey(pid as u64 % 3)), ..Default::default() });
        let input = input_from_sample(&mk(1), Some(&mk(0)), own, |_, _| ProcessLedgers::default(), &BTreeMap::new());
        prop_assert!(input.gpus.iter().map(|g| g.share_of_gpu_ppm as u64).sum::<u64>() <= 1_000_000 || !mig);
        let mut a = Attributor::new(&settings(Some(2.5), CostPolicy::Blended, UnusedCost::Spread));
        let snap = a.update(&input);
        for g in &snap.gpus { check_gpu(g); }
        check_bill(&a, &snap);
    }
}
