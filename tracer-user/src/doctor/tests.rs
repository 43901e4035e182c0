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

#[test]
fn a_missing_node_says_how_to_fix_it() {
    let c = device_node_check("/nonexistent/nvidiactl");
    assert_eq!(c.status, CheckStatus::Warn);
    assert!(c.detail.contains("not found") && c.detail.contains("--dev-dir"), "{}", c.detail);
}
