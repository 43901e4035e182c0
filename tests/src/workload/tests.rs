use super::*;

#[test]
fn parse_sizes_and_numbers() {
    assert_eq!(parse_number("0x10"), Some(16));
    assert_eq!(parse_number("42"), Some(42));
    assert_eq!(parse_number("x"), None);
    assert_eq!(parse_bytes("4096"), Some(4096));
    assert_eq!(parse_bytes("1G"), Some(1 << 30));
    assert_eq!(parse_bytes("2GiB"), Some(2 << 30));
    assert_eq!(parse_bytes("3m"), Some(3 << 20));
    assert_eq!(parse_bytes("64KB"), Some(64 << 10));
    assert_eq!(parse_bytes("0x1000"), Some(4096));
    assert_eq!(parse_bytes("12q"), None);
    assert_eq!(parse_bytes(""), None);
}

#[test]
fn answers_render_one_line() {
    assert_eq!(render(&Ok(String::new())), "ok");
    assert_eq!(render(&Ok("handle=0x1".into())), "ok handle=0x1");
    assert_eq!(
        render(&Err("op=RM_ALLOC status=0x51 name=NV_ERR_NO_MEMORY".into())),
        "err op=RM_ALLOC status=0x51 name=NV_ERR_NO_MEMORY"
    );
}

#[test]
fn commands_without_state_fail_cleanly() {
    let mut c = CudaLikeClient::new(WorkloadOptions { dev_dir: "/nonexistent".into(), ..Default::default() });
    assert!(c.execute("alloc-rm 4096").unwrap_err().starts_with("state:"));
    assert!(c.execute("bad-null").unwrap_err().starts_with("state:"));
    assert!(c.execute("init 0").unwrap_err().starts_with("op=open errno=2"));
    assert!(c.execute("frobnicate").unwrap_err().starts_with("usage:"));
    assert!(c.execute("alloc-rm lots").unwrap_err().starts_with("usage:"));
    assert_eq!(c.execute("pid").unwrap(), format!("pid={}", std::process::id()));
    assert_eq!(c.execute("repeat 3 sleep-ms 0").unwrap(), "repeat=3");
    assert!(c.execute("help").unwrap().contains("alloc-vidheap"));
    for name in COMMANDS {
        assert!(HELP.lines().any(|l| l.split_whitespace().next() == Some(name)), "{name} documented");
    }
    assert_eq!(c.execute("exit").unwrap(), "bye");
    assert!(c.exit_requested());
}
