//! The CUDA ledger (`cuda::ledger`) as `CudaLedger`, and the CUDA-vs-driver ledger check.
use crate::{
    cuda::ledger::{CudaCgroupRow, CudaProcessRow, CudaSnapshot, CudaUsage},
    model::LedgerCheck,
};

use super::codec::{Counts, Each, Msg, wire_message};

wire_message! {
    CudaSnapshot => CudaLedger {
        cgroups: Each,
        processes: Each,
        totals: Msg,
        calls_by_entry: Counts(&tracer_common::cuda_entry::ALL.map(|e| e.1)),
        unknown_frees,
    }
}

wire_message! {
    CudaUsage => CudaUsage {
        device_bytes,
        managed_bytes,
        host_bytes,
        launches,
        graph_launches,
        launch_rate,
        allocs,
        frees,
        failed_allocs,
    }
}

wire_message! {
    CudaCgroupRow => CudaCgroup {
        cgroup_id,
        path,
        usage: Msg,
    }
}

wire_message! {
    CudaProcessRow => CudaProcess {
        tgid,
        cgroup_id,
        usage: Msg,
    }
}

wire_message! {
    LedgerCheck => LedgerCheck {
        tgid,
        cgroup_id,
        cuda_device_bytes,
        driver_vidmem_bytes,
        driver_minus_cuda,
    }
}
