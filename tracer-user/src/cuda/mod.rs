//! The `cuda` probe family's user side: where libcuda is and where to put uprobes on its entry
//! points (`attach`, `placement`), and the CUDA-level ledger and counts (`ledger`).
pub mod attach;
pub mod ledger;
pub mod placement;
