use super::*;
use tracer_core::{
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
        attach_mode: tracer_core::model::probes::ProbeMode::Attached(tracer_core::config::AttachMode::BtfTracepoint),
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
    use tracer_core::cuda::ledger::{CudaCgroupRow, CudaProcessRow, CudaUsage};
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

fn round_trip(s: &AgentSnapshot) -> AgentSnapshot {
    use tracer_core::{
        fixtures::snapshot::{SEC, T0},
        wire::snapshot::{snapshot_from_proto, snapshot_to_proto},
    };
    snapshot_from_proto(snapshot_to_proto(s, T0 + 2 * SEC)).expect("a message the agent made is valid")
}

/// What `top --connect` renders from the agent's message is what a local `top` renders.
#[test]
fn top_and_the_attribution_table_render_the_same_from_the_message() {
    let s = tracer_core::fixtures::snapshot::rich();
    let back = round_trip(&s);
    for per_process in [true, false] {
        for width in [80, 160] {
            let o = RenderOptions { per_process, width };
            assert_eq!(render(&back, &o), render(&s, &o), "per_process {per_process}, width {width}");
        }
    }
    let (a, b) = (s.attribution.as_deref().expect("attributed"), back.attribution.as_deref().expect("restored"));
    for width in [80, 160] {
        assert_eq!(
            crate::attribution_table::render_attribution(b, width),
            crate::attribution_table::render_attribution(a, width)
        );
    }
    assert_eq!(a, b, "the attribution comes back whole");
    assert_eq!(back.state, s.state, "the driver ledger comes back whole");
    assert_eq!(back.cuda, s.cuda);
    assert_eq!(back.kernel, s.kernel);
    assert_eq!(back.violations, s.violations);
    assert_eq!(back.containers, s.containers);
    // The fixture shows what it is meant to: every kind of block and line.
    let out = render(&s, &RenderOptions { per_process: true, width: 160 });
    if std::env::var_os("SHOW_TOP").is_some() {
        println!("{out}");
    }
    for part in ["bill so far", "MIG 3g.71gb", "unknown-gpu", "GPU guardrail violations: 3", "CUDA (libcuda)", "↓ "] {
        assert!(out.contains(part), "{part} missing:\n{out}");
    }
}

/// An agent that has seen nothing renders the same from its message.
#[test]
fn an_empty_agent_renders_the_same_from_its_message() {
    let s = AgentSnapshot::default();
    let back = round_trip(&s);
    let o = RenderOptions { per_process: true, width: 80 };
    assert_eq!(render(&back, &o), render(&s, &o));
}
