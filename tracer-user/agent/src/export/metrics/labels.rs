//! Label sets shared by several families: a container's identity ([`ContainerLabels`], and the
//! [`ContainerResolver`] that fills it in) and a GPU's ([`GpuIdLabels`]).
use std::fmt;

use super::LabelSet;

/// The identity labels of every per-container series.
///
/// `cgroup` is always set (the cgroup path, or `id:N` when the path is unknown); `namespace`,
/// `pod` and `container` are empty strings until a [`ContainerResolver`] knows them (an empty
/// label value is the same as no label to Prometheus, so queries need not change later).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContainerLabels {
    /// Kubernetes namespace of the pod.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name within the pod.
    pub container: String,
    /// cgroup v2 path (relative to the cgroup root).
    pub cgroup: String,
}

impl ContainerLabels {
    /// Labels that carry only the cgroup: its path, or `id:N` when the path was never resolved.
    pub(crate) fn for_cgroup(cgroup_id: u64, path: Option<&str>) -> Self {
        ContainerLabels { cgroup: path.map_or_else(|| format!("id:{cgroup_id}"), str::to_owned), ..Default::default() }
    }
}

impl LabelSet for ContainerLabels {
    fn visit(&self, label: &mut dyn FnMut(&str, &str) -> fmt::Result) -> fmt::Result {
        label("namespace", &self.namespace)?;
        label("pod", &self.pod)?;
        label("container", &self.container)?;
        label("cgroup", &self.cgroup)
    }
}

/// Maps a cgroup to its container identity (the Kubernetes enrichment plugs in here).
pub trait ContainerResolver: Send + Sync + 'static {
    /// The labels of the series of one cgroup row. Rows that resolve to the same labels are summed.
    fn labels(&self, cgroup_id: u64, cgroup_path: Option<&str>) -> ContainerLabels;
}

/// The resolver used without Kubernetes: the cgroup label only.
#[derive(Clone, Copy, Debug, Default)]
pub struct CgroupOnly;

impl ContainerResolver for CgroupOnly {
    fn labels(&self, cgroup_id: u64, cgroup_path: Option<&str>) -> ContainerLabels {
        ContainerLabels::for_cgroup(cgroup_id, cgroup_path)
    }
}

impl<F> ContainerResolver for F
where
    F: Fn(u64, Option<&str>) -> ContainerLabels + Send + Sync + 'static,
{
    fn labels(&self, cgroup_id: u64, cgroup_path: Option<&str>) -> ContainerLabels {
        self(cgroup_id, cgroup_path)
    }
}

/// Labels of a GPU in the attribution and NVML families: `gpu` is the `GPU-…` or `MIG-…` UUID,
/// `device` dcgm-exporter's `nvidiaN` (empty when the minor is unknown), `mig_profile` the MIG
/// profile of a MIG instance (empty for a whole GPU).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GpuIdLabels {
    /// `GPU-…` or `MIG-…` UUID.
    pub gpu: String,
    /// `nvidiaN` (the physical GPU's `/dev/nvidiaN`), or empty.
    pub device: String,
    /// e.g. `3g.71gb`; empty off MIG.
    pub mig_profile: String,
}

impl GpuIdLabels {
    pub(super) fn new(uuid: &str, minor: Option<u32>, mig_profile: Option<&str>) -> Self {
        GpuIdLabels {
            gpu: uuid.to_owned(),
            device: minor.map(|m| format!("nvidia{m}")).unwrap_or_default(),
            mig_profile: mig_profile.unwrap_or_default().to_owned(),
        }
    }
}

impl LabelSet for GpuIdLabels {
    fn visit(&self, label: &mut dyn FnMut(&str, &str) -> fmt::Result) -> fmt::Result {
        label("gpu", &self.gpu)?;
        label("device", &self.device)?;
        label("mig_profile", &self.mig_profile)
    }
}
