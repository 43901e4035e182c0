//! The `cuda` probe family's numbers: the CUDA-level ledger and counts ([`ledger`]). Finding
//! libcuda and placing uprobes on it is the agent's (`tracer_agent::cuda`).
pub mod ledger;
