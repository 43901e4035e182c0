//! CUDA driver library (`libcuda.so.1`) support: where to put uprobes on its entry points.
pub mod placement;
