//! What the agent knows about NVML.
use std::{collections::BTreeMap, sync::Arc};

use serde::Serialize;

use crate::nvml::model::NvmlSample;

/// Whether NVML is in use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NvmlStatus {
    /// No agent has opened NVML yet (a snapshot built by hand).
    #[default]
    NotStarted,
    /// Loaded and sampled.
    Ready,
    /// `nvml.mode = "auto"` and it could not be used (the view's `reason` says why).
    Unavailable,
    /// `nvml.mode = "off"`.
    Off,
}

impl NvmlStatus {
    /// The name shown by people-facing output (same as the JSON form).
    pub fn as_str(self) -> &'static str {
        match self {
            NvmlStatus::NotStarted => "not-started",
            NvmlStatus::Ready => "ready",
            NvmlStatus::Unavailable => "unavailable",
            NvmlStatus::Off => "off",
        }
    }
}

impl std::fmt::Display for NvmlStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the agent knows about NVML: whether it is used, why not, and its latest sample.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NvmlView {
    pub status: NvmlStatus,
    /// Why NVML is not used (names the cause and the fix).
    pub reason: Option<String>,
    /// The library loaded.
    pub library: Option<String>,
    pub driver_version: Option<String>,
    pub nvml_version: Option<String>,
    /// Readings NVML refused so far, by reason (`not_supported` is a feature the GPU lacks).
    pub failed_readings: BTreeMap<&'static str, u64>,
    /// Samples taken so far.
    pub samples: u64,
    /// The latest sample.
    pub sample: Option<Arc<NvmlSample>>,
}
