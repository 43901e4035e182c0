//! The `cuda` probe family's user side: where libcuda is and where to put uprobes on its entry
//! points (`attach`, `placement`). The CUDA-level ledger is the core's (`tracer_core::cuda::ledger`).
pub mod attach;
pub mod placement;
