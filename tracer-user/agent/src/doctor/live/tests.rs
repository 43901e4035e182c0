use super::*;
use tracer_core::{allocation::AllocationStatus, config::AttachMode, model::probes::ProbeMode};

fn report(cuda: FamilyStatus) -> ProbeReport {
    ProbeReport {
        attach_mode: ProbeMode::Attached(AttachMode::RawTracepoint),
        attach_reason: "no BTF".into(),
        driver: FamilyStatus::Attached { programs: vec!["raw_tracepoint/sys_enter".into()] },
        lifecycle: FamilyStatus::Disabled,
        cuda,
        device_check: tracer_core::model::probes::DeviceCheckReport {
            enabled: true,
            simulated_files: 0,
            detail: "character devices with an NVIDIA major".into(),
        },
        ..crate::probe::nvml_only_report()
    }
}

#[test]
fn families_map_to_statuses() {
    let no_lib = crate::cuda::attach::AttachError::NoLibrary { searched: crate::cuda::attach::SEARCH_PATHS };
    let checks = probe_checks(&report(no_lib.family_status()));
    let got: Vec<(&str, CheckStatus, &str)> = checks.iter().map(|c| (c.name, c.status, c.detail.as_str())).collect();
    let no_lib = no_lib.to_string();
    assert_eq!(
        got,
        vec![
            ("attach mode", CheckStatus::Ok, "raw-tracepoint (no BTF)"),
            ("device check", CheckStatus::Ok, "character devices with an NVIDIA major"),
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

    let k =
        KubeView { status: KubernetesStatus::NotInUse, detail: "not a Kubernetes node".into(), ..Default::default() };
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
    let before = serde_json::to_string_pretty(&serde_json::json!({ "checks": r.checks, "probes": r.probes })).unwrap();
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
