//! `gpu-tracer top`: the snapshot as a table that reads well at 80 columns.
use comfy_table::{Cell, CellAlignment};

use crate::table::compact_table;
use tracer_core::{
    format::human_bytes,
    identity::cgroup::short_name,
    model::{AgentSnapshot, KubernetesStatus, NvmlStatus},
    state::snapshot::{CgroupRow, Usage},
};

/// How to render.
#[derive(Clone, Debug)]
pub struct RenderOptions {
    /// List processes under their cgroup.
    pub per_process: bool,
    /// Terminal width in columns.
    pub width: u16,
}

/// The terminal width, or 80 when not a terminal.
pub fn terminal_width() -> u16 {
    crossterm::terminal::size().map(|(w, _)| w).unwrap_or(80).max(60)
}

fn usage_cells(u: &Usage) -> Vec<Cell> {
    vec![
        Cell::new(human_bytes(u.vidmem_bytes)).set_alignment(CellAlignment::Right),
        Cell::new(human_bytes(u.sysmem_bytes)).set_alignment(CellAlignment::Right),
        Cell::new(human_bytes(u.managed_bytes)).set_alignment(CellAlignment::Right),
        Cell::new(format!("{}/{}", u.allocations, u.frees)).set_alignment(CellAlignment::Right),
        Cell::new(u.ioctls).set_alignment(CellAlignment::Right),
    ]
}

fn cgroup_sort_key(c: &CgroupRow) -> (std::cmp::Reverse<u64>, u64) {
    (std::cmp::Reverse(c.usage.vidmem_bytes), c.cgroup_id)
}

/// The name of cgroup `id` for people: the pod's `namespace/pod/container` when Kubernetes knows
/// it, else what the path says.
fn name_of(s: &AgentSnapshot, id: u64, path: Option<&str>) -> String {
    match s.containers.get(&id) {
        Some(c) => c.display_name(),
        None => short_name(path, id),
    }
}

/// The attribution blocks (or why there are none), Kubernetes and guardrail lines.
fn render_header(s: &AgentSnapshot, o: &RenderOptions) -> String {
    let mut out = String::new();
    match &s.attribution {
        Some(a) => {
            // No blank lines inside a frame: consumers of the non-terminal output (scripts, the
            // simulator) split frames at the blank line `top` prints after each one.
            for line in crate::attribution_table::render_attribution(a, o.width).lines() {
                if !line.trim().is_empty() {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        None if s.nvml.status == NvmlStatus::Ready => out.push_str("NVML: ready, first interval not attributed yet\n"),
        None if s.nvml.status != NvmlStatus::NotStarted => out.push_str(&format!(
            "NVML {}: {}\n  (per-GPU attribution needs NVML; below: the driver ledger only)\n",
            s.nvml.status,
            s.nvml.reason.as_deref().unwrap_or("no reason given")
        )),
        None => {}
    }
    if !matches!(s.kubernetes.status, KubernetesStatus::NotStarted | KubernetesStatus::Off) {
        out.push_str(&format!("kubernetes: {}\n", s.kubernetes.detail));
    }
    if !s.violations.is_empty() {
        out.push_str(&format!("GPU guardrail violations: {}\n", s.violations.len()));
        for v in s.violations.iter().rev().take(5) {
            let gpu =
                v.gpu.as_ref().and_then(|g| g.uuid.clone().or(g.mig_uuid.clone())).unwrap_or_else(|| "all".into());
            out.push_str(&format!(
                "  ! {}/{}/{} pid {} {} {}\n",
                v.namespace,
                v.pod,
                v.container,
                v.pid,
                v.kind.as_str(),
                tracer_core::attribution::gpu::short_uuid(&gpu)
            ));
        }
    }
    out
}

/// Render one snapshot.
pub fn render(s: &AgentSnapshot, o: &RenderOptions) -> String {
    let mut out = render_header(s, o);
    let t = &s.state.totals;
    out.push_str(&format!(
        "gpu-tracer: {} processes in {} cgroups hold {} of GPU memory\n(driver {}, attach mode {})\n",
        t.processes,
        t.cgroups,
        human_bytes(t.usage.vidmem_bytes),
        s.driver_version,
        s.attach_mode,
    ));

    let mut table = compact_table(
        o.width,
        vec!["CGROUP / PROCESS", "PROCS", "GPU MEM", "SYSMEM", "MANAGED", "ALLOC/FREE", "IOCTLS"],
    );
    let mut cgroups: Vec<&CgroupRow> = s.state.cgroups.iter().collect();
    cgroups.sort_by_key(|c| cgroup_sort_key(c));
    let mut incomplete = Vec::new();
    for c in cgroups {
        let mut name = name_of(s, c.cgroup_id, c.path.as_deref());
        if c.removed {
            name.push_str(" (removed)");
        }
        if !c.completeness.exact() {
            incomplete.push(format!("* {name}: {}", c.completeness.describe()));
            name.push_str(" *");
        }
        let mut row = vec![Cell::new(name), Cell::new(c.processes).set_alignment(CellAlignment::Right)];
        row.extend(usage_cells(&c.usage));
        table.add_row(row);
        if o.per_process {
            for p in s.state.processes.iter().filter(|p| p.cgroup_id == c.cgroup_id) {
                // The PROCS column of a process row names the GPUs it has open.
                let gpus = if p.gpu_minors.is_empty() {
                    String::new()
                } else {
                    format!("gpu{}", p.gpu_minors.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(","))
                };
                let mut row = vec![
                    Cell::new(format!("  {} {}", p.tgid, p.comm.as_deref().unwrap_or("?"))),
                    Cell::new(gpus).set_alignment(CellAlignment::Right),
                ];
                row.extend(usage_cells(&p.usage));
                table.add_row(row);
            }
        }
    }
    if s.state.cgroups.is_empty() {
        table.add_row(vec![Cell::new("(no process has an NVIDIA device open)")]);
    }
    out.push_str(&crate::table::render(&table));
    out.push('\n');
    if !incomplete.is_empty() {
        out.push_str("* the ledger may be short here (NVML's per-process memory in the attribution is not):\n");
        for l in incomplete {
            out.push_str(&format!("  {l}\n"));
        }
    }

    if !s.cuda.cgroups.is_empty() {
        out.push_str(&render_cuda(s, o));
    }
    let gpus: Vec<String> = s
        .state
        .gpus
        .iter()
        .map(|g| {
            let name = g.minor.map(|m| format!("gpu{m}")).unwrap_or_else(|| "unknown-gpu".into());
            format!("{name} {}", human_bytes(g.usage.vidmem_bytes))
        })
        .collect();
    if !gpus.is_empty() {
        out.push_str(&format!("per GPU: {}\n", gpus.join(" | ")));
    }
    let a = &s.accounting;
    let decode_errors: u64 = s.pipeline.decode_errors.values().sum();
    let malformed: u64 = s.state.counters.malformed_by_reason.values().sum();
    out.push_str(&format!(
        "events: seen {} = received {} + aggregated {} + dropped {}{}\n        decode errors {}, malformed ioctls {}\n",
        a.seen,
        a.received,
        a.aggregated,
        a.dropped,
        if a.in_flight != 0 { format!(" ({} in flight)", a.in_flight) } else { String::new() },
        decode_errors,
        malformed
    ));
    out
}

/// The libcuda view (the `cuda` family): launches and CUDA-level allocations per cgroup.
fn render_cuda(s: &AgentSnapshot, o: &RenderOptions) -> String {
    // Managed bytes are in `--json`; six columns keep a pod name on one line at 80 columns.
    let mut table =
        compact_table(o.width, vec!["CUDA (libcuda)", "LAUNCH/s", "LAUNCHES", "GRAPHS", "CUDA MEM", "ALLOC/FREE"]);
    let right = |v: String| Cell::new(v).set_alignment(CellAlignment::Right);
    let row = |name: String, u: &tracer_core::cuda::ledger::CudaUsage| {
        vec![
            Cell::new(name),
            right(format!("{:.0}", u.launch_rate)),
            right(u.launches.to_string()),
            right(u.graph_launches.to_string()),
            right(human_bytes(u.device_bytes)),
            right(format!("{}/{}", u.allocs, u.frees)),
        ]
    };
    let mut cgroups: Vec<_> = s.cuda.cgroups.iter().collect();
    cgroups.sort_by(|a, b| b.usage.launches.cmp(&a.usage.launches).then(a.cgroup_id.cmp(&b.cgroup_id)));
    for c in cgroups {
        table.add_row(row(name_of(s, c.cgroup_id, c.path.as_deref()), &c.usage));
        if o.per_process {
            for p in s.cuda.processes.iter().filter(|p| p.cgroup_id == c.cgroup_id) {
                table.add_row(row(format!("  {}", p.tgid), &p.usage));
            }
        }
    }
    crate::table::render(&table) + "\n"
}

pub mod tui;

#[cfg(test)]
mod tests;
