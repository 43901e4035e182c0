//! The checks that need the agent started: NVML as opened, Kubernetes as started, the kubelet's
//! allocations, the attach mode and each probe family as loaded.
use super::{Check, CheckStatus, DoctorReport, static_checks};
use crate::{
    config::Config,
    model::{KubeView, KubernetesStatus, NvmlStatus, NvmlView},
    pipeline::Agent,
    probe::{FamilyStatus, ProbeReport},
};

/// The whole report: [`static_checks`], then start the agent (probes, NVML, Kubernetes) and check
/// what it found. The agent is stopped before this returns.
pub async fn run(cfg: &Config) -> DoctorReport {
    let mut checks = static_checks(cfg);
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
pub fn nvml_check(v: &NvmlView) -> Check {
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
pub fn kubernetes_checks(k: &KubeView) -> Vec<Check> {
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
pub fn probe_checks(r: &ProbeReport) -> Vec<Check> {
    let mut out = vec![Check::with("attach mode", CheckStatus::Ok, format!("{} ({})", r.attach_mode, r.attach_reason))];
    for (name, st) in [("driver family", &r.driver), ("lifecycle family", &r.lifecycle), ("cuda family", &r.cuda)] {
        out.push(family_check(name, st));
    }
    out
}

/// One probe family: attached (ok), disabled (warn), nothing to probe (warn) or failed (fail).
pub fn family_check(name: &'static str, st: &FamilyStatus) -> Check {
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
mod tests {
    use super::*;
    use crate::{allocation::source::AllocationStatus, config::AttachMode, probe::ProbeMode};

    fn report(cuda: FamilyStatus) -> ProbeReport {
        ProbeReport {
            attach_mode: ProbeMode::Attached(AttachMode::RawTracepoint),
            attach_reason: "no BTF".into(),
            driver: FamilyStatus::Attached { programs: vec!["raw_tracepoint/sys_enter".into()] },
            lifecycle: FamilyStatus::Disabled,
            cuda,
            ..ProbeReport::nvml_only()
        }
    }

    #[test]
    fn families_map_to_statuses() {
        let no_lib = crate::cuda::attach::AttachError::NoLibrary { searched: crate::cuda::attach::SEARCH_PATHS };
        let checks = probe_checks(&report(FamilyStatus::from_cuda_attach_error(&no_lib)));
        let got: Vec<(&str, CheckStatus, &str)> =
            checks.iter().map(|c| (c.name, c.status, c.detail.as_str())).collect();
        let no_lib = no_lib.to_string();
        assert_eq!(
            got,
            vec![
                ("attach mode", CheckStatus::Ok, "raw-tracepoint (no BTF)"),
                ("driver family", CheckStatus::Ok, "attached: raw_tracepoint/sys_enter"),
                ("lifecycle family", CheckStatus::Warn, "disabled by configuration"),
                ("cuda family", CheckStatus::Warn, no_lib.as_str()),
            ]
        );
        // Probes that fail on a library that is there are a failure.
        let c = family_check("cuda family", &FamilyStatus::Failed { error: "no libcuda entry point".into() });
        assert_eq!((c.status, c.detail.as_str()), (CheckStatus::Fail, "no libcuda entry point"));
    }

    #[test]
    fn nvml_and_kubernetes_checks() {
        let c = nvml_check(&NvmlView { status: NvmlStatus::Off, ..Default::default() });
        assert_eq!(c.status, CheckStatus::Warn);
        assert!(c.detail.starts_with("off by configuration"));
        let c = nvml_check(&NvmlView {
            status: NvmlStatus::Unavailable,
            reason: Some("libnvidia-ml.so.1 not found".into()),
            ..Default::default()
        });
        assert_eq!((c.name, c.status, c.detail.as_str()), ("nvml", CheckStatus::Warn, "libnvidia-ml.so.1 not found"));
        assert_eq!(nvml_check(&NvmlView::default()).detail, "not sampled");

        let k = KubeView {
            status: KubernetesStatus::NotInUse,
            detail: "not a Kubernetes node".into(),
            ..Default::default()
        };
        let c = kubernetes_checks(&k);
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].name, c[0].status), ("kubernetes", CheckStatus::Warn));
        let k = KubeView {
            status: KubernetesStatus::Running,
            detail: "watching".into(),
            pod_resources: Some(AllocationStatus {
                socket: "/k.sock".into(),
                available: false,
                last_success_unix_ns: None,
                last_error: None,
                allocatable_error: None,
                refreshes: 0,
                failures: 0,
            }),
            ..Default::default()
        };
        let c = kubernetes_checks(&k);
        assert_eq!(c[0].status, CheckStatus::Ok);
        assert_eq!(
            (c[1].name, c[1].status, c[1].detail.as_str()),
            ("kubelet allocations", CheckStatus::Warn, "/k.sock: no answer yet")
        );
    }

    #[test]
    fn text_and_json_keep_their_form() {
        let r = DoctorReport {
            checks: vec![
                Check::with("kernel", CheckStatus::Ok, "Linux 6.1"),
                Check::with("btf", CheckStatus::Warn, "none"),
                Check::with("probes", CheckStatus::Fail, "no CAP_BPF"),
            ],
            probes: Some(report(FamilyStatus::Disabled)),
        };
        assert_eq!(
            r.render_text(),
            "ok    kernel               Linux 6.1\nwarn  btf                  none\nfail  probes               no CAP_BPF\n"
        );
        assert!(r.failed());
        // What `doctor --json` printed before the report had a type: json!{} of the parts.
        let before =
            serde_json::to_string_pretty(&serde_json::json!({ "checks": r.checks, "probes": r.probes })).unwrap();
        assert_eq!(r.to_json().unwrap(), before);
        let v: serde_json::Value = serde_json::from_str(&before).unwrap();
        assert_eq!(v["checks"][0], serde_json::json!({ "name": "kernel", "status": "ok", "detail": "Linux 6.1" }));
        assert_eq!(v["checks"][2]["status"], "fail");
        assert_eq!(v["probes"]["cuda"]["state"], "disabled");
        assert_eq!(v["probes"]["attach_mode"], "raw-tracepoint");
        let ok = DoctorReport { checks: vec![Check::with("kernel", CheckStatus::Warn, "x")], probes: None };
        assert!(!ok.failed());
        assert_eq!(
            ok.to_json().unwrap(),
            "{\n  \"checks\": [\n    {\n      \"detail\": \"x\",\n      \"name\": \"kernel\",\n      \"status\": \"warn\"\n    }\n  ],\n  \"probes\": null\n}"
        );
    }
}
