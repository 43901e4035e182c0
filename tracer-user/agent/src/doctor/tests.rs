use super::*;

#[test]
fn a_character_device_is_a_device_node() {
    let c = device_node_check("/dev/null");
    assert_eq!(c.status, CheckStatus::Ok, "{c:?}");
    assert_eq!(c.detail, "/dev/null present (character device 1:3)");
}

#[test]
fn a_regular_file_is_not_the_driver() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = dir.path().join("nvidiactl");
    std::fs::write(&ctl, b"").unwrap();
    let c = device_node_check(ctl.to_str().unwrap());
    assert_eq!(c.status, CheckStatus::Warn, "{c:?}");
    assert!(c.detail.contains("is a regular file, not the NVIDIA driver's character device"), "{}", c.detail);
    assert!(c.detail.contains("the driver is not loaded here"), "{}", c.detail);
}

/// `doctor` reports a configuration the agent would refuse, instead of refusing to look.
#[test]
fn the_config_check_reports_what_the_agent_would_refuse() {
    let ok = config_check(&Config::default());
    assert_eq!(ok.status, CheckStatus::Ok, "{ok:?}");
    let bad = config_check(&Config { dev_dir: "/nonexistent/dev".into(), ..Default::default() });
    assert_eq!(bad.status, CheckStatus::Fail, "{bad:?}");
    assert!(bad.detail.starts_with("invalid setting dev_dir: /nonexistent/dev does not exist"), "{bad:?}");
    let bad = config_check(&Config { max_processes: 0, ..Default::default() });
    assert!(bad.detail.starts_with("invalid setting max_processes: 0"), "{bad:?}");
}

#[test]
fn a_missing_node_says_how_to_fix_it() {
    let c = device_node_check("/nonexistent/nvidiactl");
    assert_eq!(c.status, CheckStatus::Warn);
    assert!(c.detail.contains("not found") && c.detail.contains("--dev-dir"), "{}", c.detail);
}

/// `otlp` says off, reachable, or unreachable (a warning: the agent runs and counts drops), and a
/// bad environment value fails naming the key; `api` says when an agent already serves there.
#[test]
fn exporter_checks_say_where_data_goes_and_whether_it_gets_there() {
    let cfg = Config::default();
    let none = |_: &str| None;
    let otlp = |env: &dyn Fn(&str) -> Option<String>| {
        exporter_checks(&cfg, env).into_iter().find(|c| c.name == "otlp").unwrap()
    };
    let off = otlp(&none);
    assert_eq!(off.status, CheckStatus::Ok, "{off:?}");
    assert!(off.detail.starts_with("off"), "{off:?}");
    let listening = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let up = format!("http://{}", listening.local_addr().unwrap());
    let ok = otlp(&|k: &str| (k == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| up.clone()));
    assert_eq!(ok.status, CheckStatus::Ok, "{ok:?}");
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let down = otlp(&|k: &str| (k == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| closed.clone()));
    assert_eq!(down.status, CheckStatus::Warn, "{down:?}");
    assert!(down.detail.contains("dropped"), "{down:?}");
    let bad = otlp(&|k: &str| match k {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some(up.clone()),
        "OTEL_EXPORTER_OTLP_PROTOCOL" => Some("carrier-pigeon".into()),
        _ => None,
    });
    assert_eq!(bad.status, CheckStatus::Fail, "{bad:?}");
    assert!(bad.detail.contains("OTEL_EXPORTER_OTLP_PROTOCOL"), "{bad:?}");
    // What the agent refuses at start, doctor fails too (issue 45 item 3: it said "reachable").
    let header = otlp(&|k: &str| match k {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some(up.clone()),
        "OTEL_EXPORTER_OTLP_HEADERS" => Some("bad header=x".into()),
        _ => None,
    });
    assert_eq!(header.status, CheckStatus::Fail, "{header:?}");
    assert!(header.detail.contains("otlp.headers"), "{header:?}");

    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("api.sock");
    let _live = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let mut cfg = Config::default();
    cfg.api.listen = format!("unix://{}", sock.display());
    let api = exporter_checks(&cfg, none).into_iter().find(|c| c.name == "api").unwrap();
    assert!(api.detail.contains("an agent is serving there"), "{api:?}");
}
