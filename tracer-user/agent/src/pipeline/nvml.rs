//! The NVML side of the agent: the sampler (when NVML is in use) and its last two samples.
use std::sync::Arc;

use super::StartError;
use crate::nvml::sampler::{NvmlOpen, NvmlSource};
use tracer_core::{
    clock,
    config::Config,
    model::{NvmlStatus, NvmlView},
    nvml::model::NvmlSample,
};

/// The NVML sampler and its latest samples.
pub(super) struct NvmlSide {
    source: Option<NvmlSource>,
    status: NvmlStatus,
    reason: Option<String>,
    /// The latest sample and the one before it (energy deltas, rates).
    pub(super) last: Option<Arc<NvmlSample>>,
    pub(super) prev: Option<Arc<NvmlSample>>,
}

impl NvmlSide {
    /// Open NVML as the configuration says (`required` and missing is an error).
    pub(super) fn open(cfg: &Config) -> Result<NvmlSide, StartError> {
        let side = |source, status, reason| NvmlSide { source, status, reason, last: None, prev: None };
        Ok(match NvmlSource::open(cfg)? {
            NvmlOpen::Ready(s) => side(Some(*s), NvmlStatus::Ready, None),
            NvmlOpen::Unavailable(e) => {
                tracing::warn!(reason = e.reason(), "NVML not used: {e}");
                side(None, NvmlStatus::Unavailable, Some(e.to_string()))
            }
            NvmlOpen::Off => side(None, NvmlStatus::Off, Some("nvml.mode = \"off\"".into())),
        })
    }

    /// Is NVML in use?
    pub(super) fn in_use(&self) -> bool {
        self.source.is_some()
    }

    /// Is a sample due: NVML in use and none yet, or 90 % of `interval_ms` passed since the last?
    pub(super) fn due(&self, interval_ms: u64) -> bool {
        let period = interval_ms.max(1) * 1_000_000 * 9 / 10;
        self.in_use()
            && self.last.as_ref().is_none_or(|l| clock::monotonic_ns().saturating_sub(l.taken_mono_ns) >= period)
    }

    /// Take a sample now (when NVML is in use).
    pub(super) fn sample(&mut self) {
        if let Some(src) = self.source.as_mut() {
            let s = Arc::new(src.sample());
            self.prev = self.last.replace(s);
        }
    }

    /// The model's view: status, reason, library, counters and the latest sample.
    pub(super) fn view(&self) -> NvmlView {
        let st = self.source.as_ref().map(|s| s.status());
        NvmlView {
            status: self.status,
            reason: self.reason.clone(),
            library: st.map(|s| s.library.display().to_string()),
            driver_version: st.and_then(|s| s.driver_version.clone()),
            nvml_version: st.and_then(|s| s.nvml_version.clone()),
            failed_readings: st.map(|s| s.failed_readings.clone()).unwrap_or_default(),
            samples: st.map_or(0, |s| s.samples),
            sample: self.last.clone(),
        }
    }
}
