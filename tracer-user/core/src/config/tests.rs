use super::*;
use crate::config::flags::parse_price;

#[test]
fn defaults_round_trip() {
    let (c, w) = Config::from_toml("dev_dir = \"/tmp/x\"\n[families]\ndriver = false\n").unwrap();
    assert_eq!(c.dev_dir, PathBuf::from("/tmp/x"));
    assert!(!c.families.driver);
    assert!(c.families.lifecycle);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(c.dev_prefix(), "/tmp/x/nvidia");
}

#[test]
fn validate_rejects_bad_ring_size_and_long_dir() {
    let c = Config { ring_buffer_bytes: 5000, ..Default::default() };
    assert!(c.validate().unwrap_err().to_string().contains("ring_buffer_bytes"));
    let c = Config { dev_dir: PathBuf::from(format!("/{}", "a".repeat(80))), ..Default::default() };
    assert!(c.validate().unwrap_err().to_string().contains("too long"));
    Config::default().validate().unwrap();
}

/// `ioctl_durations` was `driver_entry_durations` when only driver-entry mode could leave ioctls
/// untimed: the old name still reads, and the default is off.
#[test]
fn ioctl_durations_accepts_its_former_name() {
    assert!(!Config::default().ioctl_durations);
    for key in ["ioctl_durations", "driver_entry_durations"] {
        let (c, w) = Config::from_toml(&format!("{key} = true\n")).unwrap();
        assert!(c.ioctl_durations, "{key}");
        assert!(w.is_empty(), "{w:?}");
    }
}

/// The error of `text`, as the user reads it.
fn toml_err(text: &str) -> String {
    Config::from_toml(text).map(|(c, _)| c).unwrap_err().to_string()
}

/// Issue 13 item 6: an unknown key is an error at every depth, naming the full dotted path, the
/// line, and the key it was probably meant to be.
#[test]
fn unknown_keys_at_any_depth_are_errors_naming_the_dotted_path() {
    assert_eq!(
        toml_err("[nvml]\nmod = \"off\"\n"),
        "invalid setting nvml.mod: unknown key (line 2); did you mean `mode`?"
    );
    assert_eq!(
        toml_err("bogus = 1\n"),
        "invalid setting bogus: unknown key (line 1); the top-level keys are `dev_dir`, \
         `simulated_devices`, `proc_root`, `cgroup_root`, `driver_version`, `driver_version_file`, `attach_mode`, \
         `families`, `ring_buffer_bytes`, `wakeup_every`, `kernel_log`, `drain_interval_ms`, `snapshot_interval_ms`, \
         `max_processes`, `cuda_libraries`, `cuda_attach`, `cuda_entry_programs`, `cuda_timed_calls`, `lifecycle_attach`, `driver_entry_probes`, `ioctl_durations`, `nvml`, `attribution`, `kubernetes`, `api`, `otlp`, `metrics` (docs/configuration.md)"
            .replace("         ", "")
    );
    assert_eq!(
        toml_err("max_process = 10\n"),
        "invalid setting max_process: unknown key (line 1); did you mean `max_processes`?"
    );
    for (text, key, near) in [
        ("[families]\ndriverr = false\n", "families.driverr", "driver"),
        ("[attribution]\nprice_per_gpu_hr = 2.0\n", "attribution.price_per_gpu_hr", "price_per_gpu_hour"),
        ("[kubernetes]\nnode = \"n1\"\n", "kubernetes.node", "mode"),
        ("[api]\nlistn = \"off\"\n", "api.listn", "listen"),
        ("[otlp]\nendpiont = \"http://c:4317\"\n", "otlp.endpiont", "endpoint"),
        ("[[otlp.include]]\nnamespaces = [\"x\"]\n", "otlp.include[0].namespaces", "namespace"),
        ("[[otlp.exclude]]\npod = [\"a\"]\n[[otlp.exclude]]\npods = [\"b\"]\n", "otlp.exclude[1].pods", "pod"),
    ] {
        let e = toml_err(text);
        assert!(e.starts_with(&format!("invalid setting {key}: unknown key (line ")), "{text}: {e}");
        assert!(e.ends_with(&format!("did you mean `{near}`?")), "{text}: {e}");
    }
    // No near miss: the keys the table has.
    assert_eq!(
        toml_err("[nvml]\nxyzzy = 1\n"),
        "invalid setting nvml.xyzzy: unknown key (line 2); the keys of `nvml` are `mode`, `library` (docs/configuration.md)"
    );
    // A key of another table is not silently accepted where it does not belong.
    assert!(toml_err("[families]\nmode = \"off\"\n").starts_with("invalid setting families.mode: unknown key"));
    let e = Config::from_toml("[nvml]\nmod = 1\n").map(|_| ()).unwrap_err();
    assert_eq!(e.reason(), "unknown_key");
}

/// Every key the struct has is accepted, including the `Option` ones that are unset by default
/// (and so absent from a serialized default): a config with every key set round-trips.
#[test]
fn every_key_is_accepted_including_the_optional_ones() {
    let mut full = Config {
        cgroup_root: Some("/sys/fs/cgroup".into()),
        driver_version: Some("535.261.03".into()),
        cuda_libraries: vec!["/usr/lib/libcuda.so.1".into()],
        ..Default::default()
    };
    full.nvml.library = Some("/lib/libnvidia-ml.so.1".into());
    full.attribution.price_per_gpu_hour = Some(2.5);
    full.attribution.price_per_node_hour = Some(20.0);
    full.kubernetes.node_name = Some("n1".into());
    full.kubernetes.kubeconfig = Some("/root/.kube/config".into());
    full.api.tls_cert = Some("/c.pem".into());
    full.api.tls_key = Some("/k.pem".into());
    full.api.token_file = Some("/t".into());
    full.otlp.endpoint = Some("https://c:4317".into());
    full.otlp.certificate = Some("/ca.pem".into());
    full.otlp.client_certificate = Some("/cc.pem".into());
    full.otlp.client_key = Some("/ck.pem".into());
    full.otlp.headers.insert("x-api.key".into(), "v".into());
    full.otlp.resource_attributes.insert("k8s.cluster.name".into(), "c".into());
    full.otlp.include = vec![crate::filter::FilterConfig {
        namespace: vec!["a".into()],
        cgroup_id: vec![7],
        violations_only: true,
        ..Default::default()
    }];
    let text = toml::to_string(&full).unwrap();
    let (back, w) = Config::from_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(back, full);
    assert!(w.is_empty());
}

/// A value of the wrong type or an unknown name says which key, and where.
#[test]
fn a_bad_value_names_its_key_and_line() {
    assert_eq!(
        toml_err("dev_dir = \"/dev\"\nring_buffer_bytes = \"big\"\n"),
        "invalid setting ring_buffer_bytes: invalid type: string \"big\", expected u32 (line 2)"
    );
    let e = toml_err("[nvml]\nmode = \"of\"\n");
    assert!(e.starts_with("invalid setting nvml.mode: unknown variant `of`"), "{e}");
    assert!(e.contains("`off`") && e.ends_with("(line 2)"), "{e}");
    let e = toml_err("max_processes = -1\n");
    assert!(e.starts_with("invalid setting max_processes: "), "{e}");
    let e = toml_err("[nvml\n");
    assert!(e.starts_with("not valid TOML: "), "{e}");
}

#[test]
fn a_file_error_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("gt.toml");
    std::fs::write(&p, "[nvml]\nmod = \"off\"\n").unwrap();
    let e = Config::from_file(&p).unwrap_err().to_string();
    assert_eq!(
        e,
        format!("config file {}: invalid setting nvml.mod: unknown key (line 2); did you mean `mode`?", p.display())
    );
}

fn invalid(c: &Config) -> String {
    c.validate().unwrap_err().to_string()
}

/// Issue 13 item 6: values out of range are errors with the reason, not defaults or hangs.
#[test]
fn values_are_range_checked_with_the_reason() {
    // Ring buffer: a power of two between the page size and 256 MiB (2 GiB cost 4.2 GB of RSS).
    for rb in [0, 1024, 5000, (256 << 20) + 4096, 512 << 20, 2 << 30] {
        let e = invalid(&Config { ring_buffer_bytes: rb, ..Default::default() });
        assert!(
            e.starts_with(&format!("invalid setting ring_buffer_bytes: {rb} is not a power of two between")),
            "{e}"
        );
        assert!(e.contains("268435456"), "{e}");
    }
    for rb in [4096, 64 << 10, 256 << 20] {
        Config { ring_buffer_bytes: rb, ..Default::default() }.validate().unwrap();
    }
    // State tables: at least one process, at most the kernel's PID limit.
    for n in [0, MAX_PROCESSES + 1] {
        let e = invalid(&Config { max_processes: n, ..Default::default() });
        assert!(e.starts_with(&format!("invalid setting max_processes: {n} is outside 1..=4194304")), "{e}");
    }
    Config { max_processes: 1, ..Default::default() }.validate().unwrap();
    // Intervals above 0.
    let e = invalid(&Config { drain_interval_ms: 0, ..Default::default() });
    assert!(e.starts_with("invalid setting drain_interval_ms: 0 is outside 1..=60000"), "{e}");
    let e = invalid(&Config { snapshot_interval_ms: 0, ..Default::default() });
    assert!(e.starts_with("invalid setting snapshot_interval_ms: 0 is outside"), "{e}");
    // Prices: finite, not negative (either key).
    for p in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0] {
        let mut c = Config::default();
        c.attribution.price_per_gpu_hour = Some(p);
        let e = invalid(&c);
        assert!(e.starts_with(&format!("invalid setting attribution.price_per_gpu_hour: {p} is not a price")), "{e}");
        let mut c = Config::default();
        c.attribution.price_per_node_hour = Some(p);
        assert!(invalid(&c).starts_with("invalid setting attribution.price_per_node_hour: "));
    }
    let mut c = Config::default();
    c.attribution.price_per_gpu_hour = Some(0.0);
    c.validate().unwrap();
    for w in [f64::NAN, -0.1, 1.5] {
        let mut c = Config::default();
        c.attribution.blend_memory_weight = w;
        assert!(invalid(&c).starts_with("invalid setting attribution.blend_memory_weight: "), "{w}");
    }
    // Issue 45 item 7: an API that serves no subscriber is refused, not accepted and useless.
    let mut c = Config::default();
    c.api.max_subscribers = 0;
    assert!(invalid(&c).starts_with("invalid setting api.max_subscribers: must be at least 1"), "{}", invalid(&c));
    c.api.max_subscribers = 1;
    c.validate().unwrap();
}

/// `--driver-version abc` used to fall back silently to the built-in default (build_info said so).
#[test]
fn a_driver_version_must_parse() {
    for v in ["abc", "", "535", "12.2.0", "535.1.2 junk"] {
        let e = invalid(&Config { driver_version: Some(v.into()), ..Default::default() });
        assert!(e.starts_with(&format!("invalid setting driver_version: {v:?} is not a driver version")), "{e}");
        assert!(e.contains("535.261.03"), "{e}");
    }
    for v in ["535.261.03", "550.54"] {
        Config { driver_version: Some(v.into()), ..Default::default() }.validate().unwrap();
    }
}

fn host_error(c: &Config) -> String {
    c.check_host_paths().unwrap_err().to_string()
}

/// Issue 13 item 6: host paths that are not there are errors at start, naming the key and the fix.
#[test]
fn host_paths_must_exist_and_be_what_they_say() {
    Config::default().check_host_paths().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, "not a library\n").unwrap();

    let e = host_error(&Config { dev_dir: "/nonexistent/dev".into(), ..Default::default() });
    assert!(
        e.starts_with("invalid setting dev_dir: /nonexistent/dev does not exist; point dev_dir (--dev-dir)"),
        "{e}"
    );
    let e = host_error(&Config { dev_dir: file.clone(), ..Default::default() });
    assert!(e.contains("is not a directory"), "{e}");
    // A directory without the driver's nodes is fine: the driver may load later.
    Config { dev_dir: dir.path().into(), ..Default::default() }.check_host_paths().unwrap();

    let e = host_error(&Config { proc_root: "/nonexistent/proc".into(), ..Default::default() });
    assert!(e.starts_with("invalid setting proc_root: /nonexistent/proc does not exist"), "{e}");
    let e = host_error(&Config { proc_root: dir.path().into(), ..Default::default() });
    assert!(e.contains("is not a procfs mount (it has neither `self` nor `1`)"), "{e}");

    let e = host_error(&Config { cgroup_root: Some("/nonexistent/cgroup".into()), ..Default::default() });
    assert!(e.starts_with("invalid setting cgroup_root: /nonexistent/cgroup does not exist"), "{e}");
    Config { cgroup_root: Some(dir.path().into()), ..Default::default() }.check_host_paths().unwrap();

    // A given libcuda that is there must be an ELF file; one that is not there is the cuda
    // family's "nothing to probe", not a start error (the chart names one path for every node);
    // with the cuda family off it is not used, so not checked.
    Config { cuda_libraries: vec!["/nonexistent/libcuda.so.1".into()], ..Default::default() }
        .check_host_paths()
        .unwrap();
    let e = host_error(&Config { cuda_libraries: vec![file.clone()], ..Default::default() });
    assert!(e.contains("is not an ELF file") && e.contains("--libcuda"), "{e}");
    let e = host_error(&Config { cuda_libraries: vec![dir.path().into()], ..Default::default() });
    assert!(e.contains("is not a regular file"), "{e}");
    let elf = std::env::current_exe().unwrap();
    Config { cuda_libraries: vec![elf], ..Default::default() }.check_host_paths().unwrap();
    let off = Families { cuda: false, ..Default::default() };
    Config { cuda_libraries: vec![file], families: off, ..Default::default() }.check_host_paths().unwrap();
}

/// `--duration NaN` / `inf` never stopped; a negative one stopped at once.
#[test]
fn command_line_seconds_and_prices_are_finite_and_not_negative() {
    for bad in ["nan", "NaN", "inf", "-inf", "infinity", "-1", "abc", "", "1e300"] {
        assert!(parse_seconds(bad).is_err(), "{bad}");
    }
    assert!(parse_seconds("nan").unwrap_err().contains("leave the flag out"));
    assert_eq!(parse_seconds("0").unwrap(), 0.0);
    assert_eq!(parse_seconds("2.5").unwrap(), 2.5);
    for bad in ["nan", "inf", "-0.5", "x"] {
        assert!(parse_price(bad).is_err(), "{bad}");
    }
    assert_eq!(parse_price("3.6").unwrap(), 3.6);
}

const FILE: &str = "dev_dir = \"/file/dev\"\nproc_root = \"/file/proc\"\nattach_mode = \"raw-tracepoint\"\n\
                    driver_version = \"535.1.2\"\ncuda_libraries = [\"/file/libcuda.so.1\"]\n\
                    [families]\nlifecycle = false\n[nvml]\nmode = \"off\"\nlibrary = \"/file/nvml.so\"\n\
                    [attribution]\nprice_per_gpu_hour = 2.0\ncost_policy = \"blended\"\n";

#[test]
fn no_overrides_change_nothing() {
    let (file, _) = Config::from_toml(FILE).unwrap();
    let mut c = file.clone();
    Overrides::default().apply(&mut c);
    assert_eq!(c, file);
    let mut d = Config::default();
    Overrides::default().apply(&mut d);
    assert_eq!(d, Config::default());
}

#[test]
fn flags_beat_the_file_which_beats_the_defaults() {
    let (mut c, w) = Config::from_toml(FILE).unwrap();
    assert!(w.is_empty(), "{w:?}");
    let o = Overrides {
        dev_dir: Some("/flag/dev".into()),
        attach_mode: Some(AttachMode::SyscallTracepoint),
        no_cuda: true,
        libcuda: vec!["/flag/a.so".into(), "/flag/b.so".into()],
        nvml: Some(SourceMode::Required),
        price_per_gpu_hour: Some(3.5),
        price_per_node_hour: Some(20.0),
        unused_cost: Some(UnusedCost::Spread),
        ..Default::default()
    };
    o.apply(&mut c);
    // Flags given: theirs.
    assert_eq!(c.dev_dir, PathBuf::from("/flag/dev"));
    assert_eq!(c.attach_mode, AttachMode::SyscallTracepoint);
    assert!(!c.families.cuda);
    assert_eq!(c.cuda_libraries, vec![PathBuf::from("/flag/a.so"), PathBuf::from("/flag/b.so")]);
    assert_eq!(c.nvml.mode, SourceMode::Required);
    assert_eq!(c.attribution.price_per_gpu_hour, Some(3.5));
    assert_eq!(c.attribution.price_per_node_hour, Some(20.0));
    assert_eq!(c.attribution.unused_cost, UnusedCost::Spread);
    // Flags absent: the file's.
    assert_eq!(c.proc_root, PathBuf::from("/file/proc"));
    assert_eq!(c.driver_version.as_deref(), Some("535.1.2"));
    assert!(!c.families.lifecycle, "an absent --no-lifecycle does not turn the family back on");
    assert_eq!(c.nvml.library, Some(PathBuf::from("/file/nvml.so")));
    assert_eq!(c.attribution.cost_policy, CostPolicy::Blended);
    // Neither: the defaults.
    assert!(c.families.driver);
    assert_eq!(c.snapshot_interval_ms, Config::default().snapshot_interval_ms);
    assert_eq!(c.kubernetes, KubeSettings::default());
}

#[test]
fn the_remaining_flags_override_too() {
    let mut c = Config::default();
    let o = Overrides {
        proc_root: Some("/flag/proc".into()),
        driver_version: Some("550.54".into()),
        no_driver: true,
        no_lifecycle: true,
        nvml_library: Some("/flag/nvml.so".into()),
        cost_policy: Some(CostPolicy::RequestBased),
        ..Default::default()
    };
    o.apply(&mut c);
    assert_eq!(c.proc_root, PathBuf::from("/flag/proc"));
    assert_eq!(c.driver_version.as_deref(), Some("550.54"));
    assert_eq!(c.families, Families { driver: false, lifecycle: false, cuda: true });
    assert_eq!(c.nvml.library, Some(PathBuf::from("/flag/nvml.so")));
    assert_eq!(c.attribution.cost_policy, CostPolicy::RequestBased);
    assert_eq!(c.dev_dir, PathBuf::from("/dev"));
    assert!(c.cuda_libraries.is_empty(), "no --libcuda keeps the (empty) default search");
}

#[test]
fn nvml_only_turns_every_family_off() {
    let (mut c, _) = Config::from_toml("[families]\ndriver = true\nlifecycle = true\ncuda = true\n").unwrap();
    Overrides { nvml_only: true, ..Default::default() }.apply(&mut c);
    assert_eq!(c.families, Families { driver: false, lifecycle: false, cuda: false });
    assert!(!c.families.any());
    // Whatever the other family flags say.
    let mut c = Config::default();
    Overrides { nvml_only: true, no_cuda: true, ..Default::default() }.apply(&mut c);
    assert!(!c.families.any());
}

mod version_tests {
    use super::*;

    #[test]
    fn parses_proc_driver_version_line() {
        let v = parse_driver_version(
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Wed Jul 30 2025\nGCC version:  gcc version 12.2.0",
        )
        .unwrap();
        assert_eq!(v, tracer_common::nv::DriverVersion::new(535, 261, 3));
        assert_eq!(parse_driver_version("550.54").unwrap(), tracer_common::nv::DriverVersion::new(550, 54, 0));
        assert!(parse_driver_version("gcc 12.2.0").is_none());
    }
}

/// The Helm chart's `config` value is checked against the agent's own schema:
/// `deploy/helm/gpu-tracer/values.schema.json`'s `definitions.agentConfig` is [`schema::config_schema`].
/// `GOLDEN_UPDATE=1 cargo test -p tracer-core chart_schema` rewrites it.
#[test]
fn chart_schema_is_the_agent_config() {
    const MARK: &str = "\n  \"definitions\": {\n    \"agentConfig\": ";
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/gpu-tracer/values.schema.json");
    let text = std::fs::read_to_string(&path).expect("the chart's values.schema.json");
    let want = schema::config_schema();
    if std::env::var_os("GOLDEN_UPDATE").is_some() {
        let at = text.find(MARK).expect("values.schema.json ends with definitions.agentConfig");
        let block = serde_json::to_string_pretty(&want).unwrap().replace('\n', "\n    ");
        std::fs::write(&path, format!("{}{MARK}{block}\n  }}\n}}\n", &text[..at])).unwrap();
        return;
    }
    let file: serde_json::Value = serde_json::from_str(&text).expect("values.schema.json is JSON");
    assert_eq!(file["properties"]["config"]["$ref"], "#/definitions/agentConfig");
    assert!(
        file["definitions"]["agentConfig"] == want,
        "deploy/helm/gpu-tracer/values.schema.json's agentConfig is not the agent's configuration schema; run \
         `GOLDEN_UPDATE=1 cargo test -p tracer-core chart_schema` and commit the file"
    );
}

/// Every bound and allowed value the schema states is the loader's: a value at a bound (or one of
/// the allowed) loads and validates, one past it is refused by the loader too, so a value that
/// passes `helm install` does not make the agent exit on start and the schema refuses nothing the
/// agent takes.
#[test]
fn schema_bounds_are_the_loaders() {
    use serde_json::{Value, json};
    fn leaves(s: &Value, path: &mut Vec<String>, out: &mut Vec<(Vec<String>, Value)>) {
        match s.get("properties").and_then(Value::as_object) {
            Some(props) => {
                for (k, v) in props {
                    path.push(k.clone());
                    leaves(v, path, out);
                    path.pop();
                }
            }
            None => out.push((path.clone(), s.clone())),
        }
    }
    fn loads(path: &[String], v: Value) -> Result<(), String> {
        let mut doc = v;
        for k in path.iter().rev() {
            doc = json!({ k.as_str(): doc });
        }
        let cfg: Config = serde_json::from_value(doc).map_err(|e| e.to_string())?;
        cfg.validate().map_err(|e| e.to_string())
    }
    let schema = schema::config_schema();
    let mut all = Vec::new();
    leaves(&schema, &mut Vec::new(), &mut all);
    let mut checked = 0;
    for (path, s) in &all {
        let key = path.join(".");
        let integer = s["type"] == "integer" || s["type"].as_array().is_some_and(|t| t.contains(&json!("integer")));
        let step = |v: &Value, by: f64| {
            if integer {
                json!(v.as_f64().unwrap() as i64 + by as i64)
            } else {
                json!(v.as_f64().unwrap() + by / 1000.0)
            }
        };
        for (bound, outward) in [("minimum", -1.0), ("maximum", 1.0)] {
            if let Some(b) = s.get(bound) {
                // A u64's maximum is past what JSON's f64 holds exactly: the loader's own limit.
                if b.as_f64().unwrap() >= 2f64.powi(53) {
                    continue;
                }
                let at = if integer { json!(b.as_f64().unwrap() as i64) } else { b.clone() };
                loads(path, at.clone())
                    .unwrap_or_else(|e| panic!("{key} = {at} (the schema's {bound}) is refused: {e}"));
                let past = step(&at, outward);
                assert!(loads(path, past.clone()).is_err(), "{key} = {past} (past the schema's {bound}) loads");
                checked += 1;
            }
        }
        for v in s.get("enum").and_then(Value::as_array).into_iter().flatten() {
            loads(path, v.clone()).unwrap_or_else(|e| panic!("{key} = {v} (in the schema's enum) is refused: {e}"));
            checked += 1;
        }
        if let Some(names) = s["items"].get("enum").and_then(Value::as_array) {
            for v in names {
                loads(path, json!([v]))
                    .unwrap_or_else(|e| panic!("{key} = [{v}] (in the schema's enum) is refused: {e}"));
                checked += 1;
            }
        }
        if let Some(one_of) = s.get("oneOf").and_then(Value::as_array) {
            for v in one_of.iter().filter_map(|o| o.get("const")) {
                loads(path, v.clone()).unwrap_or_else(|e| panic!("{key} = {v} (a schema const) is refused: {e}"));
                checked += 1;
            }
        }
    }
    assert!(checked > 100, "{checked} bounds and values checked");
    // Unknown keys are refused at every depth, as the loader refuses them.
    let mut objects = 0;
    fn closed(s: &Value, key: &str, objects: &mut usize) {
        if let Some(props) = s.get("properties").and_then(Value::as_object) {
            assert_eq!(
                s["additionalProperties"], false,
                "{key}: the schema must refuse unknown keys, as the loader does"
            );
            *objects += 1;
            for (k, v) in props {
                closed(v, &format!("{key}.{k}"), objects);
            }
        }
    }
    closed(&schema, "config", &mut objects);
    assert!(objects >= 8, "{objects} sections");
}
