//! Which driver version's struct layouts are used: `driver_version`, else the driver's own
//! `/proc/driver/nvidia/version`, else the built-in default, and where it came from.
use super::Config;

/// The driver version in use and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedDriverVersion {
    pub version: tracer_common::nv::DriverVersion,
    pub source: String,
    /// True when read from configuration or the driver itself (not the built-in default).
    pub from_driver: bool,
}

impl ResolvedDriverVersion {
    pub fn version_string(&self) -> String {
        let v = self.version;
        format!("{}.{}.{:02}", v.major, v.minor, v.patch)
    }
}

/// Parse `535.261.03` (or the first such token in a `/proc/driver/nvidia/version` text).
pub(crate) fn parse_driver_version(text: &str) -> Option<tracer_common::nv::DriverVersion> {
    text.split_whitespace().find_map(|tok| {
        let parts: Vec<&str> = tok.split('.').collect();
        if parts.len() < 2 || parts.len() > 3 {
            return None;
        }
        let n: Vec<u32> = parts.iter().map(|p| p.parse().ok()).collect::<Option<_>>()?;
        if n[0] < 100 {
            return None; // not a driver branch number (e.g. a gcc version "12.2.0")
        }
        Some(tracer_common::nv::DriverVersion::new(n[0], n[1], n.get(2).copied().unwrap_or(0)))
    })
}

/// Driver version: configured > read from `driver_version_file` > built-in default.
pub fn resolve_driver_version(cfg: &Config) -> ResolvedDriverVersion {
    if let Some(v) = cfg.driver_version.as_deref().and_then(parse_driver_version) {
        return ResolvedDriverVersion { version: v, source: "configuration".into(), from_driver: true };
    }
    if let Ok(text) = std::fs::read_to_string(&cfg.driver_version_file) {
        // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Wed ..."
        if let Some(v) = text.lines().next().and_then(parse_driver_version) {
            return ResolvedDriverVersion {
                version: v,
                source: cfg.driver_version_file.display().to_string(),
                from_driver: true,
            };
        }
    }
    ResolvedDriverVersion {
        version: tracer_common::nv::DEFAULT_DRIVER_VERSION,
        source: format!("built-in default ({} not readable)", cfg.driver_version_file.display()),
        from_driver: false,
    }
}
