//! What the exporters read: the agent's immutable per-interval [`AgentSnapshot`] and the views it
//! is made of (accounting, NVML, Kubernetes, allocation use), plus the one type that says what is
//! known about an event beyond its bytes ([`EventContext`]).
//!
//! The pipeline builds these; `export/*` only reads them. Nothing here depends on `export` or on
//! `pipeline`.
use std::{collections::BTreeMap, sync::Arc};

use serde::Serialize;

mod accounting;
mod api;
pub mod counters;
mod event;
mod kubernetes;
mod nvml;
mod otlp;
pub mod probes;

pub use accounting::{Accounting, LedgerCheck, PipelineStats};
pub use api::{ApiConnStats, ApiStats, HttpStats};
pub use event::EventContext;
pub use kubernetes::{AllocationUse, KubeView, KubernetesStatus};
pub use nvml::{NvmlStatus, NvmlView};
pub use otlp::{OtlpDrop, OtlpStats};
pub use probes::ProbeFamilyState;

use crate::{
    attribution::AttributionSnapshot,
    cuda::ledger::CudaSnapshot,
    guardrails::{Violation, ViolationCounts},
    identity::ContainerIdentity,
    model::{counters::KernelCounters, probes::ProbeMode},
    state::Snapshot,
};

/// Everything a user-facing command shows, computed once per interval.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AgentSnapshot {
    /// The driver ledger: per process and cgroup live memory and ioctl counts.
    pub state: Snapshot,
    /// libcuda-level numbers (the `cuda` family): launches, CUDA allocations.
    pub cuda: CudaSnapshot,
    /// CUDA ledger vs driver ledger, per process seen by both.
    pub ledger_check: Vec<LedgerCheck>,
    /// The kernel's per-probe counters.
    pub kernel: KernelCounters,
    /// The user-space stages' counters.
    pub pipeline: PipelineStats,
    /// `seen = received + aggregated + dropped`.
    pub accounting: Accounting,
    /// Where the driver probes attached (or NVML-only).
    pub attach_mode: ProbeMode,
    /// How each probe family fared (`driver`, `lifecycle`, `cuda`); empty in a snapshot read back
    /// from the API.
    pub probe_families: Vec<ProbeFamilyState>,
    /// The driver version whose struct layouts are used.
    pub driver_version: String,
    /// NVML: in use or why not, and the latest sample.
    pub nvml: NvmlView,
    /// Per GPU (and MIG instance): each container's memory, SM share, energy and cost, and the
    /// lines that belong to no container; all of it sums to the device. `None` without NVML.
    pub attribution: Option<Arc<AttributionSnapshot>>,
    /// Who each cgroup seen is (cgroup, container, pod, allocated GPUs), by cgroup id.
    pub containers: BTreeMap<u64, ContainerIdentity>,
    /// Allocated vs used GPUs per container (when the kubelet's allocations are known).
    pub allocation_use: Vec<AllocationUse>,
    /// Violations raised so far (each once per container, GPU and kind), and the counts.
    pub violations: Vec<Violation>,
    pub violation_counts: ViolationCounts,
    /// Where Kubernetes identity stands.
    pub kubernetes: KubeView,
    /// The OTLP exporter's counters; `None` when OTLP export is off.
    pub otlp: Option<OtlpStats>,
    /// The gRPC API's event hub; `None` outside the agent (set by the agent before publishing).
    pub api: Option<ApiStats>,
    /// The HTTP server's counters; `None` outside the agent (set by the agent before publishing).
    pub http: Option<HttpStats>,
}

impl AgentSnapshot {
    /// NVML is in use but no attribution interval has completed yet: the shares, energy and bill
    /// of this snapshot are zeros that only mean "not measured yet" (the first interval needs two
    /// NVML samples). `top --once` and `cost` wait for this to pass.
    pub fn first_interval_pending(&self) -> bool {
        self.nvml.status == NvmlStatus::Ready && self.attribution.as_ref().is_none_or(|a| a.interval_ns == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_interval_is_pending_only_while_nvml_is_in_use_and_none_completed() {
        let mut s = AgentSnapshot::default();
        assert!(!s.first_interval_pending(), "NVML not started: nothing to wait for");
        s.nvml.status = NvmlStatus::Off;
        assert!(!s.first_interval_pending(), "NVML off: no attribution will come");
        s.nvml.status = NvmlStatus::Ready;
        assert!(s.first_interval_pending(), "NVML ready, no attribution yet");
        let a = |interval_ns| AttributionSnapshot {
            start_unix_ns: 1,
            interval_ns,
            price_per_gpu_hour: None,
            gpus: vec![],
            containers: vec![],
            bill: Default::default(),
            counters: Default::default(),
        };
        s.attribution = Some(Arc::new(a(0)));
        assert!(s.first_interval_pending(), "an attribution of an empty interval");
        s.attribution = Some(Arc::new(a(1_000_000_000)));
        assert!(!s.first_interval_pending());
    }
}
