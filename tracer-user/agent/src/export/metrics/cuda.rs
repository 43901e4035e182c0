//! The CUDA ledger (the `cuda` probe family): launches and CUDA allocations per cgroup, and libcuda
//! calls by entry point.
use std::fmt;

use super::{MetricEncoder, Scrape, Unit, by_container, counter, counter_family, gauge_family};
use tracer_core::cuda::ledger::CudaUsage;

/// libcuda-level numbers per cgroup: launches and CUDA allocations.
pub fn cgroup_cuda(s: &Scrape<'_>, e: &mut dyn MetricEncoder) -> fmt::Result {
    if !s.has_probes() {
        return Ok(());
    }
    let rows = by_container(
        s,
        &s.snapshot.cuda.cgroups,
        |c| (c.cgroup_id, c.path.as_deref()),
        |a: &mut CudaUsage, c| *a += &c.usage,
    );
    let bytes = Some(Unit::Bytes);
    let g = |e: &mut dyn MetricEncoder, name, help, f: fn(&CudaUsage) -> u64| {
        gauge_family(e, name, help, bytes, rows.iter().map(|(l, u)| (l, f(u))))
    };
    let c = |e: &mut dyn MetricEncoder, name, help, f: fn(&CudaUsage) -> u64| {
        counter_family(e, name, help, None, rows.iter().map(|(l, u)| (l, f(u))))
    };
    c(e, "cgroup_cuda_launches", "CUDA kernel launches (cuLaunchKernel*, cuLaunchCooperativeKernel*).", |u| {
        u.launches
    })?;
    c(e, "cgroup_cuda_graph_launches", "CUDA graph launches (cuGraphLaunch*); one may run many kernels.", |u| {
        u.graph_launches
    })?;
    g(e, "cgroup_cuda_device", "Live bytes of cuMemAlloc*/cuMemCreate (CUDA ledger).", |u| u.device_bytes)?;
    g(e, "cgroup_cuda_managed", "Live bytes of cuMemAllocManaged.", |u| u.managed_bytes)?;
    g(e, "cgroup_cuda_host", "Live bytes of cuMemAllocHost (pinned host memory).", |u| u.host_bytes)?;
    c(e, "cgroup_cuda_allocations", "Successful CUDA allocation calls.", |u| u.allocs)?;
    c(e, "cgroup_cuda_frees", "CUDA free calls.", |u| u.frees)?;
    c(e, "cgroup_cuda_failed_allocations", "CUDA allocation calls that returned an error.", |u| u.failed_allocs)
}

/// libcuda calls by entry point (a fixed set of symbol names), and frees of unknown pointers.
pub fn cuda_calls(s: &Scrape<'_>, e: &mut dyn MetricEncoder) -> fmt::Result {
    if !s.has_probes() {
        return Ok(());
    }
    let cuda = &s.snapshot.cuda;
    counter_family(
        e,
        "cuda_calls",
        "libcuda calls seen, by entry point.",
        None,
        cuda.calls_by_entry.iter().map(|(k, v)| ([("entry", *k)], *v)),
    )?;
    counter(e, "cuda_unknown_frees", "CUDA frees of pointers the ledger did not know.", None, cuda.unknown_frees)
}
