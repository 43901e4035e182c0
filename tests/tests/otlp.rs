//! OTLP export end to end: the `gpu-tracer agent` binary on the fake driver, the fake NVML and the
//! fake Kubernetes API, exporting to the OTLP collector double (tests/otlp-collector: the
//! `opentelemetry-proto` crate's tonic services for OTLP/gRPC, axum decoding protobuf for
//! OTLP/HTTP). The bytes per pod and per GPU line must be the ones `/metrics` shows; the receiver
//! is stopped and restarted mid-run (the agent keeps serving, drops are counted, export resumes);
//! and one request is decoded again by the PyPI `opentelemetry-proto` package. Needs root.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Mutex,
    time::{Duration, Instant},
};

use gpu_tracer_tests::http::get as http_get;
use gpu_tracer_tests::{
    AgentProcess, FakeDriver, PodCgroup, Workload, gpu_tracer,
    kube_api::{FakeApiServer, FakePod},
    nvml_model::{Busy, NvmlModel},
    pod_resources::FakePodResources,
    require_root,
};
use otlp_collector::{
    Collector, Received,
    proto::tonic::{
        collector::metrics::v1::ExportMetricsServiceRequest,
        common::v1::{KeyValue, any_value::Value as AnyV},
        metrics::v1::{metric, number_data_point},
    },
};
use prost::Message;

const GIB: u64 = 1 << 30;

/// The probes are global kernel objects and the machine has two cores: one agent at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// The node: fake driver (one GPU), a pod cgroup with its workload, NVML following the driver,
/// the fake API server naming the pod, and the kubelet socket.
struct Node {
    driver: FakeDriver,
    pod: PodCgroup,
    dir: PathBuf,
    model: Option<NvmlModel>,
    _api: FakeApiServer,
    _kubelet: FakePodResources,
    config: PathBuf,
}

impl Node {
    fn start(rt: &tokio::runtime::Runtime, name: &str) -> Node {
        let driver = FakeDriver::start(1).unwrap();
        let pod = PodCgroup::new().unwrap();
        let dir = std::env::temp_dir().join(format!("gt-otlp-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let api = rt.block_on(FakeApiServer::start()).unwrap();
        api.apply(
            FakePod::new("ml", "trainer-0", "otlp-node")
                .uid(pod.pod_uid())
                .container("main", 1, Some(&format!("containerd://{}", pod.container_id())))
                .build(),
        );
        api.write_kubeconfig(&dir.join("kubeconfig")).unwrap();
        let kubelet = rt.block_on(FakePodResources::start()).unwrap();
        let model = NvmlModel::install(&dir.join("nvml"), &driver.stats().unwrap(), 256 << 20).unwrap();
        let config = dir.join("gpu-tracer.toml");
        std::fs::write(
            &config,
            format!(
                "snapshot_interval_ms = 300\n[nvml]\nmode = \"required\"\nlibrary = {:?}\n[kubernetes]\nmode = \"required\"\n\
                 node_name = \"otlp-node\"\nkubeconfig = {:?}\npod_resources_socket = {:?}\n[otlp]\nlog_export_interval_ms = 200\n",
                model.library(),
                dir.join("kubeconfig"),
                kubelet.socket()
            ),
        )
        .unwrap();
        Node { driver, pod, dir, model: Some(model), _api: api, _kubelet: kubelet, config }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `gpu-tracer agent` exporting to `endpoint`; returns it and its HTTP address.
fn start_agent(node: &Node, endpoint: &str, protocol: &str) -> (AgentProcess, String) {
    let mut agent = AgentProcess::start(
        Command::new(gpu_tracer())
            .args(["--log", "info", "--no-cuda", "--config", node.config.to_str().unwrap()])
            .args([
                "--simulated-devices",
                "--dev-dir",
                node.driver.dev_dir().to_str().unwrap(),
                "--otlp-endpoint",
                endpoint,
            ])
            .args(["agent", "--listen", "127.0.0.1:0", "--grpc-listen", "off", "--duration", "60"])
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
            .env("OTEL_METRIC_EXPORT_INTERVAL", "500")
            .env("OTEL_EXPORTER_OTLP_TIMEOUT", "1000")
            .env("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=e2e")
            .env("NODE_NAME", "otlp-node")
            .stdout(Stdio::null()),
    )
    .unwrap_or_else(|e| panic!("the agent names its address: {e}"));
    let addr = agent.metrics_addr().unwrap();
    (agent, addr)
}

/// Series of `name` in classic text exposition: (labels text, value).
fn series(text: &str, name: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter_map(|l| {
            let (labels, value) = l.rsplit_once(' ')?;
            Some((labels.to_string(), value.parse().ok()?))
        })
        .collect()
}

fn label<'a>(labels: &'a str, key: &str) -> &'a str {
    labels.split(&format!("{key}=\"")).nth(1).and_then(|r| r.split('"').next()).unwrap_or("")
}

fn attr(a: &[KeyValue], k: &str) -> Option<String> {
    a.iter().find(|kv| kv.key == k).and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
        AnyV::StringValue(s) => Some(s.clone()),
        AnyV::IntValue(i) => Some(i.to_string()),
        other => Some(format!("{other:?}")),
    })
}

/// (attributes, integer value) of every point of `name`.
fn points(req: &ExportMetricsServiceRequest, name: &str) -> Vec<(Vec<KeyValue>, u64)> {
    let mut out = Vec::new();
    for m in req.resource_metrics.iter().flat_map(|r| &r.scope_metrics).flat_map(|s| &s.metrics) {
        if m.name != name {
            continue;
        }
        let dps = match &m.data {
            Some(metric::Data::Gauge(g)) => &g.data_points,
            Some(metric::Data::Sum(s)) => &s.data_points,
            _ => continue,
        };
        for dp in dps {
            let v = match dp.value {
                Some(number_data_point::Value::AsInt(i)) => i as u64,
                Some(number_data_point::Value::AsDouble(d)) => d as u64,
                None => continue,
            };
            out.push((dp.attributes.clone(), v));
        }
    }
    out
}

fn wait(what: &str, secs: u64, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The attribution memory lines of the latest export for the node's GPU, keyed by (line,
/// container.id), checked against `/metrics` at the same time: the same bytes per line and pod,
/// the sum equal to the total. Returns the OTLP request checked.
fn check_against_metrics(node: &Node, addr: &str, got: &Received) -> ExportMetricsServiceRequest {
    // Wait for an export whose pod line holds the workload's GiB (the first may predate it).
    let mut last = None;
    wait("an export with the pod's memory", 30, || {
        last = got.last_metrics();
        last.as_ref().is_some_and(|(_, r)| {
            points(r, "gpu_tracer.attribution.memory.usage")
                .iter()
                .any(|(a, v)| attr(a, "container.id").as_deref() == Some(node.pod.container_id()) && *v == GIB)
        })
    });
    let (_, req) = last.unwrap();
    let (status, text) = http_get(addr, "/metrics");
    assert_eq!(status, 200);
    let prom: BTreeMap<(String, String), u64> = series(&text, "gpu_tracer_attribution_memory_bytes")
        .into_iter()
        .map(|(l, v)| {
            let who = if label(&l, "line") == "container" {
                // The named pod's series (no cgroup label: metrics.cgroup_label = "auto"), or a
                // cgroup path naming its container id.
                if (label(&l, "namespace"), label(&l, "pod")) == ("ml", "trainer-0")
                    || label(&l, "cgroup").contains(node.pod.container_id())
                {
                    node.pod.container_id().to_owned()
                } else {
                    label(&l, "cgroup").to_owned()
                }
            } else {
                String::new()
            };
            ((label(&l, "line").to_owned(), who), v as u64)
        })
        .collect();
    let otlp: BTreeMap<(String, String), u64> = points(&req, "gpu_tracer.attribution.memory.usage")
        .into_iter()
        .map(|(a, v)| ((attr(&a, "line").unwrap_or_default(), attr(&a, "container.id").unwrap_or_default()), v))
        .collect();
    assert_eq!(otlp, prom, "OTLP lines vs /metrics lines\n{text}");
    let total = points(&req, "gpu_tracer.attribution.memory.limit");
    assert_eq!(total.len(), 1);
    assert_eq!(total[0].1, 80 * GIB);
    assert_eq!(otlp.values().sum::<u64>(), total[0].1, "the lines add up to the GPU");
    // The pod's line carries its Kubernetes identity.
    let (a, _) = points(&req, "gpu_tracer.attribution.memory.usage")
        .into_iter()
        .find(|(a, _)| attr(a, "line").as_deref() == Some("container"))
        .unwrap();
    assert_eq!(attr(&a, "k8s.namespace.name").as_deref(), Some("ml"), "{a:?}");
    assert_eq!(attr(&a, "k8s.pod.name").as_deref(), Some("trainer-0"));
    assert_eq!(attr(&a, "k8s.container.name").as_deref(), Some("main"));
    assert_eq!(attr(&a, "k8s.pod.uid").as_deref(), Some(node.pod.pod_uid()));
    assert!(attr(&a, "hw.id").is_some_and(|g| g.starts_with("GPU-")));
    // The hardware semantic conventions and the resource.
    let usage = points(&req, "hw.gpu.memory.usage");
    assert_eq!(usage.len(), 1, "{usage:?}");
    assert_eq!(attr(&usage[0].0, "hw.type").as_deref(), Some("gpu"));
    // The GPU attributes the semantic conventions recommend: the model, the vendor, the driver.
    assert!(attr(&usage[0].0, "hw.model").is_some_and(|m| Some(&m) == attr(&usage[0].0, "hw.name").as_ref()));
    assert_eq!(attr(&usage[0].0, "hw.vendor").as_deref(), Some("NVIDIA"));
    assert!(attr(&usage[0].0, "hw.driver_version").is_some_and(|v| !v.is_empty()), "{usage:?}");
    // The fraction of memory used, a gauge of doubles: usage / limit.
    let fraction: Vec<f64> = req
        .resource_metrics
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .filter(|m| m.name == "hw.gpu.memory.utilization")
        .flat_map(|m| match &m.data {
            Some(metric::Data::Gauge(g)) => g.data_points.clone(),
            _ => Vec::new(),
        })
        .filter_map(|dp| match dp.value {
            Some(number_data_point::Value::AsDouble(d)) => Some(d),
            _ => None,
        })
        .collect();
    let limit = points(&req, "hw.gpu.memory.limit");
    assert_eq!(fraction.len(), 1, "{fraction:?}");
    assert!((fraction[0] - usage[0].1 as f64 / limit[0].1 as f64).abs() < 1e-9, "{fraction:?} {usage:?} {limit:?}");
    let res = &req.resource_metrics[0].resource.as_ref().unwrap().attributes;
    assert_eq!(attr(res, "service.name").as_deref(), Some("gpu-tracer"));
    assert_eq!(attr(res, "k8s.node.name").as_deref(), Some("otlp-node"));
    assert_eq!(attr(res, "deployment.environment").as_deref(), Some("e2e"));
    assert!(attr(res, "host.name").is_some() && attr(res, "service.version").is_some());
    req
}

fn ok(w: &mut Workload, cmd: &str) {
    let a = w.cmd(cmd).unwrap();
    assert!(a.starts_with("ok"), "{cmd}: {a}");
}

fn stop_agent(agent: AgentProcess) {
    let status = agent.stop().unwrap();
    assert!(status.success(), "agent exit: {status}");
}

/// OTLP/gRPC: exact lines against /metrics, events as log records, and a receiver that goes away
/// and comes back.
#[test]
fn grpc_export_matches_metrics_survives_a_receiver_restart_and_counts_drops() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let mut node = Node::start(&rt, "grpc");
    let receiver = Collector::grpc().start().expect("start the gRPC receiver");
    let got = receiver.received().clone();
    let port = receiver.addr();
    let (child, addr) = start_agent(&node, &format!("http://{port}"), "grpc");
    let mut w = Workload::spawn(node.driver.dev_dir(), Some(&node.pod)).unwrap();
    let pid = w.pid();
    let _follower = node.model.take().unwrap().follow(
        node.driver.path(gpu_tracer_tests::fake_driver::stats::STATS_FILE_NAME),
        Duration::from_millis(200),
        move || [(pid, Busy { sm_pct: 40, mem_pct: 10 })].into(),
    );
    ok(&mut w, "init 0");
    ok(&mut w, "alloc-rm 1073741824");
    check_against_metrics(&node, &addr, &got);
    // The workload's allocation came as a log record (INFO), with its pod.
    let gib_alloc = |got: &Received| {
        let logs = got.log_requests();
        logs.iter()
            .flat_map(|r| &r.resource_logs)
            .flat_map(|r| &r.scope_logs)
            .flat_map(|s| &s.log_records)
            .find(|l| {
                l.event_name == "gputracer.rm_alloc"
                    && attr(&l.attributes, "gputracer.bytes").as_deref() == Some("1073741824")
            })
            .cloned()
    };
    wait("the 1 GiB rm_alloc log record", 20, || gib_alloc(&got).is_some());
    let rec = gib_alloc(&got).unwrap();
    assert_eq!(rec.severity_text, "INFO");
    assert_eq!(attr(&rec.attributes, "k8s.pod.name").as_deref(), Some("trainer-0"), "{rec:?}");
    assert_eq!(attr(&rec.attributes, "process.pid").as_deref(), Some(pid.to_string().as_str()), "{rec:?}");
    assert!(!got.event_names().iter().any(|n| n == "gputracer.rm_control"), "not every ioctl is a log record");

    // The receiver goes away: the agent keeps serving and counts what it could not send.
    receiver.stop();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(http_get(&addr, "/healthz").0, 200);
    let (_, text) = http_get(&addr, "/metrics");
    let dropped: f64 = series(&text, "gpu_tracer_otlp_dropped_total")
        .iter()
        .filter(|(l, _)| l.contains(r#"signal="metrics""#))
        .map(|(_, v)| v)
        .sum();
    assert!(dropped > 0.0, "metric points lost while the receiver was away are counted:\n{text}");
    // It comes back on the same port: export resumes.
    let before = got.metric_requests();
    let receiver = Collector::grpc().bind(port).record_into(got.clone()).start().expect("restart the gRPC receiver");
    wait("export to resume", 30, || got.metric_requests() > before);
    check_against_metrics(&node, &addr, &got);
    assert_eq!(http_get(&addr, "/healthz").0, 200);
    drop(w);
    stop_agent(child);
    receiver.stop();
}

/// OTLP/HTTP (protobuf): the same lines, and the raw request decoded again by the PyPI
/// `opentelemetry-proto` package agrees with what the test decoded.
#[test]
fn http_protobuf_export_matches_metrics_and_decodes_with_the_python_implementation() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let mut node = Node::start(&rt, "http");
    let receiver = Collector::http().start().expect("start the HTTP receiver");
    let got = receiver.received().clone();
    let (child, addr) = start_agent(&node, &format!("http://{}", receiver.addr()), "http/protobuf");
    let mut w = Workload::spawn(node.driver.dev_dir(), Some(&node.pod)).unwrap();
    let pid = w.pid();
    let _follower = node.model.take().unwrap().follow(
        node.driver.path(gpu_tracer_tests::fake_driver::stats::STATS_FILE_NAME),
        Duration::from_millis(200),
        move || [(pid, Busy { sm_pct: 40, mem_pct: 10 })].into(),
    );
    ok(&mut w, "init 0");
    ok(&mut w, "alloc-rm 1073741824");
    let req = check_against_metrics(&node, &addr, &got);
    wait("a log record", 20, || got.event_names().iter().any(|n| n == "gputracer.rm_alloc"));
    // The raw body of that request, decoded by Python.
    let raw = got
        .metric_bodies()
        .iter()
        .rev()
        .find(|b| ExportMetricsServiceRequest::decode(b.as_slice()).ok().as_ref() == Some(&req))
        .cloned()
        .unwrap();
    let file = node.dir.join("metrics.pb");
    std::fs::write(&file, &raw).unwrap();
    let out = Command::new(python()).arg(script()).arg(&file).output().expect("run tests/otlp_decode.py");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let py: BTreeMap<(String, String), u64> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.first() == Some(&"point") && f[1] == "gpu_tracer.attribution.memory.usage")
                .then(|| ((f[3].to_owned(), f[4].trim_start_matches('-').to_owned()), f[5].parse().unwrap()))
        })
        .collect();
    let ours: BTreeMap<(String, String), u64> = points(&req, "gpu_tracer.attribution.memory.usage")
        .into_iter()
        .map(|(a, v)| ((attr(&a, "line").unwrap_or_default(), attr(&a, "container.id").unwrap_or_default()), v))
        .collect();
    assert_eq!(py, ours, "python:\n{text}");
    // Every metric has a UCUM unit and a semantic-conventions-style name (dotted lowercase
    // namespaces, no `total`), as the independent decoder reads them.
    let metrics: Vec<(&str, &str)> = text.lines().filter_map(|l| l.strip_prefix("metric ")?.split_once(' ')).collect();
    assert!(metrics.len() >= 20, "{} metrics decoded:\n{text}", metrics.len());
    for (name, unit) in &metrics {
        assert!(*unit != "-", "{name}: no unit");
        let segments: Vec<&str> = name.split('.').collect();
        assert!(
            segments.len() >= 2
                && segments
                    .iter()
                    .all(|s| !s.is_empty()
                        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'))
                && !name.contains("total"),
            "{name}: not a convention-style name"
        );
    }
    assert!(text.lines().any(|l| l == "resource service.name gpu-tracer"), "{text}");
    assert!(text.lines().any(|l| l == "resource k8s.node.name otlp-node"), "{text}");
    drop(w);
    stop_agent(child);
    receiver.stop();
}

/// The venv `cargo xtask setup` fills (it installs opentelemetry-proto).
fn python() -> PathBuf {
    gpu_tracer_tests::venv_python()
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("otlp_decode.py")
}
