//! `AgentSnapshot` ⇄ `gputracer.v1.Snapshot`, and the agent's status as `gputracer.v1.AgentStatus`.
//!
//! The agent serves [`snapshot_to_proto`] and [`status_to_proto`]; `top --connect` turns the
//! message back with [`snapshot_from_proto`] and renders it with the same code as a local `top`,
//! so the tables are the same. Field meanings are documented in `proto/gputracer/v1/snapshot.proto`.
//!
//! One file per area of the model, each holding both directions of its types side by side:
//! `driver` (the driver ledger), `cuda` (the CUDA ledger and the ledger check), `counters`
//! (kernel, pipeline and accounting counters, the attach mode), `nvml`, `attribution` (each GPU's
//! lines), `bill` (cost lines, the bill, each container's summary and rightsizing), `identity`
//! (containers, allocation use), `guardrails`, `kubernetes`, and `status` (the status, one way
//! only). `codec` holds the machinery: a type implements `ToProto` and `FromProto` once, most of
//! them through `wire_message!`, which writes both directions from one list of fields (one line
//! per field, naming how it is carried). Adding a field to the snapshot is a field in the producer
//! struct, a field in `snapshot.proto`, and a line in that list.
//!
//! What [`snapshot_from_proto`] does not restore, because the message does not carry it:
//! - of the NVML sample, only the per-GPU summary (index, UUID, name, minor, PCI bus id, memory,
//!   utilization, power, energy, temperature, MIG mode and devices, lost, missing readings) and the
//!   sample's time, versions, cost and missing readings; clocks, compute mode, the process lists,
//!   process utilization samples, MIG devices' process lists and `taken_mono_ns` (a clock of the
//!   agent's host, meaningless elsewhere) come back empty;
//! - `taken_at_unix_ns` and `interval_ns` (not fields of [`AgentSnapshot`]: read them from the
//!   message);
//! - names outside the sets this build knows, in the counter maps keyed by `&'static str`: they
//!   are added up under `"other"`; kernel drops for a reason this build does not know are not
//!   counted in any slot (the [`Accounting`](crate::model::Accounting) totals are carried apart
//!   and stay exact);
//! - the OTLP exporter's counters (`AgentSnapshot::otlp`: the agent's own export, not its view);
//! - the difference between an empty string and "unknown" in container identities and violation
//!   evidence (the wire says "empty: unknown"), and a violation's GPU that names nothing (read as
//!   "all GPUs").
use gpu_tracer_proto::v1;

use crate::model::{AgentSnapshot, counters::KernelCounters};

mod attribution;
mod bill;
mod codec;
mod counters;
mod cuda;
mod driver;
mod guardrails;
mod identity;
mod kubernetes;
mod nvml;
mod status;

use codec::{Codec as _, Each, Enum, Msg, Shared};
use identity::ByCgroup;

pub use nvml::NVML_FAILURE_REASONS;
pub use status::status_to_proto;

/// Why a `gputracer.v1.Snapshot` could not be turned back into an [`AgentSnapshot`]. Each variant
/// names the field, as `Message.field`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// A sub-message the agent always sets is unset (or a `oneof` has no case set).
    #[error("{field} is missing")]
    Missing { field: &'static str },
    /// An enum field holds a number this build does not know (e.g. from a newer agent).
    #[error("{field} = {value} is not a value this build knows")]
    InvalidEnum { field: &'static str, value: i32 },
    /// An enum field is 0 (`*_UNSPECIFIED`): the agent never sends it, so the sender is not one.
    #[error("{field} is unspecified (0)")]
    Unspecified { field: &'static str },
    /// A string field that names one of a fixed set (a violation kind) names none of it.
    #[error("{field} = {value:?} is not a name this build knows")]
    UnknownName { field: &'static str, value: String },
}

impl SnapshotError {
    /// A short, stable label for a metric or a log field.
    pub fn reason(&self) -> &'static str {
        match self {
            SnapshotError::Missing { .. } => "missing",
            SnapshotError::InvalidEnum { .. } => "invalid_enum",
            SnapshotError::Unspecified { .. } => "unspecified",
            SnapshotError::UnknownName { .. } => "unknown_name",
        }
    }
}

type Result<T> = std::result::Result<T, SnapshotError>;

/// The key under which counts of names this build does not know are added up.
pub(crate) const OTHER: &str = "other";

// The snapshot itself: hand-written, because two of the message's fields are not the model's
// (`taken_at_unix_ns`, `interval_ns`) and four of the model's are not carried (the agent's own
// exporters and probe families). A top-level field is one line in each of the two functions below.

/// The agent's snapshot as a message. `taken_at_unix_ns`: the wall clock when it was taken.
pub fn snapshot_to_proto(s: &AgentSnapshot, taken_at_unix_ns: u64) -> v1::Snapshot {
    v1::Snapshot {
        taken_at_unix_ns,
        interval_ns: s.attribution.as_ref().map_or(0, |a| a.interval_ns),
        driver: Msg.write(&s.state),
        cuda: Msg.write(&s.cuda),
        ledger_checks: Each.write(&s.ledger_check),
        kernel_probes: Each.write(&s.kernel.probes),
        pipeline: Msg.write(&s.pipeline),
        accounting: Msg.write(&s.accounting),
        attach_mode: Enum.write(&s.attach_mode),
        driver_version: s.driver_version.clone(),
        nvml: Msg.write(&s.nvml),
        attribution: Shared.write(&s.attribution),
        containers: ByCgroup.write(&s.containers),
        allocation_use: Each.write(&s.allocation_use),
        violations: Each.write(&s.violations),
        violation_counts: Msg.write(&s.violation_counts),
        kubernetes: Msg.write(&s.kubernetes),
    }
}

/// The snapshot back from a message: everything `top` and the attribution table read, and the
/// rest of what the message carries (see the module docs for what it does not). A required
/// sub-message that is unset, an enum that is 0 or unknown, or a violation kind this build does not
/// know is an error naming the field.
pub fn snapshot_from_proto(p: v1::Snapshot) -> Result<AgentSnapshot> {
    Ok(AgentSnapshot {
        state: Msg.read(p.driver, "Snapshot.driver")?,
        cuda: Msg.read(p.cuda, "Snapshot.cuda")?,
        ledger_check: Each.read(p.ledger_checks, "Snapshot.ledger_checks")?,
        kernel: KernelCounters { probes: Each.read(p.kernel_probes, "Snapshot.kernel_probes")? },
        pipeline: Msg.read(p.pipeline, "Snapshot.pipeline")?,
        accounting: Msg.read(p.accounting, "Snapshot.accounting")?,
        attach_mode: Enum.read(p.attach_mode, "Snapshot.attach_mode")?,
        driver_version: p.driver_version,
        nvml: Msg.read(p.nvml, "Snapshot.nvml")?,
        attribution: Shared.read(p.attribution, "Snapshot.attribution")?,
        containers: ByCgroup.read(p.containers, "Snapshot.containers")?,
        allocation_use: Each.read(p.allocation_use, "Snapshot.allocation_use")?,
        violations: Each.read(p.violations, "Snapshot.violations")?,
        violation_counts: Msg.read(p.violation_counts, "Snapshot.violation_counts")?,
        kubernetes: Msg.read(p.kubernetes, "Snapshot.kubernetes")?,
        // Not carried: the OTLP exporter's counters (the agent's own export, not its view).
        ..Default::default()
    })
}

#[cfg(test)]
mod tests;
