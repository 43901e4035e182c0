/// The ledger ring: every record a ledger is built from (fds, lifecycle, allocations, frees).
pub const EVENTS: &str = "EVENTS";
/// The bulk ring: high-rate records that only count (RM_CONTROL and other count-only ioctls,
/// per-event launches, function lookups), so a flood of them never crowds out the ledger's.
pub const BULK_EVENTS: &str = "BULK_EVENTS";
pub const COUNTERS: &str = "COUNTERS";
pub const NV_FDS: &str = "NV_FDS";
pub const TRACKED_TGIDS: &str = "TRACKED_TGIDS";
pub const INFLIGHT: &str = "INFLIGHT";
pub const IOCTL_ENTRY: &str = "IOCTL_ENTRY";
pub const UVM_MAPS: &str = "UVM_MAPS";
pub const CAPTURE_PLANS: &str = "CAPTURE_PLANS";
pub const ALLOC_PARAM_SIZES: &str = "ALLOC_PARAM_SIZES";
pub const CONFIG: &str = "CONFIG";
pub const CUDA_COUNTS: &str = "CUDA_COUNTS";
pub const CUDA_PER_EVENT: &str = "CUDA_PER_EVENT";
pub const CUDA_INFLIGHT: &str = "CUDA_INFLIGHT";
pub const CUDA_TIMED_INFLIGHT: &str = "CUDA_TIMED_INFLIGHT";
pub const SIM_DEVICES: &str = "SIM_DEVICES";
pub const LOST_RECORDS: &str = "LOST_RECORDS";
