use std::{collections::BTreeMap, sync::Arc, time::Duration};

use gpu_tracer_proto::v1;
use opentelemetry_proto::tonic::{
    collector::metrics::v1::ExportMetricsServiceRequest,
    common::v1::any_value::Value as AnyV,
    metrics::v1::{ResourceMetrics, ScopeMetrics, metric, number_data_point},
};

use otlp_collector::{Code, Collector, Signal};

use super::{metrics::*, wire::RequestWriter, *};
use crate::export::metrics::tests::sample_snapshot;
use opentelemetry_proto::tonic::metrics::v1::Metric;
use prost::Message as _;
use tracer_core::config::otlp::*;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: BTreeMap<String, String> = pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
    move |k| m.get(k).cloned()
}

#[test]
fn off_unless_an_endpoint_is_set() {
    assert_eq!(OtlpSettings::resolve(&OtlpConfig::default(), env(&[])).unwrap(), None);
    // A protocol alone does not turn it on.
    assert_eq!(OtlpSettings::resolve(&OtlpConfig::default(), env(&[(ENV_PROTOCOL, "grpc")])).unwrap(), None);
    let cfg = OtlpConfig { endpoint: Some("http://c:4317".into()), ..Default::default() };
    assert_eq!(OtlpSettings::resolve(&cfg, env(&[(ENV_SDK_DISABLED, "true")])).unwrap(), None);
}

#[test]
fn flag_beats_environment_beats_file() {
    let mut cfg = OtlpConfig {
        endpoint: Some("http://file:4317".into()),
        protocol: OtlpProtocol::Grpc,
        headers: [("a".to_owned(), "file".to_owned()), ("b".to_owned(), "file".to_owned())].into(),
        metric_export_interval_ms: 30_000,
        ..Default::default()
    };
    let s = OtlpSettings::resolve(&cfg, env(&[])).unwrap().unwrap();
    assert_eq!(
        (s.endpoint.as_str(), s.endpoint_source, s.protocol),
        ("http://file:4317", "otlp.endpoint", OtlpProtocol::Grpc)
    );
    assert_eq!(s.metric_export_interval, Duration::from_secs(30));

    let e = env(&[
        (ENV_ENDPOINT, "http://env:4318/"),
        (ENV_PROTOCOL, "http/protobuf"),
        (ENV_HEADERS, "b=env,c=x%20y"),
        (ENV_RESOURCE_ATTRIBUTES, "deployment.environment=prod"),
        (ENV_METRIC_EXPORT_INTERVAL, "5000"),
    ]);
    let s = OtlpSettings::resolve(&cfg, &e).unwrap().unwrap();
    assert_eq!(s.endpoint, "http://env:4318");
    assert_eq!(s.endpoint_source, ENV_ENDPOINT);
    assert_eq!(s.protocol, OtlpProtocol::HttpProtobuf);
    assert_eq!(s.headers.get("a").map(String::as_str), Some("file"));
    assert_eq!(s.headers.get("b").map(String::as_str), Some("env"));
    assert_eq!(s.headers.get("c").map(String::as_str), Some("x y"));
    assert_eq!(s.resource_attributes.get("deployment.environment").map(String::as_str), Some("prod"));
    assert_eq!(s.metric_export_interval, Duration::from_secs(5));

    cfg.flags = OtlpFlags { endpoint: Some("http://flag:4317".into()), protocol: Some(OtlpProtocol::Grpc) };
    let s = OtlpSettings::resolve(&cfg, &e).unwrap().unwrap();
    assert_eq!(
        (s.endpoint.as_str(), s.endpoint_source, s.protocol),
        ("http://flag:4317", "--otlp-endpoint", OtlpProtocol::Grpc)
    );
}

#[test]
fn the_config_file_section_parses_with_defaults() {
    let (cfg, warnings) = tracer_core::config::Config::from_toml(
        "[otlp]\nendpoint = \"http://collector:4318\"\nprotocol = \"http/protobuf\"\nevents = [\"violation\"]\n",
    )
    .unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    cfg.validate().unwrap();
    assert_eq!(cfg.otlp.protocol, OtlpProtocol::HttpProtobuf);
    assert_eq!(cfg.otlp.timeout_ms, 10_000);
    let s = OtlpSettings::resolve(&cfg.otlp, env(&[])).unwrap().unwrap();
    assert_eq!(s.event_kinds.iter().copied().collect::<Vec<_>>(), vec![v1::EventKind::Violation as i32]);
    // A typo in the section is an error, not an exporter silently off.
    assert!(tracer_core::config::Config::from_toml("[otlp]\nendpiont = \"http://c:4317\"\n").is_err());
    assert!(tracer_core::config::Config::from_toml("[otlp]\nprotocol = \"http\"\n").is_err());
}

/// The `Subscribe` filters, in TOML: the kinds kept are further narrowed by `include` / `exclude`.
#[test]
fn event_filters_from_the_config_narrow_what_is_exported() {
    let (cfg, _) = tracer_core::config::Config::from_toml(
        "[otlp]\nendpoint = \"http://c:4317\"\nevents = [\"violation\", \"rm_alloc\"]\n\
         [[otlp.exclude]]\nnamespace = [\"kube-system\"]\n[[otlp.exclude]]\nkind = [\"rm_alloc\"]\ngpu = [\"1\"]\n",
    )
    .unwrap();
    cfg.validate().unwrap();
    let s = OtlpSettings::resolve(&cfg.otlp, env(&[])).unwrap().unwrap();
    let violation = |ns: &str| v1::Event {
        payload: Some(v1::event::Payload::Violation(v1::Violation { namespace: ns.into(), ..Default::default() })),
        ..violation_event()
    };
    assert!(s.filters.matches(&violation("ml")));
    assert!(!s.filters.matches(&violation("kube-system")), "excluded by namespace");
    // A kind name that does not exist, or a field that does not, is refused with the reason.
    let bad = tracer_core::config::Config::from_toml("[otlp]\n[[otlp.include]]\nkind = [\"rm_alocc\"]\n").unwrap().0;
    let e = bad.otlp.validate().unwrap_err();
    assert!(e.why.contains("rm_alocc") && e.why.contains("rm_alloc"), "{e}");
    assert!(tracer_core::config::Config::from_toml("[otlp]\n[[otlp.include]]\nnamespaces = [\"x\"]\n").is_err());
}

#[test]
fn bad_values_name_the_key_and_the_fix() {
    let on = OtlpConfig { endpoint: Some("http://c:4317".into()), ..Default::default() };
    /// (file section, environment, the key the error names, what the message says)
    type Case<'a> = (OtlpConfig, Vec<(&'a str, &'a str)>, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (on.clone(), vec![(ENV_PROTOCOL, "http/json")], ENV_PROTOCOL, "grpc` or `http/protobuf"),
        (on.clone(), vec![(ENV_METRIC_EXPORT_INTERVAL, "10s")], ENV_METRIC_EXPORT_INTERVAL, "milliseconds"),
        (on.clone(), vec![(ENV_METRIC_EXPORT_INTERVAL, "5")], ENV_METRIC_EXPORT_INTERVAL, "between"),
        (on.clone(), vec![(ENV_HEADERS, "api-key")], ENV_HEADERS, "key=value"),
        (on.clone(), vec![(ENV_RESOURCE_ATTRIBUTES, "a=%zz")], ENV_RESOURCE_ATTRIBUTES, "%XX"),
        (OtlpConfig::default(), vec![(ENV_ENDPOINT, "collector:4317")], ENV_ENDPOINT, "http://HOST:PORT"),
        (on.clone(), vec![(ENV_CERTIFICATE, "/etc/ca.pem")], ENV_CERTIFICATE, "https://"),
        (
            OtlpConfig { endpoint: Some("https://c:4317".into()), ..Default::default() },
            vec![(ENV_CERTIFICATE, "/nonexistent/ca.pem")],
            ENV_CERTIFICATE,
            "cannot read it",
        ),
        (
            OtlpConfig {
                endpoint: Some("https://c:4317".into()),
                client_certificate: Some("/etc/hostname".into()),
                ..Default::default()
            },
            vec![],
            "otlp.client_certificate",
            "both or neither",
        ),
        (OtlpConfig { endpoint: Some("ftp://c".into()), ..Default::default() }, vec![], "otlp.endpoint", "http://"),
        (OtlpConfig { events: vec!["ioctl".into()], ..on.clone() }, vec![], "otlp.events", "rm_alloc"),
        (OtlpConfig { log_queue: 0, ..on.clone() }, vec![], "otlp.log_queue", "between"),
    ];
    for (cfg, e, key, fix) in cases {
        let err = OtlpSettings::resolve(&cfg, env(&e)).unwrap_err();
        assert_eq!(err.key, key, "{err}");
        assert!(err.to_string().contains(fix), "{err} should say {fix:?}");
    }
    let mut flagged = OtlpConfig::default();
    flagged.flags.endpoint = Some("localhost:4317".into());
    assert_eq!(OtlpSettings::resolve(&flagged, env(&[])).unwrap_err().key, "--otlp-endpoint");
}

#[test]
fn exposition_names_and_units_map_to_otel() {
    assert_eq!(
        otel_name("gpu_tracer_attribution_memory_bytes", "bytes"),
        ("gpu_tracer.attribution.memory.usage".into(), "By")
    );
    assert_eq!(otel_name("gpu_tracer_container_energy_joules", "joules"), ("gpu_tracer.container.energy".into(), "J"));
    assert_eq!(otel_name("gpu_tracer_bill", ""), ("gpu_tracer.bill.cost".into(), "{currency}"));
    assert_eq!(otel_name("gpu_tracer_ioctls", ""), ("gpu_tracer.driver.ioctls".into(), "{ioctl}"));
    // A family without a row (a test double's) keeps the mechanical name.
    assert_eq!(otel_name("gpu_tracer_x_y", ""), ("gpu_tracer.x.y".into(), ""));
    // A family as a source writes it: label values that need escaping in the exposition (quote,
    // comma) arrive as they are, an empty one is left out, help and unit come along, a counter's
    // value is a monotonic sum.
    use crate::export::metrics::{MetricEncoder, Scrape, Unit, counter, gauge_family};
    let registry = MetricsRegistry::empty().with_source(|_: &Scrape<'_>, e: &mut dyn MetricEncoder| {
        gauge_family(e, "x", "X.", Some(Unit::Bytes), [([("a", "q\"uo,te"), ("b", "")], 12u64)])?;
        counter(e, "c", "C.", None, 3.5)
    });
    let f = MetricBuilder::new(registry, 20_000).all(&Arc::new(AgentSnapshot::default()));
    assert_eq!(f.len(), 2);
    assert_eq!((f[0].name.as_str(), f[0].unit.as_str(), f[0].description.as_str()), ("gpu_tracer.x", "By", "X."));
    let Some(metric::Data::Gauge(g)) = &f[0].data else { panic!("a gauge: {:?}", f[0]) };
    assert_eq!(g.data_points.len(), 1);
    assert_eq!(g.data_points[0].attributes, vec![kv("a", "q\"uo,te")]);
    assert_eq!(g.data_points[0].value, Some(number_data_point::Value::AsInt(12)));
    assert_eq!(f[1].name, "gpu_tracer.c");
    let Some(metric::Data::Sum(c)) = &f[1].data else { panic!("a sum: {:?}", f[1]) };
    assert!(c.is_monotonic);
    assert_eq!(c.data_points[0].attributes, vec![]);
    assert_eq!(c.data_points[0].value, Some(number_data_point::Value::AsDouble(3.5)));
}

/// The sample snapshot of the Prometheus tests as the one request the exporter's parts make.
fn collected() -> ExportMetricsServiceRequest {
    let mut snap = sample_snapshot();
    // The identity the agent resolves from a real container's cgroup.
    let id = snap.containers.get_mut(&12).unwrap();
    id.container_id = Some("b".repeat(64));
    id.pod_uid = Some("22222222-3333-4444-5555-666666666666".into());
    let snap = Arc::new(snap);
    let metrics = MetricBuilder::new(MetricsRegistry::new(), 20_000).all(&snap);
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            scope_metrics: vec![ScopeMetrics { metrics, ..Default::default() }],
            ..Default::default()
        }],
    }
}

fn attr(a: &[opentelemetry_proto::tonic::common::v1::KeyValue], k: &str) -> Option<String> {
    a.iter().find(|kv| kv.key == k).and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
        AnyV::StringValue(s) => Some(s.clone()),
        other => Some(format!("{other:?}")),
    })
}

/// (attributes, value as f64) of every point of `name`.
fn points(
    req: &ExportMetricsServiceRequest,
    name: &str,
) -> Vec<(Vec<opentelemetry_proto::tonic::common::v1::KeyValue>, f64)> {
    use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value;
    let mut out = Vec::new();
    for rm in &req.resource_metrics {
        for sm in &rm.scope_metrics {
            for m in sm.metrics.iter().filter(|m| m.name == name) {
                let dps = match &m.data {
                    Some(metric::Data::Gauge(g)) => &g.data_points,
                    Some(metric::Data::Sum(s)) => &s.data_points,
                    _ => continue,
                };
                for dp in dps {
                    let v = match dp.value {
                        Some(Value::AsInt(i)) => i as f64,
                        Some(Value::AsDouble(d)) => d,
                        None => f64::NAN,
                    };
                    out.push((dp.attributes.clone(), v));
                }
            }
        }
    }
    out
}

#[test]
fn attribution_memory_sums_to_the_device_per_gpu_and_no_forbidden_attribute_is_exported() {
    let req = collected();
    let names: Vec<&str> = req.resource_metrics[0].scope_metrics[0].metrics.iter().map(|m| m.name.as_str()).collect();
    let lines = points(&req, "gpu_tracer.attribution.memory.usage");
    let totals = points(&req, "gpu_tracer.attribution.memory.limit");
    assert!(!totals.is_empty() && !lines.is_empty());
    for (a, total) in &totals {
        let gpu = attr(a, "hw.id").unwrap();
        let sum: f64 = lines.iter().filter(|(l, _)| attr(l, "hw.id").as_deref() == Some(&gpu)).map(|(_, v)| v).sum();
        assert_eq!(sum, *total, "{gpu}: lines {lines:#?}");
    }
    // Every line kind is there, container lines carry the pod's identity.
    let kinds: std::collections::BTreeSet<String> = lines.iter().filter_map(|(a, _)| attr(a, "line")).collect();
    assert!(kinds.contains("container") && kinds.contains("free") && kinds.contains("driver_reserved"), "{kinds:?}");
    let c = lines
        .iter()
        .find(|(a, _)| attr(a, "line").as_deref() == Some("container") && attr(a, "k8s.pod.name").is_some())
        .unwrap_or_else(|| panic!("no named container line: {lines:#?}"));
    for (k, v) in [
        ("k8s.namespace.name", "team-b"),
        ("k8s.pod.name", "serve-1"),
        ("k8s.container.name", "server"),
        ("container.id", "b".repeat(64).as_str()),
        ("k8s.pod.uid", "22222222-3333-4444-5555-666666666666"),
    ] {
        assert_eq!(attr(&c.0, k).as_deref(), Some(v), "{k} on {:?}", c.0);
    }
    assert_eq!(c.1, (10u64 << 30) as f64);
    for rm in &req.resource_metrics {
        for sm in &rm.scope_metrics {
            for m in &sm.metrics {
                let dps: Vec<_> = match &m.data {
                    Some(metric::Data::Gauge(g)) => g.data_points.iter().map(|d| &d.attributes).collect(),
                    Some(metric::Data::Sum(s)) => s.data_points.iter().map(|d| &d.attributes).collect(),
                    _ => vec![],
                };
                for a in dps {
                    for kv in a {
                        assert!(!FORBIDDEN_KEYS.contains(&kv.key.as_str()), "{}: {}", m.name, kv.key);
                        assert!(
                            !matches!(kv.value.as_ref().and_then(|v| v.value.as_ref()), Some(AnyV::StringValue(s)) if s.starts_with("/kubepods")),
                            "{}: a cgroup path in {}",
                            m.name,
                            kv.key
                        );
                    }
                }
            }
        }
    }
    // The hardware semantic conventions are there, with hw.type=gpu.
    for name in [
        "hw.gpu.memory.usage",
        "hw.gpu.memory.limit",
        "hw.gpu.memory.utilization",
        "hw.gpu.utilization",
        "hw.power",
        "hw.energy",
    ] {
        let p = points(&req, name);
        assert!(!p.is_empty(), "{name} missing; have {names:?}");
        assert!(p.iter().all(|(a, _)| attr(a, "hw.type").as_deref() == Some("gpu")));
        // The semantic conventions' recommended GPU attributes, where the sample has them.
        assert!(p.iter().all(|(a, _)| attr(a, "hw.vendor").as_deref() == Some("NVIDIA")), "{name}");
        assert!(p.iter().all(|(a, _)| attr(a, "hw.model") == attr(a, "hw.name")), "{name}");
    }
    // The memory fraction is usage / limit, per GPU.
    let usage = points(&req, "hw.gpu.memory.usage");
    let limit = points(&req, "hw.gpu.memory.limit");
    for (a, f) in points(&req, "hw.gpu.memory.utilization") {
        let id = attr(&a, "hw.id");
        let of = |p: &[(Vec<opentelemetry_proto::tonic::common::v1::KeyValue>, f64)]| {
            p.iter().find(|(b, _)| attr(b, "hw.id") == id).map(|(_, v)| *v).unwrap()
        };
        assert!((f - of(&usage) / of(&limit)).abs() < 1e-12, "{id:?}: {f}");
        assert!((0.0..=1.0).contains(&f));
    }
    // The bill is a monotonic sum.
    let bill =
        req.resource_metrics[0].scope_metrics[0].metrics.iter().find(|m| m.name == "gpu_tracer.bill.cost").unwrap();
    assert!(matches!(&bill.data, Some(metric::Data::Sum(s)) if s.is_monotonic));
}

#[test]
fn every_metrics_family_has_an_otlp_metric() {
    let snap = Arc::new(sample_snapshot());
    let text = MetricsRegistry::new().encode(&snap, crate::export::metrics::ExpositionFormat::OpenMetrics).unwrap();
    let metrics = MetricBuilder::new(MetricsRegistry::new(), 20_000).all(&snap);
    let names: std::collections::BTreeSet<&str> = metrics.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names.len(), metrics.len(), "one metric per name");
    let families = crate::export::metrics::tests::parse(&text).families;
    assert!(families.len() > 50, "{}", families.len());
    for f in families.values() {
        let (name, _) = otel_name(&f.family_name, &f.unit);
        assert!(names.contains(name.as_str()), "{} has no OTLP metric {name}", f.family_name);
    }
    // Every family has its row in names.rs (a convention-style name, a UCUM unit), and a family
    // with a /metrics unit has the same unit there.
    let table = names::OTEL_METRICS;
    assert!(table.windows(2).all(|w| w[0].0 < w[1].0), "names.rs: OTEL_METRICS must be sorted by short name");
    let mut rows = std::collections::BTreeSet::new();
    for f in families.values() {
        let short = f.family_name.strip_prefix("gpu_tracer_").unwrap();
        let short = if f.unit.is_empty() { short } else { short.strip_suffix(&format!("_{}", f.unit)).unwrap() };
        let (name, unit) = names::otel_metric(short)
            .unwrap_or_else(|| panic!("{}: no row in export/otlp/names.rs (its OTLP name and unit)", f.family_name));
        if !f.unit.is_empty() {
            assert_eq!(
                unit,
                otel_name(&f.family_name, &f.unit).1,
                "{}: the unit differs from /metrics'",
                f.family_name
            );
        }
        assert!(!unit.is_empty(), "{name}: no unit");
        assert!(!name.contains("total") && !name.contains("__"), "{name}: not a convention-style name");
        rows.insert(short.to_string());
    }
    let stale: Vec<_> = table.iter().filter(|r| !rows.contains(r.0)).map(|r| r.0).collect();
    assert!(stale.is_empty(), "names.rs has rows for families that do not exist: {stale:?}");
    // Every metric exported, the hardware conventions included, has a unit.
    for m in &metrics {
        assert!(!m.unit.is_empty(), "{}: no unit", m.name);
    }
}

/// Past `max_series_per_metric` the rest of a metric's series are summed under
/// `otel.metric.overflow=true`: the total is kept, the series count is bounded.
#[test]
fn series_past_the_limit_are_summed_into_one_overflow_series() {
    let snap = Arc::new(sample_snapshot());
    let all = MetricBuilder::new(MetricsRegistry::new(), 20_000).all(&snap);
    let capped = MetricBuilder::new(MetricsRegistry::new(), 2).all(&snap);
    let total = |ms: &[Metric], name: &str| -> (usize, f64) {
        let req = ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics { metrics: ms.to_vec(), ..Default::default() }],
                ..Default::default()
            }],
        };
        let p = points(&req, name);
        (p.len(), p.iter().map(|(_, v)| v).sum())
    };
    let (n, sum) = total(&all, "gpu_tracer.attribution.memory.usage");
    assert!(n > 2, "the sample has several lines: {n}");
    let (capped_n, capped_sum) = total(&capped, "gpu_tracer.attribution.memory.usage");
    assert_eq!((capped_n, capped_sum), (2, sum));
    let m = capped.iter().find(|m| m.name == "gpu_tracer.attribution.memory.usage").unwrap();
    let Some(metric::Data::Gauge(g)) = &m.data else { panic!("a gauge") };
    assert!(g.data_points[1].attributes.iter().any(|kv| kv.key == OVERFLOW_KEY));
}

/// A metric with more points than a request carries is split across requests with its name,
/// unit and kind on every part; no request has more points than the limit, none is empty, and
/// the requests together hold every point of the snapshot in order.
#[test]
fn a_large_metric_splits_across_requests() {
    let snap = Arc::new(sample_snapshot());
    let mut builder = MetricBuilder::new(MetricsRegistry::new(), 20_000);
    let all = builder.all(&snap);
    assert!(all.iter().any(|m| point_count(m) >= 3), "the sample has a metric of 3 points or more");
    let mut writer = RequestWriter::new(&Default::default(), &Default::default(), 2);
    builder.write_all(&snap, 1, &mut writer);
    let mut parts: Vec<Metric> = Vec::new();
    while let Some((body, points)) = writer.take_last() {
        let req = ExportMetricsServiceRequest::decode(body).unwrap();
        let ms = &req.resource_metrics[0].scope_metrics[0].metrics;
        assert_eq!(ms.iter().map(point_count).sum::<usize>(), points);
        assert!((1..=2).contains(&points), "{points} points in a request");
        parts.extend(ms.iter().cloned());
    }
    // Parts of one metric follow each other and repeat its name, description, unit and kind.
    let mut merged: Vec<Metric> = Vec::new();
    for m in parts {
        match merged.last_mut() {
            Some(last) if last.name == m.name => {
                assert_eq!((&m.unit, &m.description), (&last.unit, &last.description));
                match (&mut last.data, m.data) {
                    (Some(metric::Data::Gauge(a)), Some(metric::Data::Gauge(b))) => a.data_points.extend(b.data_points),
                    (Some(metric::Data::Sum(a)), Some(metric::Data::Sum(b))) => {
                        assert_eq!(
                            (a.is_monotonic, a.aggregation_temporality),
                            (b.is_monotonic, b.aggregation_temporality)
                        );
                        a.data_points.extend(b.data_points)
                    }
                    other => panic!("{} changed kind between parts: {other:?}", last.name),
                }
            }
            _ => merged.push(m),
        }
    }
    let times = |ms: &mut [Metric]| {
        for m in ms {
            match &mut m.data {
                Some(metric::Data::Gauge(g)) => g.data_points.iter_mut().for_each(|p| p.time_unix_nano = 0),
                Some(metric::Data::Sum(s)) => s.data_points.iter_mut().for_each(|p| p.time_unix_nano = 0),
                _ => {}
            }
        }
    };
    let mut all = all;
    times(&mut all);
    times(&mut merged);
    assert_eq!(merged, all);
}

/// The request bytes are what prost writes for the messages they decode to (fields in tag
/// order, defaults left out): decoded with `opentelemetry-proto` and encoded again, they are the
/// same bytes — with a resource and scope, overflow series, integer and double points, gauges,
/// monotonic and non-monotonic sums, the hardware metrics.
#[test]
fn the_request_bytes_are_prosts_encoding_of_what_they_decode_to() {
    let snap = Arc::new(sample_snapshot());
    assert!(snap.nvml.sample.is_some(), "the sample has an NVML sample (hardware metrics)");
    let resource = ResourceInfo::detect(Some("node-a"))
        .resource(&[("deployment.environment".to_owned(), "prod".to_owned())].into());
    let scope = InstrumentationScope { name: "gpu-tracer".into(), version: "1.2.3".into(), ..Default::default() };
    for max_series in [20_000, 2] {
        let mut writer = RequestWriter::new(&resource, &scope, MAX_POINTS_PER_REQUEST);
        let mut builder = MetricBuilder::new(MetricsRegistry::new(), max_series);
        builder.write_all(&snap, 1_700_000_000_000_000_000, &mut writer);
        let (body, points) = writer.take_last().unwrap();
        assert!(writer.take_last().is_none(), "one request");
        let req = ExportMetricsServiceRequest::decode(body.clone()).unwrap();
        assert_eq!(req.encode_to_vec(), body.to_vec(), "max_series {max_series}");
        let rm = &req.resource_metrics[0];
        assert_eq!((rm.resource.as_ref(), rm.scope_metrics[0].scope.as_ref()), (Some(&resource), Some(&scope)));
        let ms = &rm.scope_metrics[0].metrics;
        assert_eq!(ms.iter().map(point_count).sum::<usize>(), points);
        let kinds: std::collections::BTreeSet<String> = ms
            .iter()
            .map(|m| match &m.data {
                Some(metric::Data::Sum(s)) => format!("sum monotonic={}", s.is_monotonic),
                Some(metric::Data::Gauge(_)) => "gauge".into(),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(kinds.len(), 3, "{kinds:?}");
        assert!(ms.iter().any(|m| m.name.starts_with("hw.")));
        if max_series == 2 {
            assert!(ms.iter().any(|m| matches!(&m.data, Some(metric::Data::Gauge(g)) if g.data_points.iter().any(|p| p.attributes.iter().any(|a| a.key == OVERFLOW_KEY)))));
        }
    }
}

/// A source that fails half way is left out whole, even when it had already filled requests
/// (the writer goes back to where it stood before the source), as it fails the whole of /metrics.
#[test]
fn a_source_that_fails_half_way_is_left_out_whole() {
    use crate::export::metrics::{MetricEncoder, Scrape, gauge_family};
    let registry = MetricsRegistry::empty()
        .with_source(|_: &Scrape<'_>, e: &mut dyn MetricEncoder| {
            gauge_family(e, "ok", "Ok.", None, [([("a", "1")], 1u64), ([("a", "2")], 2u64)])
        })
        .with_source(|_: &Scrape<'_>, e: &mut dyn MetricEncoder| {
            gauge_family(e, "half", "Half.", None, [([("a", "1")], 1u64), ([("a", "2")], 2u64), ([("a", "3")], 3u64)])?;
            Err(std::fmt::Error)
        });
    let snap = Arc::new(AgentSnapshot::default());
    let ids = IdentityIndex::new(&snap);
    // Two points a request: the failing source fills one request and starts another.
    let mut writer = RequestWriter::new(&Default::default(), &Default::default(), 2);
    let mut builder = MetricBuilder::new(registry, 100);
    assert!(builder.part(0, &snap, &ids, 1, &mut writer).is_ok());
    assert!(builder.part(1, &snap, &ids, 1, &mut writer).is_err());
    let mut got = Vec::new();
    while let Some((body, points)) = writer.take_last() {
        let req = ExportMetricsServiceRequest::decode(body).unwrap();
        let names: Vec<String> =
            req.resource_metrics[0].scope_metrics[0].metrics.iter().map(|m| m.name.clone()).collect();
        got.push((names, points));
    }
    assert_eq!(got, vec![(vec!["gpu_tracer.ok".to_owned()], 2)]);
}

fn violation_event() -> v1::Event {
    v1::Event {
        header: Some(v1::Header { kind: v1::EventKind::Violation as i32, wall_time_unix_ns: 1, ..Default::default() }),
        ..Default::default()
    }
}

#[test]
fn an_unreachable_collector_costs_counted_drops_and_bounded_memory() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let cfg = OtlpConfig {
        endpoint: Some(format!("http://127.0.0.1:{port}")),
        metric_export_interval_ms: 100,
        log_export_interval_ms: 50,
        timeout_ms: 300,
        log_queue: 8,
        log_batch: 4,
        ..Default::default()
    };
    for protocol in [OtlpProtocol::Grpc, OtlpProtocol::HttpProtobuf] {
        let settings = OtlpSettings::resolve(&OtlpConfig { protocol, ..cfg.clone() }, env(&[])).unwrap();
        let x = OtlpExporter::start(settings, &ResourceInfo::default()).unwrap().unwrap();
        x.publish(Arc::new(sample_snapshot()));
        // Not exported by default: never queued, never counted.
        x.offer_event(&v1::Event {
            header: Some(v1::Header { kind: v1::EventKind::RmControl as i32, ..Default::default() }),
            ..Default::default()
        });
        let t = Instant::now();
        for _ in 0..1000 {
            x.offer_event(&violation_event());
        }
        assert!(t.elapsed() < Duration::from_millis(200), "offering never waits: {:?}", t.elapsed());
        let s = x.stats();
        assert_eq!(s.events_offered, 1000);
        assert!(s.log_queue_len <= 8);
        assert!(s.dropped_for("logs") >= 1000 - 8 - 4, "{s:?}");
        std::thread::sleep(Duration::from_millis(1500));
        let s = x.stats();
        let metric_drops: u64 =
            s.dropped.iter().filter(|d| d.signal == "metrics" && d.reason != "queue_full").map(|d| d.count).sum();
        assert!(metric_drops > 0, "failed metric exports are counted with their points: {s:?}");
        assert_eq!(s.metric_points_exported, 0);
        assert!(s.last_error.is_some());
        let s = x.shutdown(Duration::from_millis(300));
        // Everything offered is accounted for: exported (nothing here) or dropped for a reason.
        assert_eq!(s.log_records_exported + s.dropped_for("logs"), 1000, "{protocol:?}: {s:?}");
    }
}

/// Issue 45 item 7: a collector that takes the connection and never answers, and one that never
/// even accepts it (a blackhole: the kernel completes the TCP handshake, nothing reads), cost
/// drops counted as `timeout`, not `export_failed`, with both protocols.
#[test]
fn a_collector_that_never_answers_costs_timeouts_not_failures() {
    // Accepts and holds every connection, reading nothing, answering nothing.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in silent.incoming().flatten() {
            held.push(s);
        }
    });
    // Never accepts.
    let blackhole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let blackhole_port = blackhole.local_addr().unwrap().port();
    // Never completes a connection: its accept queue (backlog 0) is full, so the kernel drops the
    // SYNs and the client's connect timeout is what ends the attempt.
    let full = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let full_port = full.local_addr().unwrap().port();
    // SAFETY: listen() on a socket this test owns; it only changes the backlog.
    assert_eq!(unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(&full), 0) }, 0);
    let fillers: Vec<_> = (0..4).filter_map(|_| socket_with_timeout(full_port)).collect();
    for port in [silent_port, blackhole_port, full_port] {
        for protocol in [OtlpProtocol::Grpc, OtlpProtocol::HttpProtobuf] {
            let cfg = OtlpConfig {
                endpoint: Some(format!("http://127.0.0.1:{port}")),
                protocol,
                metric_export_interval_ms: 100,
                timeout_ms: 300,
                ..Default::default()
            };
            let settings = OtlpSettings::resolve(&cfg, env(&[])).unwrap();
            let x = OtlpExporter::start(settings, &ResourceInfo::default()).unwrap().unwrap();
            x.publish(Arc::new(sample_snapshot()));
            let t = Instant::now();
            let reason = |s: &OtlpStats, r: &str| -> u64 {
                s.dropped.iter().filter(|d| d.signal == "metrics" && d.reason == r).map(|d| d.count).sum()
            };
            while reason(&x.stats(), "timeout") == 0 && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let s = x.shutdown(Duration::from_millis(300));
            let what = match port {
                p if p == silent_port => "silent collector",
                p if p == blackhole_port => "blackhole",
                _ => "full accept queue",
            };
            assert!(reason(&s, "timeout") > 0, "{what}, {protocol:?}: no timeout counted: {s:?}");
            assert_eq!(reason(&s, "export_failed"), 0, "{what}, {protocol:?}: a timeout counted as a failure: {s:?}");
        }
    }
    drop((blackhole, full, fillers));
}

/// A connection to 127.0.0.1:`port`, if one completes within 200 ms.
fn socket_with_timeout(port: u16) -> Option<std::net::TcpStream> {
    std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200)).ok()
}

/// A self-signed certificate for `localhost` in `dir`: (cert PEM, key PEM, cert path, key path).
fn self_signed(dir: &std::path::Path, name: &str) -> (String, String, std::path::PathBuf, std::path::PathBuf) {
    let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key) = (c.cert.pem(), c.signing_key.serialize_pem());
    let (cp, kp) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
    std::fs::write(&cp, &cert).unwrap();
    std::fs::write(&kp, &key).unwrap();
    (cert, key, cp, kp)
}

/// Wait until the exporter has exported a whole snapshot (or 10 s pass); its stats.
fn await_round(x: &OtlpExporter) -> OtlpStats {
    let t = Instant::now();
    while x.stats().metric_rounds == 0 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    x.stats()
}

/// OTLP over TLS, both protocols: with the collector's CA configured the export goes through and
/// every point arrives; with a client certificate a collector that requires one takes it; with the
/// system's roots instead (which do not hold our CA) the handshake fails and the points are
/// counted as dropped with a reason that names the certificate.
#[test]
fn tls_to_the_collector_checks_the_certificate_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, cert_path, _) = self_signed(dir.path(), "collector");
    let (client_cert, _, client_cert_path, client_key_path) = self_signed(dir.path(), "agent");
    let grpc = Collector::grpc().tls(&cert, &key).start().unwrap();
    let mtls = Collector::grpc().tls(&cert, &key).client_ca(&client_cert).start().unwrap();
    let https = Collector::http().tls(&cert, &key).start().unwrap();
    let snap = Arc::new(sample_snapshot());
    let points = MetricBuilder::new(MetricsRegistry::new(), 20_000).all(&snap).iter().map(point_count).sum::<usize>();
    let cfg = |c: &Collector, protocol, ca: bool, client: bool| OtlpConfig {
        endpoint: Some(c.endpoint()),
        protocol,
        certificate: ca.then(|| cert_path.clone()),
        client_certificate: client.then(|| client_cert_path.clone()),
        client_key: client.then(|| client_key_path.clone()),
        metric_export_interval_ms: 100,
        timeout_ms: 2000,
        ..Default::default()
    };
    for (what, cfg, got) in [
        ("gRPC", cfg(&grpc, OtlpProtocol::Grpc, true, false), &grpc),
        ("gRPC with a client certificate", cfg(&mtls, OtlpProtocol::Grpc, true, true), &mtls),
        ("HTTP", cfg(&https, OtlpProtocol::HttpProtobuf, true, false), &https),
    ] {
        let settings = OtlpSettings::resolve(&cfg, env(&[])).unwrap();
        let x = OtlpExporter::start(settings, &ResourceInfo::default()).unwrap().unwrap();
        x.publish(snap.clone());
        let s = await_round(&x);
        assert!(s.metric_rounds >= 1, "{what}: {s:?}");
        assert_eq!(s.dropped_for("metrics"), 0, "{what}: {s:?}");
        assert!(got.received().metric_points() >= points as u64, "{what}");
        x.shutdown(Duration::from_millis(500));
    }
    // The mTLS collector refuses an agent without a client certificate; the system's roots do not
    // vouch for a self-signed collector. Either way: counted drops and a reason, no panic.
    for (what, cfg) in [
        ("no client certificate", cfg(&mtls, OtlpProtocol::Grpc, true, false)),
        ("gRPC, system roots", cfg(&grpc, OtlpProtocol::Grpc, false, false)),
        ("HTTP, system roots", cfg(&https, OtlpProtocol::HttpProtobuf, false, false)),
    ] {
        let x = match OtlpExporter::start(OtlpSettings::resolve(&cfg, env(&[])).unwrap(), &ResourceInfo::default()) {
            Ok(x) => x.unwrap(),
            // A machine without CA certificates says so at start.
            Err(e) => {
                assert!(e.to_string().contains("no CA certificates"), "{what}: {e}");
                continue;
            }
        };
        x.publish(snap.clone());
        let t = Instant::now();
        while x.stats().dropped_for("metrics") == 0 && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let s = x.shutdown(Duration::from_millis(300));
        assert!(s.dropped_for("metrics") > 0 && s.metric_rounds == 0, "{what}: {s:?}");
        let e = s.last_error.unwrap_or_default().to_lowercase();
        assert!(!e.is_empty(), "{what}: the reason is kept");
        if what.contains("roots") {
            assert!(e.contains("certificate") || e.contains("issuer") || e.contains("tls"), "{what}: {e}");
        }
    }
}

/// A collector that is briefly unavailable loses nothing: the batch is sent again at the next log
/// tick. One that stays unavailable costs the batch after 3 attempts, counted; a refusal that will
/// not pass (INVALID_ARGUMENT) drops it at once. Every record is accounted for either way.
#[test]
fn log_batches_are_sent_again_when_the_failure_may_pass_and_only_then() {
    // (what, failures before success, code, records exported, retries, dropped)
    let cases = [
        ("unavailable twice", 2, Code::Unavailable, 10, 2, 0),
        ("unavailable for good", 1000, Code::Unavailable, 0, 2, 10),
        ("invalid argument", 1, Code::InvalidArgument, 0, 0, 10),
    ];
    for (what, fail, code, exported, retries, dropped) in cases {
        let c = Collector::grpc().fail_first(Signal::Logs, fail, code).start().unwrap();
        let cfg = OtlpConfig {
            endpoint: Some(c.endpoint()),
            metric_export_interval_ms: 3_600_000,
            log_export_interval_ms: 100,
            ..Default::default()
        };
        let x = OtlpExporter::start(OtlpSettings::resolve(&cfg, env(&[])).unwrap(), &ResourceInfo::default())
            .unwrap()
            .unwrap();
        for _ in 0..10 {
            x.offer_event(&violation_event());
        }
        let t = Instant::now();
        while x.stats().log_records_exported + x.stats().dropped_for("logs") < 10
            && t.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        let s = x.shutdown(Duration::from_millis(300));
        assert_eq!(
            (s.log_records_exported, s.log_retries, s.dropped_for("logs")),
            (exported, retries, dropped),
            "{what}: {s:?}"
        );
        assert_eq!(c.received().log_records(), exported, "{what}");
        if dropped > 0 {
            assert!(s.last_error.is_some_and(|e| e.contains("not now")), "{what}: the reason is kept");
        }
    }
}

/// Issue 45 item 3: a setting the exporter cannot use (a header name or value HTTP cannot carry,
/// from the file or from OTEL_EXPORTER_OTLP_HEADERS; a CA or client certificate whose PEM body is
/// garbage) is an error naming it — from `start` called inside the agent's runtime, where it
/// panicked ("Cannot drop a runtime in a context where blocking is not allowed"), and from
/// `check`, which `doctor` runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_bad_setting_is_an_error_naming_it_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")
        .unwrap();
    let base = OtlpConfig { endpoint: Some("http://127.0.0.1:4317".into()), ..Default::default() };
    let header = |k: &str, v: &str| OtlpConfig { headers: [(k.to_owned(), v.to_owned())].into(), ..base.clone() };
    // What, the settings, the environment, and the key the error names.
    type Case<'a> = (&'a str, OtlpConfig, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        ("a header name with a space", header("bad header", "x"), vec![], "otlp.headers"),
        ("a header value with a newline", header("x-token", "a\nb"), vec![], "otlp.headers"),
        (
            "a header from the environment",
            base.clone(),
            vec![("OTEL_EXPORTER_OTLP_HEADERS", "bad header=x")],
            "otlp.headers",
        ),
        (
            "a newline from the environment",
            base.clone(),
            vec![("OTEL_EXPORTER_OTLP_HEADERS", "x-token=a%0Ab")],
            "otlp.headers",
        ),
        (
            "a CA file of garbage",
            OtlpConfig {
                endpoint: Some("https://127.0.0.1:4317".into()),
                certificate: Some(garbage.clone()),
                ..base.clone()
            },
            vec![],
            "",
        ),
    ];
    let mut refused = 0;
    for (what, cfg, envs, key) in cases {
        for protocol in [OtlpProtocol::Grpc, OtlpProtocol::HttpProtobuf] {
            let cfg = OtlpConfig { protocol, ..cfg.clone() };
            let settings = match OtlpSettings::resolve(&cfg, env(&envs)) {
                // Refused while resolving already: named there.
                Err(e) => {
                    assert!(e.to_string().contains(e.key), "{what}: {e}");
                    refused += 1;
                    continue;
                }
                Ok(s) => s.expect("an endpoint is set"),
            };
            let checked = OtlpExporter::check(&settings).expect_err(what);
            let started = OtlpExporter::start(Some(settings), &ResourceInfo::default()).map(|_| ()).expect_err(what);
            for e in [checked, started] {
                let OtlpError::Setting(s) = &e else { panic!("{what}: {e}") };
                assert!(s.key.contains(key), "{what} ({protocol:?}): {e}");
                assert!(!s.why.is_empty(), "{what}: {e}");
            }
            refused += 1;
        }
    }
    assert_eq!(refused, 10);
}

/// Text an attacker or a typo could put in a setting: anything printable or not, the characters
/// that matter to URLs, headers and key=value lists, percent escapes, very long values.
fn hostile_text() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    prop_oneof![
        any::<String>(),
        "[ -~]{0,40}",
        "[=,%:/@\\[\\]\r\n\t\u{0}\u{7f}a-z0-9 ]{0,30}",
        Just("%0A%0d%00%zz%".to_string()),
        Just("http://[::1".to_string()),
        Just("https://127.0.0.1:99999".to_string()),
        Just("grpc://h:4317/path?q#f".to_string()),
        Just("x".repeat(70_000)),
        Just("\u{202e}\u{1b}]0;t\u{7}".to_string()),
    ]
}

/// A file a TLS setting could name: missing, empty, binary, a PEM header with a garbage body, a
/// directory.
fn hostile_file(dir: &std::path::Path, which: u8) -> std::path::PathBuf {
    let p = dir.join(format!("f{which}"));
    match which % 5 {
        0 => return dir.join("missing.pem"),
        1 => std::fs::write(&p, b"").unwrap(),
        2 => std::fs::write(&p, [0u8, 0xff, 0xfe, 0x1b, b'\n']).unwrap(),
        3 => std::fs::write(&p, "-----BEGIN PRIVATE KEY-----\n%%%\n-----END PRIVATE KEY-----\n").unwrap(),
        _ => return dir.to_path_buf(),
    }
    p
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]
    /// Issue 45: every OTLP setting — the file's and the environment's — with hostile values is
    /// either taken or refused with an error naming a setting; resolving and building the
    /// transport (what `start` and `doctor` do) never panics.
    #[test]
    fn hostile_otlp_settings_are_refused_by_name_never_a_panic(
        endpoint in hostile_text(),
        header in (hostile_text(), hostile_text()),
        attribute in (hostile_text(), hostile_text()),
        env_values in proptest::collection::vec(hostile_text(), 8),
        use_env in proptest::collection::vec(proptest::prelude::any::<bool>(), 8),
        numbers in proptest::collection::vec(proptest::prelude::any::<u64>(), 6),
        files in proptest::collection::vec(proptest::prelude::any::<u8>(), 3),
        events in proptest::collection::vec(hostile_text(), 0..3),
        https in proptest::prelude::any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let url = if https { "https://127.0.0.1:4318" } else { "http://127.0.0.1:4317" };
        let cfg = OtlpConfig {
            endpoint: Some(if use_env[7] { url.to_string() } else { endpoint.clone() }),
            headers: [header.clone()].into(),
            resource_attributes: [attribute].into(),
            certificate: (files[0] % 2 == 0).then(|| hostile_file(dir.path(), files[0])),
            client_certificate: (files[1] % 2 == 0).then(|| hostile_file(dir.path(), files[1])),
            client_key: (files[2] % 2 == 0).then(|| hostile_file(dir.path(), files[2])),
            metric_export_interval_ms: numbers[0],
            timeout_ms: numbers[1],
            log_queue: numbers[2] as usize,
            log_batch: numbers[3] as usize,
            log_export_interval_ms: numbers[4],
            max_series_per_metric: numbers[5] as usize,
            events,
            ..Default::default()
        };
        let names = [
            ENV_ENDPOINT, ENV_PROTOCOL, ENV_HEADERS, "OTEL_EXPORTER_OTLP_TIMEOUT", ENV_RESOURCE_ATTRIBUTES,
            ENV_METRIC_EXPORT_INTERVAL, ENV_CERTIFICATE, "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        ];
        let environment: BTreeMap<String, String> = names
            .iter()
            .zip(&env_values)
            .zip(&use_env)
            .filter(|(_, used)| **used)
            .map(|((k, v), _)| ((*k).to_string(), v.clone()))
            .collect();
        let outcome = std::panic::catch_unwind(|| {
            match OtlpSettings::resolve(&cfg, |k| environment.get(k).cloned()) {
                Err(e) => Err(e.to_string()),
                Ok(None) => Ok(()),
                Ok(Some(s)) => OtlpExporter::check(&s).map_err(|e| e.to_string()),
            }
        });
        let outcome = outcome.map_err(|_| "panicked").unwrap();
        if let Err(why) = outcome {
            proptest::prop_assert!(
                why.contains("otlp.") || why.contains("OTEL_") || why.contains("--otlp"),
                "an error that names no setting: {why}"
            );
        }
    }
}

/// Issue 42: a violation's log record carries the container's identity under the semantic
/// conventions' keys (from the header: `k8s.pod.uid`, `container.id` too), as every other event's
/// does; before, the payload's container name took the header's place and the record had only
/// `gputracer.namespace` and `gputracer.pod`. Without an identity in the header, the payload's
/// names still go under the `k8s.*` keys.
#[test]
fn a_violation_log_record_carries_the_kubernetes_identity() {
    let attr = |r: &opentelemetry_proto::tonic::logs::v1::LogRecord, k: &str| -> Option<String> {
        r.attributes.iter().find(|a| a.key == k).and_then(|a| match a.value.as_ref()?.value.as_ref()? {
            opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s) => Some(s.clone()),
            _ => None,
        })
    };
    let payload = v1::event::Payload::Violation(v1::Violation {
        kind: "unallocated_gpu_open".into(),
        namespace: "ml".into(),
        pod: "train-0".into(),
        container: "main".into(),
        gpu_uuid: "GPU-1".into(),
        ..Default::default()
    });
    let mut ev = violation_event();
    ev.payload = Some(payload.clone());
    ev.header.as_mut().unwrap().container = Some(v1::ContainerIdentity {
        namespace: "ml".into(),
        pod: "train-0".into(),
        container: "main".into(),
        pod_uid: "0f0f".into(),
        container_id: "c".repeat(64),
        ..Default::default()
    });
    let r = logs::record(&ev, 2);
    for (k, v) in [
        ("k8s.namespace.name", "ml"),
        ("k8s.pod.name", "train-0"),
        ("k8s.container.name", "main"),
        ("k8s.pod.uid", "0f0f"),
        ("container.id", &"c".repeat(64)),
        ("gputracer.violation", "unallocated_gpu_open"),
        ("gputracer.gpu_uuid", "GPU-1"),
    ] {
        assert_eq!(attr(&r, k).as_deref(), Some(v), "{k}: {:#?}", r.attributes);
    }
    for k in ["gputracer.namespace", "gputracer.pod", "gputracer.container"] {
        assert_eq!(attr(&r, k), None, "{k}: {:#?}", r.attributes);
    }
    assert_eq!(r.attributes.iter().filter(|a| a.key == "k8s.pod.name").count(), 1, "once");
    // No identity in the header: the payload's names.
    let mut ev = violation_event();
    ev.payload = Some(payload);
    let r = logs::record(&ev, 2);
    assert_eq!(attr(&r, "k8s.namespace.name").as_deref(), Some("ml"), "{:#?}", r.attributes);
    assert_eq!(attr(&r, "k8s.container.name").as_deref(), Some("main"));
}
