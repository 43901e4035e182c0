//! Cost: each GPU's cost lines, the bill so far, the attributor's counters, and each container's
//! summary across GPUs with its rightsizing advice.
use gpu_tracer_proto::v1;

use crate::{
    attribution::{
        Bill, ContainerSummary, GpuRequest, IdleReservation,
        attributor::AttributorCounters,
        gpu::{CostBasis, CostLines},
        rightsizing::{Fit, Rightsizing},
    },
    config::{CostPolicy, UnusedCost},
};

use super::{
    Result,
    attribution::Cgroup,
    codec::{Count, Enum, FromProto, Msg, Opt, ToProto, required, wire_enum, wire_message},
};

wire_message! {
    CostLines => CostLines {
        price_nano,
        policy: Enum,
        basis: Enum,
        unused: Enum,
        idle,
        driver_reserved,
        unattributed,
    }
}

wire_enum!(CostPolicy => CostPolicy [MemoryTime, ComputeTime, Blended, RequestBased]);
wire_enum!(CostBasis => CostBasis [MemoryTime, ComputeTime, Blended, RequestBased, Nothing]);
wire_enum!(UnusedCost => UnusedCost [Lines, Spread]);

wire_message! {
    Bill => Bill {
        total,
        idle,
        driver_reserved,
        unattributed,
        evicted,
    }
}

wire_message! {
    AttributorCounters => AttributorCounters {
        intervals,
        evicted_containers,
        evicted_gpus,
        dropped_gpus,
        invalid_price,
    }
}

wire_message! {
    ContainerSummary => ContainerSummary {
        container => cgroup_id: Cgroup,
        name,
        gpus,
        memory_bytes,
        sm_millipct,
        launches,
        energy_mj,
        cost_nano,
        cumulative_cost_nano,
        cumulative_energy_mj,
        last_seen_unix_ns,
        idle_reservation: Opt,
        rightsizing: Opt,
    }
}

wire_message! {
    IdleReservation => IdleReservation {
        since_unix_ns,
        held_bytes,
    }
}

wire_message! {
    Rightsizing => Rightsizing {
        covered_s,
        samples: Count,
        peak_memory_bytes,
        p95_memory_bytes,
        peak_sm_millipct,
        p95_sm_millipct,
        gpu_total_bytes,
        request: Opt,
        fit: Msg,
        over_requested,
    }
}

// By hand: a `oneof` each way.
impl ToProto for GpuRequest {
    type Proto = v1::GpuRequest;

    fn to_proto(&self) -> v1::GpuRequest {
        use v1::gpu_request::Request;
        let request = match self {
            GpuRequest::WholeGpus { count } => Request::WholeGpus(v1::WholeGpus { count: *count }),
            GpuRequest::MigProfile { profile, count } => {
                Request::MigProfile(v1::MigProfileRequest { profile: profile.clone(), count: *count })
            }
            GpuRequest::Fraction { fraction } => Request::Fraction(*fraction),
        };
        v1::GpuRequest { request: Some(request) }
    }
}

impl FromProto for GpuRequest {
    fn from_proto(r: v1::GpuRequest) -> Result<Self> {
        use v1::gpu_request::Request;
        Ok(match required(r.request, "GpuRequest.request")? {
            Request::WholeGpus(w) => GpuRequest::WholeGpus { count: w.count },
            Request::MigProfile(m) => GpuRequest::MigProfile { profile: m.profile, count: m.count },
            Request::Fraction(fraction) => GpuRequest::Fraction { fraction },
        })
    }
}

impl ToProto for Fit {
    type Proto = v1::Fit;

    fn to_proto(&self) -> v1::Fit {
        use v1::fit::Fit as P;
        let fit = match self {
            Fit::MigProfile { profile } => P::MigProfile(profile.clone()),
            Fit::Fraction { pct } => P::FractionPct(*pct),
            Fit::WholeGpu => P::WholeGpu(v1::WholeGpu {}),
        };
        v1::Fit { fit: Some(fit) }
    }
}

impl FromProto for Fit {
    fn from_proto(f: v1::Fit) -> Result<Self> {
        use v1::fit::Fit as P;
        Ok(match required(f.fit, "Fit.fit")? {
            P::MigProfile(profile) => Fit::MigProfile { profile },
            P::FractionPct(pct) => Fit::Fraction { pct },
            P::WholeGpu(v1::WholeGpu {}) => Fit::WholeGpu,
        })
    }
}
