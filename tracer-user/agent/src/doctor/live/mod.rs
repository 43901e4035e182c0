//! The checks that need the agent started: NVML as opened, Kubernetes as started, the kubelet's
//! allocations, the attach mode and each probe family as loaded.
use super::{Check, CheckStatus, DoctorReport, static_checks};
use crate::pipeline::Agent;
use tracer_core::{
    config::Config,
    model::{
        KubeView, KubernetesStatus, NvmlStatus, NvmlView,
        probes::{FamilyStatus, ProbeReport},
    },
};

/// The whole report: [`static_checks`], then start the agent (probes, NVML, Kubernetes) and check
/// what it found. The agent is stopped before this returns.
pub async fn run(cfg: &Config) -> DoctorReport {
    let mut checks = static_checks(cfg);
    checks.extend(super::exporter_checks(cfg, |k| std::env::var(k).ok()));
    // Values the agent cannot start with are already the `config` check's failure.
    if cfg.validate().is_err() {
        checks.push(Check::with(
            "probes",
            CheckStatus::Fail,
            "not loaded: the configuration is invalid (see `config`)",
        ));
        return DoctorReport { checks, probes: None };
    }
    let probes = match Agent::start(cfg.clone()) {
        Ok(mut agent) => {
            checks.push(nvml_check(&agent.snapshot().nvml));
            match agent.start_kubernetes().await {
                Err(e) => checks.push(Check::with("kubernetes", CheckStatus::Fail, format!("{e:#}"))),
                Ok(()) => checks.extend(kubernetes_checks(&agent.snapshot().kubernetes)),
            }
            let report = agent.report().clone();
            checks.extend(probe_checks(&report));
            Some(report)
        }
        Err(e) => {
            checks.push(Check::with("probes", CheckStatus::Fail, format!("{e:#}")));
            None
        }
    };
    DoctorReport { checks, probes }
}

/// `nvml`: loaded (with the versions and GPU count), off by configuration, or why not.
pub(crate) fn nvml_check(v: &NvmlView) -> Check {
    let (status, detail) = match (v.status, &v.sample) {
        (NvmlStatus::Ready, Some(s)) => (
            CheckStatus::Ok,
            format!(
                "{} loaded: driver {}, NVML {}, {} GPU(s){}",
                v.library.as_deref().unwrap_or("libnvidia-ml.so.1"),
                v.driver_version.as_deref().unwrap_or("?"),
                v.nvml_version.as_deref().unwrap_or("?"),
                s.devices.len(),
                if s.devices.iter().any(|d| d.lost) { " (some lost: fell off the bus?)" } else { "" }
            ),
        ),
        (NvmlStatus::Off, _) => {
            (CheckStatus::Warn, "off by configuration: per-process memory and SM share come only from eBPF".into())
        }
        (_, _) => (CheckStatus::Warn, v.reason.clone().unwrap_or_else(|| "not sampled".into())),
    };
    Check::with("nvml", status, detail)
}

/// `kubernetes` (running or why not) and, when the kubelet's pod-resources API is polled,
/// `kubelet allocations`.
pub(crate) fn kubernetes_checks(k: &KubeView) -> Vec<Check> {
    let status = if k.status == KubernetesStatus::Running { CheckStatus::Ok } else { CheckStatus::Warn };
    let mut out = vec![Check::with("kubernetes", status, k.detail.clone())];
    if let Some(p) = &k.pod_resources {
        let (status, detail) = match (&p.last_error, p.available) {
            (_, true) => (CheckStatus::Ok, format!("{} answers", p.socket.display())),
            (Some(e), false) => (CheckStatus::Warn, e.clone()),
            (None, false) => (CheckStatus::Warn, format!("{}: no answer yet", p.socket.display())),
        };
        out.push(Check::with("kubelet allocations", status, detail));
    }
    out
}

/// `attach mode`, then one check per probe family.
pub(crate) fn probe_checks(r: &ProbeReport) -> Vec<Check> {
    let mut out = vec![Check::with("attach mode", CheckStatus::Ok, format!("{} ({})", r.attach_mode, r.attach_reason))];
    if !matches!(r.attach_mode, tracer_core::model::probes::ProbeMode::NvmlOnly) {
        out.push(device_check(&r.device_check));
    }
    for (name, st) in [("driver family", &r.driver), ("lifecycle family", &r.lifecycle), ("cuda family", &r.cuda)] {
        out.push(family_check(name, st));
    }
    out
}

/// How NVIDIA fds are recognised: by the device (ok), with simulated files trusted (warn: never on
/// a real node), or by path alone (warn: anyone can feed the tracer a file with an NVIDIA name).
pub fn device_check(d: &tracer_core::model::probes::DeviceCheckReport) -> Check {
    let status = if !d.enabled || d.simulated_files > 0 { CheckStatus::Warn } else { CheckStatus::Ok };
    let mut detail = d.detail.clone();
    if !d.enabled {
        detail.push_str(
            "; any user who can create a file with an NVIDIA name in their own mount namespace can feed the              tracer. Fix: run on a kernel with BTF (CONFIG_DEBUG_INFO_BTF)",
        );
    } else if d.simulated_files > 0 {
        detail.push_str("; simulated devices are for the fake driver and sim only, never a real node");
    }
    Check::with("device check", status, detail)
}

/// One probe family: attached (ok), disabled (warn), nothing to probe (warn) or failed (fail).
pub(crate) fn family_check(name: &'static str, st: &FamilyStatus) -> Check {
    let (status, detail) = match st {
        FamilyStatus::Attached { programs } => (CheckStatus::Ok, format!("attached: {}", programs.join(", "))),
        FamilyStatus::Disabled => (CheckStatus::Warn, "disabled by configuration".to_string()),
        // A node without libcuda has nothing for the cuda family to probe: worth a warning, not a
        // failure (the driver family still attributes memory).
        FamilyStatus::NothingToProbe { error } => (CheckStatus::Warn, error.clone()),
        FamilyStatus::Failed { error } => (CheckStatus::Fail, error.clone()),
    };
    Check::with(name, status, detail)
}

#[cfg(test)]
mod tests;
