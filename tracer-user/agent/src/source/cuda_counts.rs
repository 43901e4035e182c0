//! Reading (and pruning) the kernel's per-CPU `CUDA_COUNTS` aggregates.
use aya::{
    Ebpf,
    maps::{MapData, PerCpuHashMap},
};
use tracer_common::{CudaCount, CudaCountKey, map_names};

/// Every (cgroup, tgid, entry point) row, summed over CPUs. Empty when the map is missing.
pub fn read(ebpf: &Ebpf) -> Vec<(CudaCountKey, CudaCount)> {
    let Some(m) = ebpf.map(map_names::CUDA_COUNTS) else { return Vec::new() };
    let Ok(h) = PerCpuHashMap::<&MapData, CudaCountKey, CudaCount>::try_from(m) else { return Vec::new() };
    h.iter()
        .filter_map(Result::ok)
        .map(|(k, per_cpu)| {
            let mut sum = CudaCount::default();
            for c in per_cpu.iter() {
                sum.calls += c.calls;
                sum.bytes += c.bytes;
            }
            (k, sum)
        })
        .collect()
}

/// Remove the rows of an exited process (their totals were folded by the caller first).
pub fn forget(ebpf: &mut Ebpf, tgid: u32) -> usize {
    let Some(m) = ebpf.map_mut(map_names::CUDA_COUNTS) else { return 0 };
    let Ok(mut h) = PerCpuHashMap::<&mut MapData, CudaCountKey, CudaCount>::try_from(m) else { return 0 };
    let keys: Vec<CudaCountKey> = h.keys().filter_map(Result::ok).filter(|k| k.tgid == tgid).collect();
    keys.iter().filter(|k| h.remove(k).is_ok()).count()
}
