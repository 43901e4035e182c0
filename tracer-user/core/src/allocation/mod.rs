//! Which GPUs the kubelet allocated to which container, from the kubelet pod-resources API
//! ([`pod_resources`]): device-plugin devices (`nvidia.com/gpu`, `nvidia.com/mig-*`, time-slicing
//! replicas) and DRA resource claims (`gpu.nvidia.com`).
//!
//! [`GpuAllocations`] is the domain view of one answer; [`AllocationSource`] polls the socket and
//! keeps the last good answer when the kubelet goes away. Device ids are parsed into
//! [`GpuDevice`] (the raw id is kept too), so the guardrails can map every allocation back to a
//! physical GPU (`/dev/nvidiaN`).

use std::{collections::BTreeMap, path::PathBuf};

use gpu_tracer_proto::podresources::v1 as api;
use serde::Serialize;

/// A container of a pod, as the kubelet names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ContainerRef {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

impl ContainerRef {
    /// A container from its three names.
    pub fn new(namespace: impl Into<String>, pod: impl Into<String>, container: impl Into<String>) -> Self {
        ContainerRef { namespace: namespace.into(), pod: pod.into(), container: container.into() }
    }
}

impl std::fmt::Display for ContainerRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.pod, self.container)
    }
}

/// What handed the device out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Allocator {
    /// A device plugin, under this extended resource name (e.g. `nvidia.com/gpu`).
    DevicePlugin { resource: String },
    /// A DRA driver (e.g. `gpu.nvidia.com`) through a resource claim.
    Dra { driver: String, pool: String, claim_namespace: String, claim_name: String },
}

/// One device id, parsed. Which GPU it names is resolved against NVML's map (`guardrails::GpuMap`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuDevice {
    /// A whole GPU by UUID (`GPU-…`), the device plugin's default `uuid` id strategy.
    Gpu { uuid: String },
    /// A MIG device by its own UUID (`MIG-<uuid>`, drivers ≥ 470).
    Mig { uuid: String },
    /// A MIG device in the legacy form `MIG-GPU-<parent uuid>/<gpu instance>/<compute instance>`.
    MigLegacy { parent_uuid: String, gpu_instance: u32, compute_instance: u32 },
    /// A whole GPU by NVML index (the device plugin's `index` id strategy: `0`).
    Index { index: u32 },
    /// A MIG device by parent NVML index and MIG index (`index` strategy: `0:1`).
    MigIndex { parent_index: u32, mig_index: u32 },
    /// A device named by NVIDIA's DRA driver: `gpu-<N>` (a whole GPU) or `gpu-<N>-mig-<profile…>`
    /// (a MIG device on GPU N). N is the GPU's minor number (`/dev/nvidiaN`) in current releases
    /// of the driver (early ones used the NVML index, which equals the minor on most nodes).
    DraGpu { minor: u32, mig: Option<String> },
    /// An id this build cannot read. Kept (and counted) so a container that has a GPU is never
    /// mistaken for one without.
    Unrecognised { reason: String },
}

/// One GPU (or MIG device, or time-slicing replica of one) allocated to a container, or
/// allocatable on the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AllocatedGpu {
    /// The id exactly as the kubelet gave it (DRA: the device name).
    pub raw_id: String,
    pub via: Allocator,
    pub device: GpuDevice,
    /// Time-slicing replica index (`GPU-…::3` is replica 3 of that GPU).
    pub replica: Option<u32>,
}

/// A device id that cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("device id {id:?} is not a GPU id gpu-tracer knows ({why})")]
pub(crate) struct DeviceIdError {
    pub id: String,
    pub why: &'static str,
}

/// Whether `s` looks like the body of an NVIDIA UUID (hex digits and dashes, non-empty).
fn uuid_body(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// Parse a device-plugin device id: `GPU-…`, `MIG-…`, `MIG-GPU-…/gi/ci`, `0`, `0:1`, each
/// optionally with a time-slicing replica suffix `::N`.
pub(crate) fn parse_device_id(raw: &str) -> Result<(GpuDevice, Option<u32>), DeviceIdError> {
    let err = |why| DeviceIdError { id: raw.to_string(), why };
    let (base, replica) = match raw.split_once("::") {
        Some((base, n)) => (base, Some(n.parse::<u32>().map_err(|_| err("replica suffix `::N` is not a number"))?)),
        None => (raw, None),
    };
    let device = if let Some(rest) = base.strip_prefix("MIG-GPU-") {
        let mut parts = rest.split('/');
        let (Some(uuid), Some(gi), Some(ci), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err(err("legacy MIG id is not MIG-GPU-<uuid>/<gi>/<ci>"));
        };
        if !uuid_body(uuid) {
            return Err(err("legacy MIG id has no GPU UUID"));
        }
        GpuDevice::MigLegacy {
            parent_uuid: format!("GPU-{uuid}"),
            gpu_instance: gi.parse().map_err(|_| err("legacy MIG GPU instance is not a number"))?,
            compute_instance: ci.parse().map_err(|_| err("legacy MIG compute instance is not a number"))?,
        }
    } else if let Some(rest) = base.strip_prefix("MIG-") {
        if !uuid_body(rest) {
            return Err(err("MIG UUID is not hex"));
        }
        GpuDevice::Mig { uuid: base.to_string() }
    } else if let Some(rest) = base.strip_prefix("GPU-") {
        if !uuid_body(rest) {
            return Err(err("GPU UUID is not hex"));
        }
        GpuDevice::Gpu { uuid: base.to_string() }
    } else if let Some((gpu, mig)) = base.split_once(':') {
        match (gpu.parse(), mig.parse()) {
            (Ok(parent_index), Ok(mig_index)) => GpuDevice::MigIndex { parent_index, mig_index },
            _ => return Err(err("index id is not <gpu>:<mig>")),
        }
    } else if let Ok(index) = base.parse() {
        GpuDevice::Index { index }
    } else {
        return Err(err("neither a GPU/MIG UUID nor an index"));
    };
    Ok((device, replica))
}

/// Parse a device name of NVIDIA's DRA driver: `gpu-0`, `gpu-0-mig-1g18gb-0`,
/// `gpu-0-mig-9-4-4` (older form).
pub(crate) fn parse_dra_device_name(name: &str) -> Result<GpuDevice, DeviceIdError> {
    let err = |why| DeviceIdError { id: name.to_string(), why };
    let rest = name.strip_prefix("gpu-").ok_or_else(|| err("DRA device name does not start with gpu-"))?;
    let (number, mig) = match rest.split_once("-mig-") {
        Some((n, profile)) if !profile.is_empty() => (n, Some(profile.to_string())),
        Some(_) => return Err(err("DRA MIG device name has no profile")),
        None => (rest, None),
    };
    let minor = number.parse().map_err(|_| err("DRA device name has no GPU number after gpu-"))?;
    Ok(GpuDevice::DraGpu { minor, mig })
}

/// Which resource names and DRA drivers are GPUs.
///
/// Always: `nvidia.com/gpu`, `nvidia.com/gpu.shared` (time-slicing with `renameByDefault`),
/// `nvidia.com/mig-*` (the device plugin's mixed MIG strategy) and the DRA driver
/// `gpu.nvidia.com`; plus every name in `KubeSettings::gpu_resource_names`, where a trailing `*`
/// matches any suffix (the same list also matches DRA driver names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuResourceNames {
    patterns: Vec<String>,
}

/// Names that are GPUs whatever the configuration says.
const BUILT_IN_GPU_NAMES: &[&str] = &["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*", "gpu.nvidia.com"];

impl GpuResourceNames {
    /// The built-in names plus `configured`.
    pub fn new<S: AsRef<str>>(configured: &[S]) -> Self {
        let mut patterns: Vec<String> = BUILT_IN_GPU_NAMES.iter().map(|s| s.to_string()).collect();
        for c in configured {
            let c = c.as_ref().trim();
            if !c.is_empty() && !patterns.iter().any(|p| p == c) {
                patterns.push(c.to_string());
            }
        }
        GpuResourceNames { patterns }
    }

    /// Whether a device-plugin resource name or DRA driver name is a GPU.
    pub(crate) fn is_gpu(&self, name: &str) -> bool {
        self.patterns.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == p,
        })
    }
}

impl Default for GpuResourceNames {
    fn default() -> Self {
        Self::new::<&str>(&[])
    }
}

/// The GPUs in one pod-resources answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GpuAllocations {
    /// Every container that holds at least one GPU, with its GPUs in the kubelet's order.
    pub by_container: BTreeMap<ContainerRef, Vec<AllocatedGpu>>,
    /// GPUs the node's device plugins can hand out (`GetAllocatableResources`; DRA devices are not
    /// listed there). Empty when the kubelet did not answer that call.
    pub allocatable: Vec<AllocatedGpu>,
    /// GPU device ids that could not be read (kept as [`GpuDevice::Unrecognised`]).
    pub unrecognised_ids: u64,
}

impl GpuAllocations {
    /// The GPU part of a `List` answer (and of `GetAllocatableResources`, when there is one).
    pub fn from_pod_resources(
        list: &api::ListPodResourcesResponse,
        allocatable: Option<&api::AllocatableResourcesResponse>,
        names: &GpuResourceNames,
    ) -> Self {
        let mut out = GpuAllocations::default();
        for pod in &list.pod_resources {
            for c in &pod.containers {
                let mut gpus = Vec::new();
                for d in &c.devices {
                    out.push_devices(&mut gpus, d, names);
                }
                for claim in &c.dynamic_resources {
                    out.push_claim(&mut gpus, claim, names);
                }
                if !gpus.is_empty() {
                    out.by_container
                        .entry(ContainerRef::new(&pod.namespace, &pod.name, &c.name))
                        .or_default()
                        .extend(gpus);
                }
            }
        }
        if let Some(a) = allocatable {
            let mut gpus = Vec::new();
            for d in &a.devices {
                out.push_devices(&mut gpus, d, names);
            }
            out.allocatable = gpus;
        }
        out
    }

    /// The GPUs allocated to `c` (empty when it has none).
    pub fn for_container(&self, c: &ContainerRef) -> &[AllocatedGpu] {
        self.by_container.get(c).map_or(&[], Vec::as_slice)
    }

    fn push_devices(&mut self, gpus: &mut Vec<AllocatedGpu>, d: &api::ContainerDevices, names: &GpuResourceNames) {
        if !names.is_gpu(&d.resource_name) {
            return;
        }
        for id in &d.device_ids {
            let (device, replica) = parse_device_id(id).unwrap_or_else(|e| {
                self.unrecognised_ids += 1;
                (GpuDevice::Unrecognised { reason: e.why.to_string() }, None)
            });
            gpus.push(AllocatedGpu {
                raw_id: id.clone(),
                via: Allocator::DevicePlugin { resource: d.resource_name.clone() },
                device,
                replica,
            });
        }
    }

    fn push_claim(&mut self, gpus: &mut Vec<AllocatedGpu>, claim: &api::DynamicResource, names: &GpuResourceNames) {
        for r in &claim.claim_resources {
            if !names.is_gpu(&r.driver_name) {
                continue;
            }
            let device = parse_dra_device_name(&r.device_name).unwrap_or_else(|e| {
                self.unrecognised_ids += 1;
                GpuDevice::Unrecognised { reason: e.why.to_string() }
            });
            gpus.push(AllocatedGpu {
                raw_id: r.device_name.clone(),
                via: Allocator::Dra {
                    driver: r.driver_name.clone(),
                    pool: r.pool_name.clone(),
                    claim_namespace: claim.claim_namespace.clone(),
                    claim_name: claim.claim_name.clone(),
                },
                device,
                replica: None,
            });
        }
    }
}

/// How the source is doing, for `doctor`, logs and a metric.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AllocationStatus {
    /// The socket polled.
    pub socket: PathBuf,
    /// The last refresh succeeded (the answer in hand is current, not a kept old one).
    pub available: bool,
    /// Wall clock of the last successful refresh, ns since the epoch.
    pub last_success_unix_ns: Option<u64>,
    /// Why the last refresh failed; `None` after a success.
    pub last_error: Option<String>,
    /// Why `GetAllocatableResources` failed at the last refresh (the `List` answer is still used).
    pub allocatable_error: Option<String>,
    /// Successful refreshes.
    pub refreshes: u64,
    /// Failed refreshes.
    pub failures: u64,
}

#[cfg(test)]
mod tests;
