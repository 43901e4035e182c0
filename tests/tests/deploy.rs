//! The Kubernetes deployment: plain manifests, the privileged overlay and the Helm chart are
//! rendered (real Helm engine, real kustomize) and validated against the Kubernetes OpenAPI
//! schemas in strict mode (unknown fields are errors) by `deploy/validate.py`; this test then
//! checks the security invariants of docs/security.md on the objects it prints. No root needed;
//! it fails (never skips) when the tools `cargo xtask setup` installs are missing.
use std::{collections::BTreeSet, path::PathBuf, process::Command};

use serde_json::Value;

/// The least-privilege capability set of docs/security.md.
const CAPS: [&str; 4] = ["BPF", "PERFMON", "SYS_PTRACE", "DAC_READ_SEARCH"];

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The venv `cargo xtask setup` fills (kept in step with xtask/src/setup/mod.rs).
fn deploy_python() -> PathBuf {
    gpu_tracer_tests::venv_python()
}

fn render(root: &std::path::Path) -> Result<Value, String> {
    let py = deploy_python();
    assert!(
        py.exists(),
        "{} not found: the deployment validator (helm-python-sdk, kubernetes-validate) is missing; run \
         `cargo xtask setup` (or set GPU_TRACER_DEPLOY_VENV)",
        py.display()
    );
    let extra = serde_json::json!({ "every_config_key": { "config": every_config_key() } });
    let out = Command::new(&py)
        .arg(root.join("deploy/validate.py"))
        .arg(root)
        .env("GPU_TRACER_EXTRA_VARIANTS", extra.to_string())
        .output()
        .expect("run validate.py");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).expect("validate.py prints JSON"))
}

fn find<'a>(objs: &'a Value, kind: &str) -> &'a Value {
    objs.as_array().unwrap().iter().find(|o| o["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"))
}

fn container(ds: &Value) -> &Value {
    let cs = ds["spec"]["template"]["spec"]["containers"].as_array().unwrap();
    assert_eq!(cs.len(), 1, "one container");
    &cs[0]
}

fn strings(v: &Value) -> BTreeSet<String> {
    v.as_array().map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect()).unwrap_or_default()
}

fn config_of(objs: &Value) -> tracer_core::config::Config {
    let text = find(objs, "ConfigMap")["data"]["config.toml"].as_str().unwrap();
    // An unknown key at any depth is an error naming its dotted path.
    let (cfg, warnings) = tracer_core::config::Config::from_toml(text).unwrap_or_else(|e| panic!("config.toml: {e}"));
    assert!(warnings.is_empty(), "config.toml: {warnings:?}");
    cfg.validate().unwrap_or_else(|e| panic!("config.toml: {e}"));
    cfg
}

/// The agent's whole configuration with every key set to something other than its default (the
/// chart's `config` value, as JSON): the chart must pass each through to config.toml unchanged.
fn every_config_key() -> Value {
    use tracer_core::{config::*, filter::FilterConfig};
    let s = |v: &str| v.to_string();
    let c = Config {
        dev_dir: "/host/dev".into(),
        simulated_devices: true,
        proc_root: "/proc2".into(),
        cgroup_root: Some("/cg".into()),
        driver_version: Some(s("550.54.15")),
        driver_version_file: "/v".into(),
        attach_mode: AttachMode::RawTracepoint,
        families: Families { lifecycle: false, driver: false, cuda: false },
        ring_buffer_bytes: 1 << 24,
        wakeup_every: 32,
        kernel_log: true,
        drain_interval_ms: 20,
        snapshot_interval_ms: 2000,
        max_processes: 1000,
        cuda_libraries: vec!["/lib/libcuda.so.1".into(), "/opt/libcuda.so.1".into()],
        cuda_attach: CudaAttach::PerfEvent,
        cuda_entry_programs: CudaEntryPrograms::PerEntry,
        cuda_timed_calls: true,
        lifecycle_attach: LifecycleAttach::Tracepoint,
        driver_entry_probes: DriverEntryProbes::Kprobe,
        ioctl_durations: true,
        nvml: NvmlSettings { mode: SourceMode::Required, library: Some("/lib/libnvidia-ml.so.1".into()) },
        attribution: AttributionSettings {
            price_per_gpu_hour: Some(2.5),
            price_per_node_hour: Some(20.0),
            cost_policy: CostPolicy::Blended,
            blend_memory_weight: 0.75,
            unused_cost: UnusedCost::Spread,
            idle_reservation_after_s: 900,
            rightsizing_window_s: 7200,
            rightsizing_headroom_pct: 10,
        },
        kubernetes: KubeSettings {
            mode: SourceMode::Off,
            node_name: Some(s("gpu-1")),
            kubeconfig: Some("/etc/kubeconfig".into()),
            label_allow_list: vec![s("cost-center")],
            pod_resources_socket: "/run/pr.sock".into(),
            gpu_resource_names: vec![s("nvidia.com/mig-1g.10gb")],
        },
        api: ApiSettings {
            listen: s("tcp://127.0.0.1:9401"),
            tls_cert: Some("/tls/api.crt".into()),
            tls_key: Some("/tls/api.key".into()),
            token_file: Some("/tls/api-token".into()),
            history: 500,
            history_kinds: vec![s("violation"), s("rm_alloc")],
            subscriber_buffer: 100,
            max_subscribers: 4,
        },
        otlp: otlp::OtlpConfig {
            endpoint: Some(s("https://otel.monitoring:4317")),
            certificate: Some("/tls/ca.crt".into()),
            client_certificate: Some("/tls/client.crt".into()),
            client_key: Some("/tls/client.key".into()),
            protocol: otlp::OtlpProtocol::HttpProtobuf,
            headers: [(s("x-api-key"), s("k"))].into(),
            resource_attributes: [(s("k8s.cluster.name"), s("eu-1"))].into(),
            metric_export_interval_ms: 30_000,
            timeout_ms: 5000,
            events: vec![s("violation"), s("bill")],
            include: vec![FilterConfig { namespace: vec![s("ml")], ..Default::default() }],
            exclude: vec![FilterConfig { kind: vec![s("rm_alloc")], violations_only: true, ..Default::default() }],
            log_queue: 100,
            log_batch: 10,
            log_export_interval_ms: 500,
            max_series_per_metric: 100,
            flags: Default::default(),
        },
        metrics: MetricsSettings {
            cgroup_label: CgroupLabel::Always,
            tls_cert: Some("/tls/m.crt".into()),
            tls_key: Some("/tls/m.key".into()),
            token_file: Some("/tls/m-token".into()),
        },
    };
    c.validate().expect("every_config_key is a valid configuration");
    // Every key differs from its default, so a key the chart dropped (or replaced by its own)
    // shows. A key added to Config without a value here fails this.
    fn same_leaves(a: &Value, b: &Value, key: &str, out: &mut Vec<String>) {
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                for (k, v) in x {
                    same_leaves(v, y.get(k).unwrap_or(&Value::Null), &format!("{key}.{k}"), out);
                }
            }
            _ if a == b => out.push(key.to_string()),
            _ => {}
        }
    }
    let v = serde_json::to_value(&c).unwrap();
    let mut same = Vec::new();
    same_leaves(&v, &serde_json::to_value(Config::default()).unwrap(), "config", &mut same);
    assert!(same.is_empty(), "every_config_key leaves these at their defaults: {same:?}");
    v
}

/// The invariants of the least-privilege deployment (docs/security.md).
fn check_least_privilege(objs: &Value, what: &str) {
    let ds = find(objs, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true, "{what}: hostPID");
    assert!(pod.get("hostNetwork").is_none_or(|v| v == false), "{what}: no hostNetwork");
    let sc = &container(ds)["securityContext"];
    assert_eq!(sc["privileged"], false, "{what}: privileged must be false");
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{what}");
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{what}");
    assert_eq!(sc["runAsUser"], 0, "{what}: uid 0 (docs/security.md)");
    assert_eq!(strings(&sc["capabilities"]["drop"]), BTreeSet::from(["ALL".to_string()]), "{what}");
    let want: BTreeSet<String> = CAPS.iter().map(|c| c.to_string()).collect();
    assert_eq!(strings(&sc["capabilities"]["add"]), want, "{what}: capabilities");
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{what}");
    assert!(
        !serde_json::to_string(objs).unwrap().contains("\"privileged\":true"),
        "{what}: privileged: true somewhere"
    );
    // Every hostPath is mounted read-only (the pod-resources socket too: connect() needs write
    // permission on the socket inode, which a read-only mount does not remove) but one: the gRPC
    // API's socket directory, where the agent creates api.sock — a directory of its own under
    // /run, created for it, never a system directory.
    let host_paths: Vec<&str> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v.get("hostPath").is_some())
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert!(host_paths.len() >= 5, "{what}: host mounts {host_paths:?}");
    let api = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "api-socket");
    let api = api.unwrap_or_else(|| panic!("{what}: no api-socket volume for the gRPC API's socket"));
    assert_eq!(api["hostPath"]["path"], "/run/gpu-tracer", "{what}: the API socket's own directory");
    assert_eq!(api["hostPath"]["type"], "DirectoryOrCreate", "{what}");
    for m in container(ds)["volumeMounts"].as_array().unwrap() {
        if m["name"] == "api-socket" {
            assert_eq!(m["mountPath"], "/run/gpu-tracer", "{what}: where api.listen's default socket is");
        } else if host_paths.contains(&m["name"].as_str().unwrap()) {
            assert_eq!(m["readOnly"], true, "{what}: hostPath mount {} must be readOnly", m["name"]);
        }
    }
    // RBAC: read-only verbs on pods and resource claims, nothing else.
    let role = find(objs, "ClusterRole");
    let mut resources = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        for verb in strings(&rule["verbs"]) {
            assert!(["get", "list", "watch"].contains(&verb.as_str()), "{what}: RBAC verb {verb}");
        }
        resources.extend(strings(&rule["resources"]));
    }
    assert_eq!(resources, BTreeSet::from(["pods".to_string(), "resourceclaims".to_string()]), "{what}");
    let cfg = config_of(objs);
    // Multi-uprobe links (Linux 6.6+) need no capability beyond the four: the cuda family is on.
    assert!(cfg.families.cuda, "{what}: the cuda family is on by default");
    assert_eq!(cfg.cuda_attach, tracer_core::config::CudaAttach::Auto, "{what}");
}

/// Drops what only Helm adds: its labels and the config checksum annotation.
fn without_helm_marks(mut v: Value) -> Value {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(m) => {
                if let Some(Value::Object(labels)) = m.get_mut("labels") {
                    labels.remove("helm.sh/chart");
                    labels.remove("app.kubernetes.io/managed-by");
                }
                if let Some(Value::Object(ann)) = m.get_mut("annotations") {
                    ann.remove("checksum/config");
                    if ann.is_empty() {
                        m.remove("annotations");
                    }
                }
                m.values_mut().for_each(walk);
            }
            Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut v);
    v
}

#[test]
fn manifests_and_chart_validate_and_hold_least_privilege() {
    let root = repo_root();
    let r = render(&root).unwrap_or_else(|e| panic!("deployment does not validate:\n{e}"));
    assert_eq!(r["k8s_versions"].as_array().unwrap().len(), 2);
    check_least_privilege(&r["base"], "deploy/kubernetes/base");
    check_least_privilege(&r["chart"]["default"], "chart defaults");

    // The chart with default values renders the plain manifests (less the Namespace).
    let mut base: Vec<Value> =
        r["base"].as_array().unwrap().iter().filter(|o| o["kind"] != "Namespace").cloned().collect();
    let mut chart: Vec<Value> =
        r["chart"]["default"].as_array().unwrap().iter().cloned().map(without_helm_marks).collect();
    let key = |o: &Value| format!("{}/{}", o["kind"], o["metadata"]["name"]);
    base.sort_by_key(key);
    chart.sort_by_key(key);
    assert_eq!(
        base.len(),
        chart.len(),
        "same objects: {:?} vs {:?}",
        base.iter().map(key).collect::<Vec<_>>(),
        chart.iter().map(key).collect::<Vec<_>>()
    );
    for (b, c) in base.iter().zip(&chart) {
        assert_eq!(b, c, "chart default differs from deploy/kubernetes/base for {}", key(b));
    }

    // Opt-ins: privileged (overlay and chart), perf-event uprobes for kernels before 6.6
    // (+SYS_ADMIN), memlock (+SYS_RESOURCE).
    for (objs, what) in [(&r["privileged_overlay"], "overlay"), (&r["chart"]["privileged"], "chart privileged=true")] {
        let sc = &container(find(objs, "DaemonSet"))["securityContext"];
        assert_eq!(sc["privileged"], true, "{what}");
        assert!(sc.get("capabilities").is_none(), "{what}: no capability list beside privileged");
    }
    let opt = &r["chart"]["cuda_memlock_price"];
    let sc = &container(find(opt, "DaemonSet"))["securityContext"];
    let mut want: BTreeSet<String> = CAPS.iter().map(|c| c.to_string()).collect();
    want.extend(["SYS_ADMIN".to_string(), "SYS_RESOURCE".to_string()]);
    assert_eq!(strings(&sc["capabilities"]["add"]), want);
    assert_eq!(sc["privileged"], false);
    let cfg = config_of(opt);
    assert!(cfg.families.cuda);
    assert_eq!(cfg.attribution.price_per_gpu_hour, Some(2.5));
    let pod = &find(opt, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(pod["runtimeClassName"], "nvidia");
    // Uprobes through tracefs (kernels before 6.6 without SYS_ADMIN): the tracefs mount writable,
    // every other host mount still read-only, no capability added.
    let opt = &r["chart"]["tracefs_uprobes"];
    let ds = find(opt, "DaemonSet");
    let c = container(ds);
    assert_eq!(strings(&c["securityContext"]["capabilities"]["add"]), CAPS.iter().map(|c| c.to_string()).collect());
    let host: Vec<&str> = ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v.get("hostPath").is_some())
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    let mut checked = 0;
    for m in c["volumeMounts"].as_array().unwrap() {
        let name = m["name"].as_str().unwrap();
        if !host.contains(&name) || name == "api-socket" {
            continue;
        }
        checked += 1;
        assert_eq!(m["readOnly"].as_bool().unwrap_or(false), name != "tracefs", "tracefs_uprobes: host mount {name}");
    }
    assert!(checked >= 5, "tracefs_uprobes: {checked} host mounts checked");
    let sm = find(&r["chart"]["servicemonitor"], "ServiceMonitor");
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(sm["spec"]["endpoints"][0]["honorLabels"], true, "the agent's namespace/pod labels are kept");
    assert!(r["unvalidated"].as_array().unwrap().is_empty(), "objects without a schema: {}", r["unvalidated"]);
    // The ServiceMonitors, PodMonitors and PrometheusRules, against the operator's own CRD schemas.
    assert_eq!(r["crd_checked"], 8, "CRD objects checked against deploy/schemas/prometheus-operator");
    let refused = r["crd_refused"].to_string();
    assert!(
        refused.contains(".spec.endpoints[0].intervall") && refused.contains("15 seconds"),
        "the CRD check must refuse a typo'd field and a bad interval: {refused}"
    );
    check_options(&r);
    check_rules_and_dashboards(&r);
    check_metrics_security(&r);
    check_otlp(&r);
    check_config(&r);

    // docs/security.md names every capability and host path the deployment uses.
    let doc = std::fs::read_to_string(root.join("docs/security.md")).expect("docs/security.md");
    for c in CAPS.iter().chain(&["SYS_ADMIN", "SYS_RESOURCE"]) {
        assert!(doc.contains(&format!("CAP_{c}")), "docs/security.md does not explain CAP_{c}");
    }
    for v in find(&r["base"], "DaemonSet")["spec"]["template"]["spec"]["volumes"].as_array().unwrap() {
        if let Some(p) = v["hostPath"]["path"].as_str() {
            assert!(doc.contains(&format!("`{p}`")), "docs/security.md does not explain the mount {p}");
        }
    }
}

/// The chart's `config` is the agent's configuration, passed through whole: every key set renders
/// to a config.toml the agent loads back to the same configuration (ints stay ints, lists, maps
/// and the filter tables intact; the chart's own keys give way to the user's). Typos, bad enum
/// values, ranges and types fail the install with the key's path.
fn check_config(r: &Value) {
    let want: tracer_core::config::Config = serde_json::from_value(every_config_key()).unwrap();
    let got = config_of(&r["chart"]["every_config_key"]);
    assert_eq!(got, want, "the chart changed the configuration it was given");
    // Defaults: the chart's host paths, everything else the agent's default.
    let cfg = config_of(&r["chart"]["default"]);
    assert_eq!(cfg.proc_root, PathBuf::from("/host/proc"));
    assert_eq!(cfg.nvml.library, Some(PathBuf::from("/host/driver-lib/libnvidia-ml.so.1")));
    assert_eq!(cfg.attribution, tracer_core::config::AttributionSettings::default());
    let refused = r["refused"].as_object().unwrap();
    for (case, at) in [
        ("config typo", "'/config/attribution': additional properties 'pricePerGPUHour' not allowed"),
        ("config bad enum", "'/config/attribution/cost_policy'"),
        ("config out of range", "'/config/drain_interval_ms': minimum: got 0, want 1"),
        ("config wrong type", "'/config/snapshot_interval_ms': got string, want integer"),
        ("config unknown event kind", "'/config/otlp/events/0': value must be one of"),
    ] {
        let why = refused[case].as_str().unwrap_or_else(|| panic!("values.schema.json accepts {case}"));
        assert!(why.contains(at), "{case}: helm's message should name the key ({at}): {why}");
    }
}

/// Every option a node-agent chart has lands where Kubernetes and the Prometheus operator read it;
/// names follow the release; typos in values are refused by values.schema.json.
fn check_options(r: &Value) {
    let opt = &r["chart"]["options"];
    let names: BTreeSet<String> =
        opt.as_array().unwrap().iter().map(|o| o["metadata"]["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names, BTreeSet::from(["gt-agent".to_string()]), "fullnameOverride names every object");
    assert!(
        opt.as_array().unwrap().iter().all(|o| o["kind"] != "ServiceAccount"),
        "serviceAccount.create=false creates none"
    );
    let binding = find(opt, "ClusterRoleBinding");
    assert_eq!(binding["subjects"][0]["name"], "existing-sa", "the ClusterRole is bound to the account used");
    let ds = find(opt, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "existing-sa");
    assert_eq!(pod["imagePullSecrets"][0]["name"], "registry");
    assert_eq!(pod["nodeSelector"]["pool"], "gpu");
    assert!(pod.get("affinity").is_none(), "a nodeSelector replaces the default GPU affinity: {pod}");
    assert!(pod.get("priorityClassName").is_none(), "an emptied default goes: {pod}");
    // The values other node-agent charts have.
    assert_eq!(ds["metadata"]["namespace"], "gpu-monitoring", "namespaceOverride");
    assert_eq!(binding["subjects"][0]["namespace"], "gpu-monitoring", "the binding follows namespaceOverride");
    assert_eq!(
        container(ds)["image"],
        format!("registry.example/gpu-tracer@sha256:{}", "ab".repeat(32)),
        "image.digest"
    );
    assert_eq!((&pod["hostNetwork"], &pod["dnsPolicy"]), (&Value::from(true), &Value::from("ClusterFirstWithHostNet")));
    assert_eq!(pod["securityContext"]["fsGroup"], 2000, "podSecurityContext");
    let sc = &container(ds)["securityContext"];
    assert_eq!(sc["seLinuxOptions"]["type"], "spc_t", "securityContext keys are added");
    assert_eq!(strings(&sc["capabilities"]["add"]), CAPS.iter().map(|c| c.to_string()).collect(), "and the rest kept");
    let (live, ready) = (&container(ds)["livenessProbe"], &container(ds)["readinessProbe"]);
    assert_eq!(
        (&live["initialDelaySeconds"], &live["periodSeconds"], &live["httpGet"]["path"]),
        (&Value::from(30), &Value::from(60), &Value::from("/healthz"))
    );
    assert_eq!((&ready["failureThreshold"], &ready["periodSeconds"]), (&Value::from(6), &Value::from(10)));
    let svc = find(opt, "Service");
    assert_eq!(svc["spec"]["ports"][0]["port"], 9500);
    assert!(svc["spec"].get("clusterIP").is_none(), "service.clusterIP: null gives a normal ClusterIP Service");
    assert_eq!(
        (&svc["metadata"]["annotations"]["example.com/scrape"], &svc["metadata"]["labels"]["tier"]),
        (&Value::from("true"), &Value::from("node"))
    );
    let sm_labels = &find(opt, "ServiceMonitor")["metadata"]["labels"];
    assert_eq!(
        (&sm_labels["team"], &sm_labels["release"]),
        (&Value::from("ml-platform"), &Value::from("kps")),
        "labels and additionalLabels"
    );
    // Scheduling: an affinity of one's own with a nodeSelector keeps both; null: none at all.
    let p = &find(&r["chart"]["affinity_and_selector"], "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(p["nodeSelector"]["pool"], "gpu");
    assert!(p["affinity"].to_string().contains("example.com/accelerator"), "{}", p["affinity"]);
    let p = &find(&r["chart"]["affinity_null"], "DaemonSet")["spec"]["template"]["spec"];
    assert!(p.get("affinity").is_none() && p.get("nodeSelector").is_none(), "affinity: null schedules everywhere");
    let kinds: BTreeSet<String> =
        r["chart"]["no_service"].as_array().unwrap().iter().map(|o| o["kind"].as_str().unwrap().to_string()).collect();
    assert!(!kinds.contains("Service") && kinds.contains("PodMonitor"), "service.enabled=false: {kinds:?}");
    assert_eq!(ds["spec"]["updateStrategy"]["type"], "OnDelete");
    let meta = &ds["spec"]["template"]["metadata"];
    assert_eq!(meta["annotations"]["example.com/owner"], "ml-platform");
    assert!(meta["annotations"]["checksum/config"].is_string(), "the config checksum stays beside them");
    assert_eq!(meta["labels"]["team"], "ml-platform");
    let c = container(ds);
    let args: Vec<&str> = c["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(args, ["agent", "--listen", "0.0.0.0:9400", "--log", "debug"]);
    assert!(c["env"].as_array().unwrap().iter().any(|e| e["name"] == "RUST_LOG_STYLE"));
    assert!(c["volumeMounts"].as_array().unwrap().iter().any(|m| m["mountPath"] == "/extra"));
    assert!(pod["volumes"].as_array().unwrap().iter().any(|v| v["name"] == "extra"));
    assert_eq!(c["resources"]["requests"]["cpu"], "50m");
    let ep = &find(opt, "ServiceMonitor")["spec"]["endpoints"][0];
    assert_eq!((&ep["scrapeTimeout"], &ep["honorLabels"]), (&Value::from("10s"), &Value::from(false)));
    let relabel: Vec<&str> =
        ep["relabelings"].as_array().unwrap().iter().map(|r| r["targetLabel"].as_str().unwrap_or("")).collect();
    assert_eq!(relabel, ["node", "", "cluster"], "the node label first, then the user's");
    // The target's own workload labels are dropped (prometheus.rs scrapes with the same regex).
    assert_eq!(
        ep["relabelings"][1],
        serde_json::json!({"action": "labeldrop", "regex": "(namespace|pod|container|service|endpoint)"})
    );
    assert_eq!(ep["metricRelabelings"][0]["action"], "drop");
    let pm = &find(opt, "PodMonitor")["spec"];
    assert_eq!(pm["podMetricsEndpoints"][0]["interval"], "15s");
    assert_eq!(pm["selector"]["matchLabels"], find(opt, "DaemonSet")["spec"]["selector"]["matchLabels"]);

    // The default release is "gpu-tracer"; any other gets prefixed names.
    for o in r["chart"]["release_monitoring"].as_array().unwrap() {
        assert_eq!(o["metadata"]["name"], "monitoring-gpu-tracer", "{}", o["kind"]);
    }
    // The default runs with GPU Feature Discovery's label or Node Feature Discovery's alone.
    let default_pod = &find(&r["chart"]["default"], "DaemonSet")["spec"]["template"]["spec"];
    let terms =
        default_pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            .as_array()
            .unwrap();
    let keys: Vec<&str> = terms.iter().map(|t| t["matchExpressions"][0]["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present"]);
    assert_eq!(default_pod["priorityClassName"], "system-node-critical");

    let refused = r["refused"].as_object().unwrap();
    assert_eq!(refused.len(), 12, "{refused:?}");
    assert!(
        refused["serviceMonitor without a Service"].as_str().unwrap().contains("needs service.enabled"),
        "{refused:?}"
    );
    assert!(refused["unknown top-level key"].as_str().unwrap().contains("imagee"), "{refused:?}");
    assert!(refused["unknown nested key"].as_str().unwrap().contains("intervall"), "{refused:?}");
}

/// `metricsTls` and `metricsToken`: the agent's config names the mounted files, the kubelet's probes
/// use HTTPS, and both monitors scrape over https with the token.
fn check_metrics_security(r: &Value) {
    let objs = &r["chart"]["metrics_security"];
    let cfg = config_of(objs);
    assert_eq!(cfg.metrics.tls_cert.as_deref(), Some(std::path::Path::new("/var/run/gpu-tracer/tls/tls.crt")));
    assert_eq!(cfg.metrics.tls_key.as_deref(), Some(std::path::Path::new("/var/run/gpu-tracer/tls/tls.key")));
    assert_eq!(cfg.metrics.token_file.as_deref(), Some(std::path::Path::new("/var/run/gpu-tracer/token/token")));
    let ds = find(objs, "DaemonSet");
    let c = container(ds);
    assert_eq!(c["livenessProbe"]["httpGet"]["scheme"], "HTTPS");
    assert_eq!(c["readinessProbe"]["httpGet"]["scheme"], "HTTPS");
    let mounts: BTreeSet<String> =
        c["volumeMounts"].as_array().unwrap().iter().map(|m| m["mountPath"].as_str().unwrap().to_string()).collect();
    assert!(mounts.contains("/var/run/gpu-tracer/tls") && mounts.contains("/var/run/gpu-tracer/token"));
    let secrets: BTreeSet<String> = ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["secret"]["secretName"].as_str().map(str::to_string))
        .collect();
    assert_eq!(secrets, BTreeSet::from(["gpu-tracer-tls".to_string(), "gpu-tracer-token".to_string()]));
    for (kind, endpoints) in [("ServiceMonitor", "endpoints"), ("PodMonitor", "podMetricsEndpoints")] {
        let ep = &find(objs, kind)["spec"][endpoints][0];
        assert_eq!(ep["scheme"], "https", "{kind}");
        assert_eq!(ep["authorization"]["credentials"]["name"], "gpu-tracer-token", "{kind}");
        assert_eq!(ep["tlsConfig"]["insecureSkipVerify"], true, "{kind}");
    }
    // Off by default: the defaults equal deploy/kubernetes/base (checked above), plain HTTP.
    let default_probe = &container(find(&r["chart"]["default"], "DaemonSet"))["livenessProbe"]["httpGet"];
    assert!(default_probe.get("scheme").is_none());
}

/// `otlp`: the agent's config (parsed by the agent's own loader) exports to the endpoint with the
/// chosen kinds, attributes and the mounted CA; the headers come from the Secret as
/// OTEL_EXPORTER_OTLP_HEADERS and never appear in the ConfigMap.
fn check_otlp(r: &Value) {
    let objs = &r["chart"]["otlp"];
    let cfg = config_of(objs);
    assert_eq!(cfg.otlp.endpoint.as_deref(), Some("https://otel-collector.monitoring:4317"));
    assert_eq!(cfg.otlp.metric_export_interval_ms, 30000);
    assert_eq!(cfg.otlp.events, ["violation", "bill"]);
    assert_eq!(cfg.otlp.resource_attributes.get("k8s.cluster.name").map(String::as_str), Some("eu-1"));
    assert_eq!(cfg.otlp.certificate.as_deref(), Some(std::path::Path::new("/var/run/gpu-tracer/otlp-ca/ca.crt")));
    let ds = find(objs, "DaemonSet");
    let c = container(ds);
    let env = c["env"].as_array().unwrap();
    let headers = env.iter().find(|e| e["name"] == "OTEL_EXPORTER_OTLP_HEADERS").expect("the headers' variable");
    assert_eq!(headers["valueFrom"]["secretKeyRef"]["name"], "otlp-headers");
    assert_eq!(headers["valueFrom"]["secretKeyRef"]["key"], "headers");
    assert!(c["volumeMounts"].as_array().unwrap().iter().any(|m| m["mountPath"] == "/var/run/gpu-tracer/otlp-ca"));
    assert!(
        ds["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["secret"]["secretName"] == "otlp-ca")
    );
    // Off by default: no [otlp] section, no variable.
    let default = &r["chart"]["default"];
    assert!(config_of(default).otlp.endpoint.is_none());
    let default_env = container(find(default, "DaemonSet"))["env"].to_string();
    assert!(!default_env.contains("OTEL_EXPORTER_OTLP_HEADERS"));
}

/// The PrometheusRule holds the rule files as they are (the chosen ones), and each dashboard is a
/// ConfigMap for Grafana's sidecar holding the file as it is.
fn check_rules_and_dashboards(r: &Value) {
    let rules = &r["shipped"]["rules"];
    let groups_of =
        |file: &str| rules[file]["groups"].as_array().unwrap_or_else(|| panic!("{file}: no groups")).clone();
    let all = &r["chart"]["rules_dashboards"];
    let rule = find(all, "PrometheusRule");
    assert_eq!(rule["metadata"]["labels"]["release"], "kube-prometheus-stack", "prometheusRule.labels");
    let mut want = groups_of("alerts.rules.yml");
    want.extend(groups_of("dcgm-compat.rules.yml"));
    want.extend(groups_of("recording.rules.yml"));
    assert_eq!(rule["spec"]["groups"].as_array().unwrap(), &want, "the rule files' groups, unchanged");
    let some = find(&r["chart"]["rules_without_dcgm"], "PrometheusRule");
    assert_eq!(some["spec"]["groups"].as_array().unwrap(), &groups_of("recording.rules.yml"), "dcgmCompat/alerts off");
    // Prometheus' own templates ({{ $labels.pod }}) reach Prometheus: Helm did not render them.
    assert!(rule.to_string().contains("{{ $labels.namespace }}/{{ $labels.pod }}"));

    let dashboards = r["shipped"]["dashboards"].as_object().unwrap();
    assert!(dashboards.len() >= 2);
    let maps: Vec<&Value> = all
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["kind"] == "ConfigMap" && o["metadata"]["labels"]["grafana_dashboard"] == "1")
        .collect();
    assert_eq!(maps.len(), dashboards.len(), "one ConfigMap per dashboard");
    for (file, want) in dashboards {
        let cm = maps
            .iter()
            .find(|m| m["data"].get(file.as_str()).is_some())
            .unwrap_or_else(|| panic!("no ConfigMap holds {file}"));
        assert_eq!(cm["metadata"]["namespace"], "monitoring", "grafanaDashboards.namespace");
        assert_eq!(cm["metadata"]["annotations"]["grafana_folder"], "GPU");
        let got: Value = serde_json::from_str(cm["data"][file.as_str()].as_str().unwrap()).unwrap();
        assert_eq!(&got, want, "{file} as shipped");
    }
    // Off by default.
    assert!(r["chart"]["default"].as_array().unwrap().iter().all(|o| o["kind"] != "PrometheusRule"));
}

/// The validator is not a rubber stamp: an unknown field and a wrong type are rejected.
#[test]
fn validator_rejects_unknown_fields_and_wrong_types() {
    let root = repo_root();
    for (needle, broken) in [
        (
            "\n            readOnlyRootFilesystem: true\n",
            "\n            readOnlyRootFilesystem: true\n            runAsRoot: true\n",
        ),
        ("\n      hostPID: true\n", "\n      hostPID: \"yes\"\n"),
    ] {
        let tmp = std::env::temp_dir().join(format!("gpu-tracer-deploy-{}-{}", std::process::id(), needle.len()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).unwrap();
        let copy = Command::new("cp").arg("-r").arg(root.join("deploy")).arg(&tmp).status();
        assert!(copy.unwrap().success());
        let ds = tmp.join("deploy/kubernetes/base/daemonset.yaml");
        let text = std::fs::read_to_string(&ds).unwrap();
        assert!(text.contains(needle));
        std::fs::write(&ds, text.replacen(needle, broken, 1)).unwrap();
        let err = render(&tmp).expect_err("a broken DaemonSet must not validate");
        assert!(err.contains("DaemonSet/gpu-tracer"), "{err}");
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
