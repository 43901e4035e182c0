//! Attribution: each GPU's memory, compute, energy and cost split into lines that add up exactly
//! (the cost lines, the bill and each container's summary are [`super::bill`]'s).
use gpu_tracer_proto::v1;

use crate::attribution::{
    AttributionSnapshot, ContainerKey, GpuAttribution, SharingMode,
    gpu::{
        ComputeLines, ComputeMethod, ContainerLine, EnergyLines, LedgerSplit, MemoryLines, MemorySource,
        UnattributedMemory,
    },
    input::EnergySource,
};

use super::{
    Result,
    codec::{Codec, Each, Enum, FromProto, Msg, Opt, ToProto, wire_enum, wire_message},
};

/// A container's key as its cgroup id.
pub(super) struct Cgroup;

impl Codec<ContainerKey, u64> for Cgroup {
    fn write(&self, v: &ContainerKey) -> u64 {
        v.0
    }
    fn read(&self, p: u64, _: &'static str) -> Result<ContainerKey> {
        Ok(ContainerKey(p))
    }
}

wire_message! {
    AttributionSnapshot => Attribution {
        start_unix_ns,
        interval_ns,
        price_per_gpu_hour,
        gpus: Each,
        containers: Each,
        bill: Msg,
        counters: Msg,
    }
}

wire_message! {
    GpuAttribution => GpuAttribution {
        uuid,
        parent_uuid,
        index,
        name,
        minor,
        mig_profile,
        sharing: Enum,
        sharing_reason,
        lost,
        containers: Each,
        memory: Opt,
        compute: Msg,
        energy: Opt,
        cost: Opt,
    }
}

wire_enum!(SharingMode => SharingMode [Exclusive, TimeSlicing, Mps, Mig, Unknown]);

// By hand: the message flattens the model's ledger split into three fields.
impl ToProto for ContainerLine {
    type Proto = v1::ContainerLine;

    fn to_proto(&self) -> v1::ContainerLine {
        v1::ContainerLine {
            cgroup_id: self.container.0,
            name: self.name.clone(),
            pids: self.pids.clone(),
            memory_bytes: self.memory_bytes,
            memory_source: Enum.write(&self.memory_source),
            driver_ledger_bytes: self.ledgers.driver_bytes,
            cuda_allocated_bytes: self.ledgers.cuda_allocated_bytes,
            non_cuda_bytes: self.ledgers.non_cuda_bytes,
            sm_millipct: self.sm_millipct,
            launches: self.launches,
            energy_mj: self.energy_mj,
            cost_nano: self.cost_nano,
        }
    }
}

impl FromProto for ContainerLine {
    fn from_proto(l: v1::ContainerLine) -> Result<Self> {
        Ok(ContainerLine {
            container: ContainerKey(l.cgroup_id),
            name: l.name,
            pids: l.pids,
            memory_bytes: l.memory_bytes,
            memory_source: Enum.read(l.memory_source, "ContainerLine.memory_source")?,
            ledgers: LedgerSplit {
                driver_bytes: l.driver_ledger_bytes,
                cuda_allocated_bytes: l.cuda_allocated_bytes,
                non_cuda_bytes: l.non_cuda_bytes,
            },
            sm_millipct: l.sm_millipct,
            launches: l.launches,
            energy_mj: l.energy_mj,
            cost_nano: l.cost_nano,
        })
    }
}

wire_enum!(MemorySource => MemorySource [Nvml, DriverLedger, Mixed, None]);

// By hand: the message flattens the model's breakdown of unattributed memory into three fields.
impl ToProto for MemoryLines {
    type Proto = v1::MemoryLines;

    fn to_proto(&self) -> v1::MemoryLines {
        v1::MemoryLines {
            total: self.total,
            driver_reserved: self.driver_reserved,
            unattributed: self.unattributed,
            unattributed_host_processes: self.unattributed_detail.host_processes,
            unattributed_mps_server: self.unattributed_detail.mps_server,
            unattributed_other: self.unattributed_detail.other,
            free: self.free,
            scaled_down: self.scaled_down,
            inconsistent: self.inconsistent,
        }
    }
}

impl FromProto for MemoryLines {
    fn from_proto(m: v1::MemoryLines) -> Result<Self> {
        Ok(MemoryLines {
            total: m.total,
            driver_reserved: m.driver_reserved,
            unattributed: m.unattributed,
            unattributed_detail: UnattributedMemory {
                host_processes: m.unattributed_host_processes,
                mps_server: m.unattributed_mps_server,
                other: m.unattributed_other,
            },
            free: m.free,
            scaled_down: m.scaled_down,
            inconsistent: m.inconsistent,
        })
    }
}

wire_message! {
    ComputeLines => ComputeLines {
        method: Enum,
        unattributed,
        idle,
        device_activity_pct,
        clamped,
    }
}

wire_enum!(ComputeMethod => ComputeMethod [ProcessSamples, LaunchCounts, None]);

wire_message! {
    EnergyLines => EnergyLines {
        delta_mj,
        source: Enum,
        unattributed,
        idle,
    }
}

wire_enum!(EnergySource => EnergySource [Counter, CounterReset, PowerTimesInterval, ParentShare]);
