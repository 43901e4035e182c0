//! Guardrails: a process that uses a GPU (opens `/dev/nvidiaN`, or appears in NVML's process list)
//! from a container that was not allocated that GPU is a violation — `NVIDIA_VISIBLE_DEVICES=all`,
//! a hostPath mount of `/dev`, a sidecar borrowing its neighbour's GPU.
//!
//! [`Guardrails::evaluate`] is pure apart from what it remembers: given one interval's
//! [`GpuProcessObservation`]s, NVML's [`GpuMap`] and the kubelet's [`GpuAllocations`], it returns the
//! *new* [`Violation`]s — exactly one per (container, GPU, kind) for the container's lifetime — and
//! counts them per kind for a metric. Allocations are mapped back to physical GPUs first: a
//! time-slicing replica or a MIG device grants its parent GPU's `/dev/nvidiaN` (that is the node a
//! process on a MIG device opens). `/dev/nvidiactl`, `/dev/nvidia-uvm` and the caps nodes are not
//! GPUs and never count.
//!
//! [`read_visible_devices`] reads the only two environment entries the agent ever looks at.
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::allocation::{AllocatedGpu, ContainerRef, GpuAllocations, GpuDevice};
use crate::decode::{Device, DeviceKind};
use crate::nvml::model::NvmlSample;

/// A MIG device of a [`PhysicalGpu`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MigDevice {
    /// Index under the parent.
    pub index: u32,
    /// `MIG-…` UUID.
    pub uuid: String,
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
}

/// One physical GPU as NVML names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PhysicalGpu {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// `/dev/nvidia<minor>`; `None` when NVML could not say.
    pub minor: Option<u32>,
    pub migs: Vec<MigDevice>,
}

/// GPU UUID ↔ minor ↔ NVML index (and MIG UUID → parent), from NVML.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GpuMap {
    pub gpus: Vec<PhysicalGpu>,
}

impl GpuMap {
    /// The map from one NVML sample.
    pub fn from_nvml(sample: &NvmlSample) -> Self {
        let gpus = sample
            .devices
            .iter()
            .map(|d| PhysicalGpu {
                index: d.index,
                uuid: d.uuid.clone(),
                minor: d.minor,
                migs: d
                    .mig_instances
                    .iter()
                    .map(|m| MigDevice {
                        index: m.index,
                        uuid: m.uuid.clone(),
                        gpu_instance_id: m.gpu_instance_id,
                        compute_instance_id: m.compute_instance_id,
                    })
                    .collect(),
            })
            .collect();
        GpuMap { gpus }
    }

    /// The GPU behind `/dev/nvidia<minor>`.
    pub fn by_minor(&self, minor: u32) -> Option<&PhysicalGpu> {
        self.gpus.iter().find(|g| g.minor == Some(minor))
    }

    /// The physical GPU with this `GPU-…` UUID.
    pub(crate) fn by_uuid(&self, uuid: &str) -> Option<&PhysicalGpu> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }

    /// The GPU at this NVML index.
    pub fn by_index(&self, index: u32) -> Option<&PhysicalGpu> {
        self.gpus.iter().find(|g| g.index == index)
    }

    /// The parent GPU and the MIG device with this `MIG-…` UUID.
    pub fn mig(&self, mig_uuid: &str) -> Option<(&PhysicalGpu, &MigDevice)> {
        self.gpus.iter().find_map(|g| g.migs.iter().find(|m| m.uuid == mig_uuid).map(|m| (g, m)))
    }

    /// A [`GpuRef`] for the physical GPU behind a minor.
    fn ref_for_minor(&self, minor: u32) -> GpuRef {
        match self.by_minor(minor) {
            Some(g) => GpuRef::physical(g),
            None => GpuRef { minor: Some(minor), ..Default::default() },
        }
    }

    /// A [`GpuRef`] for a UUID NVML listed a process on (a GPU or a MIG device).
    fn ref_for_uuid(&self, uuid: &str) -> GpuRef {
        if let Some(g) = self.by_uuid(uuid) {
            return GpuRef::physical(g);
        }
        if let Some((g, m)) = self.mig(uuid) {
            return GpuRef { mig_uuid: Some(m.uuid.clone()), ..GpuRef::physical(g) };
        }
        if uuid.starts_with("MIG-") {
            GpuRef { mig_uuid: Some(uuid.into()), ..Default::default() }
        } else {
            GpuRef { uuid: Some(uuid.into()), ..Default::default() }
        }
    }
}

/// Which GPU a violation is about. Fields NVML could not tie together stay `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct GpuRef {
    /// The physical GPU's `GPU-…` UUID.
    pub uuid: Option<String>,
    pub minor: Option<u32>,
    /// NVML index.
    pub index: Option<u32>,
    /// The MIG device, when the sighting was on one.
    pub mig_uuid: Option<String>,
}

impl GpuRef {
    fn physical(g: &PhysicalGpu) -> Self {
        GpuRef { uuid: Some(g.uuid.clone()), minor: g.minor, index: Some(g.index), mig_uuid: None }
    }

    /// The key a violation is deduplicated on: the physical GPU when known.
    fn physical_key(&self) -> String {
        match (&self.uuid, self.minor, &self.mig_uuid) {
            (Some(u), _, _) => u.clone(),
            (None, Some(m), _) => format!("minor:{m}"),
            (None, None, Some(m)) => m.clone(),
            (None, None, None) => String::new(),
        }
    }
}

/// A process's `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES` (unset: `None`). Nothing else of
/// the environment is ever read into the agent.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct VisibleDevices {
    pub nvidia: Option<String>,
    pub cuda: Option<String>,
}

impl VisibleDevices {
    /// `NVIDIA_VISIBLE_DEVICES=all`: the NVIDIA container runtime mounts every GPU.
    pub(crate) fn nvidia_all(&self) -> bool {
        self.nvidia.as_deref().is_some_and(|v| v.trim() == "all")
    }
}

/// What the agent saw one GPU process do in an interval.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuProcessObservation {
    /// Host PID.
    pub pid: u32,
    /// Its container; `None` for a host process (never a violation).
    pub container: Option<ContainerRef>,
    /// NVIDIA device nodes it holds open (the eBPF fd table); only [`DeviceKind::Gpu`] counts.
    pub opened: Vec<Device>,
    /// UUIDs NVML lists it on: `GPU-…`, or `MIG-…` for a MIG device.
    pub nvml_uuids: Vec<String>,
    pub visible_devices: VisibleDevices,
}

/// The kinds of violation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ViolationKind {
    /// A container with GPUs opened `/dev/nvidiaN` of a GPU it was not allocated.
    UnallocatedGpuOpen,
    /// NVML lists a process of a container with GPUs on a GPU (or MIG device) it was not allocated.
    UnallocatedGpuInNvml,
    /// A container that was allocated no GPU uses one.
    GpuUseWithoutAllocation,
    /// A container that was allocated no GPU runs with `NVIDIA_VISIBLE_DEVICES=all`.
    VisibleDevicesAllWithoutRequest,
}

impl ViolationKind {
    /// Every kind, in a stable order.
    pub const ALL: [ViolationKind; 4] = [
        ViolationKind::UnallocatedGpuOpen,
        ViolationKind::UnallocatedGpuInNvml,
        ViolationKind::GpuUseWithoutAllocation,
        ViolationKind::VisibleDevicesAllWithoutRequest,
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ViolationKind::UnallocatedGpuOpen => "unallocated_gpu_open",
            ViolationKind::UnallocatedGpuInNvml => "unallocated_gpu_in_nvml",
            ViolationKind::GpuUseWithoutAllocation => "gpu_use_without_allocation",
            ViolationKind::VisibleDevicesAllWithoutRequest => "visible_devices_all_without_request",
        }
    }
}

/// Why a violation was raised.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Evidence {
    /// The GPU device node it opened, e.g. `/dev/nvidia1`.
    pub device_path: Option<PathBuf>,
    /// The UUID NVML listed it on.
    pub nvml_uuid: Option<String>,
    pub visible_devices: VisibleDevices,
    /// What the container was allocated (raw kubelet ids; empty: nothing).
    pub allocated: Vec<String>,
}

/// One violation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub kind: ViolationKind,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// The process that showed it (the first one seen).
    pub pid: u32,
    /// `None` for [`ViolationKind::VisibleDevicesAllWithoutRequest`] (all GPUs).
    pub gpu: Option<GpuRef>,
    pub evidence: Evidence,
}

/// Violations raised so far, per kind, and what could not be checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ViolationCounts {
    pub unallocated_gpu_open: u64,
    pub unallocated_gpu_in_nvml: u64,
    pub gpu_use_without_allocation: u64,
    pub visible_devices_all_without_request: u64,
    /// GPU uses that could not be checked: the GPU (or an allocation) could not be tied to a
    /// physical GPU through NVML's map. Never guessed into a violation.
    pub unresolved: u64,
}

impl ViolationCounts {
    /// The count for one kind.
    pub fn get(&self, kind: ViolationKind) -> u64 {
        match kind {
            ViolationKind::UnallocatedGpuOpen => self.unallocated_gpu_open,
            ViolationKind::UnallocatedGpuInNvml => self.unallocated_gpu_in_nvml,
            ViolationKind::GpuUseWithoutAllocation => self.gpu_use_without_allocation,
            ViolationKind::VisibleDevicesAllWithoutRequest => self.visible_devices_all_without_request,
        }
    }

    fn bump(&mut self, kind: ViolationKind) {
        *match kind {
            ViolationKind::UnallocatedGpuOpen => &mut self.unallocated_gpu_open,
            ViolationKind::UnallocatedGpuInNvml => &mut self.unallocated_gpu_in_nvml,
            ViolationKind::GpuUseWithoutAllocation => &mut self.gpu_use_without_allocation,
            ViolationKind::VisibleDevicesAllWithoutRequest => &mut self.visible_devices_all_without_request,
        } += 1;
    }
}

/// What a container's allocations grant, as physical GPUs and MIG devices.
#[derive(Default)]
struct Grants {
    /// Parents of everything granted: the `/dev/nvidiaN` nodes it may open.
    physical: BTreeSet<String>,
    /// Whole GPUs (device plugin GPU ids and replicas, DRA `gpu-N`).
    whole: BTreeSet<String>,
    mig: BTreeSet<String>,
    /// Parents with a MIG device granted that NVML's map cannot name exactly (DRA MIG names).
    any_mig_on: BTreeSet<String>,
    /// Some allocation could not be tied to a physical GPU: a use that is not in the grants
    /// might still be allowed by it, so it is counted as unresolved, not raised.
    complete: bool,
}

impl Grants {
    fn of(allocated: &[AllocatedGpu], map: &GpuMap) -> Self {
        let mut g = Grants { complete: true, ..Default::default() };
        for a in allocated {
            match &a.device {
                GpuDevice::Gpu { uuid } => g.whole_gpu(uuid),
                GpuDevice::Index { index } => match map.by_index(*index) {
                    Some(p) => g.whole_gpu(&p.uuid),
                    None => g.complete = false,
                },
                GpuDevice::DraGpu { minor, mig } => match (map.by_minor(*minor), mig) {
                    (Some(p), None) => g.whole_gpu(&p.uuid),
                    (Some(p), Some(_)) => g.any_mig(&p.uuid),
                    (None, _) => g.complete = false,
                },
                GpuDevice::Mig { uuid } => match map.mig(uuid) {
                    Some((p, m)) => g.mig_device(&p.uuid, &m.uuid),
                    None => {
                        g.mig.insert(uuid.clone());
                        g.complete = false;
                    }
                },
                GpuDevice::MigLegacy { parent_uuid, gpu_instance, compute_instance } => {
                    let exact = map.by_uuid(parent_uuid).and_then(|p| {
                        p.migs.iter().find(|m| {
                            m.gpu_instance_id == Some(*gpu_instance) && m.compute_instance_id == Some(*compute_instance)
                        })
                    });
                    match exact {
                        Some(m) => g.mig_device(parent_uuid, &m.uuid),
                        None => g.any_mig(parent_uuid),
                    }
                }
                GpuDevice::MigIndex { parent_index, mig_index } => match map.by_index(*parent_index) {
                    Some(p) => match p.migs.iter().find(|m| m.index == *mig_index) {
                        Some(m) => g.mig_device(&p.uuid, &m.uuid),
                        None => g.any_mig(&p.uuid),
                    },
                    None => g.complete = false,
                },
                GpuDevice::Unrecognised { .. } => g.complete = false,
            }
        }
        g
    }

    fn whole_gpu(&mut self, uuid: &str) {
        self.physical.insert(uuid.into());
        self.whole.insert(uuid.into());
    }

    fn mig_device(&mut self, parent: &str, mig: &str) {
        self.physical.insert(parent.into());
        self.mig.insert(mig.into());
    }

    fn any_mig(&mut self, parent: &str) {
        self.physical.insert(parent.into());
        self.any_mig_on.insert(parent.into());
    }

    /// Whether opening the GPU `r` is granted (`None`: cannot tell).
    fn allows_open(&self, r: &GpuRef) -> Option<bool> {
        match &r.uuid {
            Some(u) if self.physical.contains(u) => Some(true),
            Some(_) if self.complete => Some(false),
            _ => None,
        }
    }

    /// Whether NVML listing the process on `r` is granted (`None`: cannot tell).
    fn allows_sighting(&self, r: &GpuRef) -> Option<bool> {
        let allowed = match (&r.mig_uuid, &r.uuid) {
            (Some(m), parent) => {
                self.mig.contains(m)
                    || parent.as_ref().is_some_and(|p| self.whole.contains(p) || self.any_mig_on.contains(p))
            }
            (None, Some(p)) => self.physical.contains(p),
            (None, None) => return None,
        };
        if allowed {
            Some(true)
        } else if self.complete && (r.uuid.is_some()) {
            Some(false)
        } else {
            None
        }
    }
}

/// The guardrails engine: remembers what it raised, so each (container, GPU, kind) is raised once
/// until the container goes ([`Guardrails::forget_container`]).
#[derive(Debug)]
pub struct Guardrails {
    dev_dir: PathBuf,
    raised: HashSet<(ContainerRef, ViolationKind, String)>,
    counts: ViolationCounts,
}

impl Guardrails {
    /// An engine that names GPU nodes under `dev_dir` (`/dev`) in its evidence.
    pub fn new(dev_dir: impl Into<PathBuf>) -> Self {
        Guardrails { dev_dir: dev_dir.into(), raised: HashSet::new(), counts: ViolationCounts::default() }
    }

    /// The new violations of one interval. Call it only with an answer the kubelet actually gave
    /// (`AllocationSource::current()` is `None` until then): with no allocations known, every GPU
    /// container would look unallocated.
    pub fn evaluate(
        &mut self,
        processes: &[GpuProcessObservation],
        gpus: &GpuMap,
        allocations: &GpuAllocations,
    ) -> Vec<Violation> {
        let mut out = Vec::new();
        for p in processes {
            let Some(container) = &p.container else { continue };
            let allocated = allocations.for_container(container);
            // Candidates of this process, merged by (kind, GPU) so an open and an NVML sighting of
            // the same GPU make one violation carrying both.
            let mut found: BTreeMap<(ViolationKind, String), (Option<GpuRef>, Evidence)> = BTreeMap::new();
            let mut add = |kind, gpu: Option<GpuRef>, path: Option<PathBuf>, nvml: Option<String>| {
                let key = gpu.as_ref().map_or_else(|| "all".to_string(), GpuRef::physical_key);
                let e = found.entry((kind, key)).or_insert_with(|| {
                    (
                        gpu,
                        Evidence {
                            visible_devices: p.visible_devices.clone(),
                            allocated: allocated.iter().map(|a| a.raw_id.clone()).collect(),
                            ..Default::default()
                        },
                    )
                });
                e.1.device_path = e.1.device_path.take().or(path);
                e.1.nvml_uuid = e.1.nvml_uuid.take().or(nvml);
            };
            let minors: BTreeSet<u32> =
                p.opened.iter().filter(|d| d.kind == DeviceKind::Gpu).map(|d| d.minor).collect();
            let path = |minor: u32| Some(self.dev_dir.join(format!("nvidia{minor}")));
            if allocated.is_empty() {
                if p.visible_devices.nvidia_all() {
                    add(ViolationKind::VisibleDevicesAllWithoutRequest, None, None, None);
                }
                for &minor in &minors {
                    add(ViolationKind::GpuUseWithoutAllocation, Some(gpus.ref_for_minor(minor)), path(minor), None);
                }
                for uuid in &p.nvml_uuids {
                    let r = gpus.ref_for_uuid(uuid);
                    add(ViolationKind::GpuUseWithoutAllocation, Some(r), None, Some(uuid.clone()));
                }
            } else {
                let grants = Grants::of(allocated, gpus);
                for &minor in &minors {
                    let r = gpus.ref_for_minor(minor);
                    match grants.allows_open(&r) {
                        Some(true) => {}
                        Some(false) => add(ViolationKind::UnallocatedGpuOpen, Some(r), path(minor), None),
                        None => self.counts.unresolved += 1,
                    }
                }
                for uuid in &p.nvml_uuids {
                    let r = gpus.ref_for_uuid(uuid);
                    match grants.allows_sighting(&r) {
                        Some(true) => {}
                        Some(false) => add(ViolationKind::UnallocatedGpuInNvml, Some(r), None, Some(uuid.clone())),
                        None => self.counts.unresolved += 1,
                    }
                }
            }
            for ((kind, key), (gpu, evidence)) in found {
                if self.raised.insert((container.clone(), kind, key)) {
                    self.counts.bump(kind);
                    out.push(Violation {
                        kind,
                        namespace: container.namespace.clone(),
                        pod: container.pod.clone(),
                        container: container.container.clone(),
                        pid: p.pid,
                        gpu,
                        evidence,
                    });
                }
            }
        }
        out
    }

    #[cfg(test)]
    /// Forget a container that went away: if it comes back under the same names it is judged anew.
    pub(crate) fn forget_container(&mut self, container: &ContainerRef) {
        self.raised.retain(|(c, _, _)| c != container);
    }

    /// Keep only what was raised for containers `live` says still exist.
    pub fn retain_containers(&mut self, mut live: impl FnMut(&ContainerRef) -> bool) {
        self.raised.retain(|(c, _, _)| live(c));
    }

    /// Violations raised so far, per kind (for a counter metric).
    pub fn counts(&self) -> ViolationCounts {
        self.counts
    }
}

/// Reading a process environment failed.
#[derive(Debug, thiserror::Error)]
pub enum EnvironError {
    /// The process exited.
    #[error("process {pid} is gone ({path} does not exist)")]
    Gone { pid: u32, path: PathBuf },
    /// Not allowed to read it.
    #[error(
        "cannot read {path}: permission denied; the agent needs CAP_SYS_PTRACE (or to run as the \
         process's user) to read another process's environment"
    )]
    Denied { pid: u32, path: PathBuf },
    /// Any other read error.
    #[error("cannot read {path}: {source}")]
    Io {
        pid: u32,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl EnvironError {
    /// A short, stable reason for a metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            EnvironError::Gone { .. } => "gone",
            EnvironError::Denied { .. } => "denied",
            EnvironError::Io { .. } => "io",
        }
    }
}

/// Longest value kept; real ones (a list of UUIDs) are far shorter.
const MAX_VALUE_BYTES: usize = 4096;

/// `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES` of `pid`, from `<proc_root>/<pid>/environ`
/// (the environment it was started with; a process still inside `execve` reads as empty, so read
/// it at a GPU open, not at exec). Every other entry is skipped as it is read: it is never stored,
/// returned or logged.
pub fn read_visible_devices(proc_root: &Path, pid: u32) -> Result<VisibleDevices, EnvironError> {
    let path = proc_root.join(pid.to_string()).join("environ");
    let io_err = |source: std::io::Error| match source.kind() {
        std::io::ErrorKind::NotFound => EnvironError::Gone { pid, path: path.clone() },
        std::io::ErrorKind::PermissionDenied => EnvironError::Denied { pid, path: path.clone() },
        _ => EnvironError::Io { pid, path: path.clone(), source },
    };
    let mut bytes = Vec::new();
    std::fs::File::open(&path).and_then(|mut f| f.read_to_end(&mut bytes)).map_err(io_err)?;
    let mut out = VisibleDevices::default();
    for entry in bytes.split(|&b| b == 0) {
        let slot = if let Some(v) = entry.strip_prefix(b"NVIDIA_VISIBLE_DEVICES=") {
            (&mut out.nvidia, v)
        } else if let Some(v) = entry.strip_prefix(b"CUDA_VISIBLE_DEVICES=") {
            (&mut out.cuda, v)
        } else {
            continue;
        };
        let value = &slot.1[..slot.1.len().min(MAX_VALUE_BYTES)];
        *slot.0 = Some(String::from_utf8_lossy(value).into_owned());
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
