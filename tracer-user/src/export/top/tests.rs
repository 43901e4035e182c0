use super::*;
use crate::{
    model::{Accounting, PipelineStats, counters::KernelCounters},
    state::snapshot::{CgroupRow, ProcessRow, Snapshot},
};

fn snapshot(pods: usize) -> AgentSnapshot {
    let mut state = Snapshot::default();
    for i in 0..pods {
        let id = 1000 + i as u64;
        let usage = Usage {
            vidmem_bytes: ((i as u64 + 1) * 3) << 29,
            allocations: 123,
            frees: 45,
            ioctls: 98765,
            ..Default::default()
        };
        state.cgroups.push(CgroupRow {
            cgroup_id: id,
            path: Some(format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{i:08x}_aaaa_bbbb_cccc_dddddddddddd.slice/cri-containerd-{i:064x}.scope"
            )),
            processes: 1,
            removed: false,
            usage,
            completeness: Default::default(),
        });
        state.processes.push(ProcessRow {
            tgid: 4_000_000 + i as u32,
            start_time_ticks: 1,
            comm: Some("python3.11-worker".into()),
            cgroup_id: id,
            fds: 3,
            gpu_minors: vec![i as u32 % 8],
            clients: 1,
            handles: 10,
            usage,
            completeness: Default::default(),
        });
    }
    AgentSnapshot {
        state,
        cuda: Default::default(),
        ledger_check: Vec::new(),
        kernel: KernelCounters::default(),
        pipeline: PipelineStats::default(),
        accounting: Accounting {
            seen: 123456789,
            received: 123456000,
            aggregated: 0,
            dropped: 789,
            in_flight: 0,
            exact: true,
        },
        attach_mode: crate::model::probes::ProbeMode::Attached(crate::config::AttachMode::BtfTracepoint),
        driver_version: "535.261.03".into(),
        ..Default::default()
    }
}

#[test]
fn thirty_pods_fit_in_80_columns_one_line_per_row() {
    let out = render(&snapshot(30), &RenderOptions { per_process: true, width: 80 });
    if std::env::var_os("SHOW_TOP").is_some() {
        println!("{out}");
    }
    for line in out.lines() {
        assert!(line.chars().count() <= 80, "too wide ({}): {line}", line.chars().count());
    }
    // One line per cgroup and per process (no wrapping, no separators), plus 3 border/header
    // lines, 2 title lines and 3 footer lines.
    let rows = out.lines().filter(|l| l.contains("pod ") || l.contains("python3")).count();
    assert_eq!(rows, 60, "{out}");
    assert_eq!(out.lines().count(), 60 + 4 + 2 + 2, "{out}");
}

#[test]
fn the_cuda_table_fits_in_80_columns_too() {
    use crate::cuda::ledger::{CudaCgroupRow, CudaProcessRow, CudaUsage};
    let mut s = snapshot(30);
    for c in s.state.cgroups.clone() {
        let usage = CudaUsage {
            device_bytes: 70 << 30,
            managed_bytes: 3 << 30,
            launches: 987_654_321,
            graph_launches: 98_765,
            launch_rate: 123_456.0,
            allocs: 12_345,
            frees: 12_000,
            ..Default::default()
        };
        s.cuda.cgroups.push(CudaCgroupRow { cgroup_id: c.cgroup_id, path: c.path.clone(), usage });
        s.cuda.processes.push(CudaProcessRow { tgid: 4_000_000, cgroup_id: c.cgroup_id, usage });
    }
    let out = render(&s, &RenderOptions { per_process: true, width: 80 });
    for line in out.lines() {
        assert!(line.chars().count() <= 80, "too wide ({}): {line}", line.chars().count());
    }
    assert!(out.contains("LAUNCH/s"), "{out}");
    // One line per row in the CUDA table as well: no name wrapped onto a line of its own.
    assert_eq!(out.lines().filter(|l| l.contains("987654321")).count(), 60, "{out}");
    let cuda = out.split("CUDA (libcuda)").nth(1).unwrap();
    for line in cuda.lines().filter(|l| l.contains("pod ")) {
        assert!(line.contains("987654321"), "wrapped: {line}");
    }
}
