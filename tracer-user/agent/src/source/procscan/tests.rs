use super::*;

#[test]
fn classifies_every_node_kind() {
    let p = "/dev/nvidia";
    assert_eq!(classify_device_path(p, "/dev/nvidiactl").unwrap().kind, device_kind::CTL);
    let g = classify_device_path(p, "/dev/nvidia7").unwrap();
    assert_eq!((g.kind, g.minor), (device_kind::GPU, 7));
    assert_eq!(classify_device_path(p, "/dev/nvidia-uvm").unwrap().kind, device_kind::UVM);
    assert_eq!(classify_device_path(p, "/dev/nvidia-uvm-tools").unwrap().kind, device_kind::UVM_TOOLS);
    assert_eq!(classify_device_path(p, "/dev/nvidia-modeset").unwrap().kind, device_kind::MODESET);
    let c = classify_device_path(p, "/dev/nvidia-caps/nvidia-cap12").unwrap();
    assert_eq!((c.kind, c.minor), (device_kind::CAPS, 12));
    assert!(classify_device_path(p, "/dev/nvidiafoo").is_none());
    assert!(classify_device_path(p, "/dev/null").is_none());
    assert!(classify_device_path(p, "/dev/nvidia").is_none());
    assert!(classify_device_path(p, "/dev/nvidia12345").is_none());
}

#[test]
fn scan_finds_our_own_dup_as_one_file() {
    // Open a file under a temp "device dir" and dup it; the scan must report both fds with one id.
    let dir = std::env::temp_dir().join(format!("gt-scan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("nvidiactl");
    std::fs::write(&path, b"").unwrap();
    let f = std::fs::File::open(&path).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: dup on an fd this test owns (f is open until the end of the test).
    let dupfd = unsafe { libc::dup(f.as_raw_fd()) };
    let prefix = format!("{}/nvidia", dir.display());
    // A regular file is an NVIDIA device only when it is listed as simulated.
    let mut accepted = Accepted { enabled: true, majors: vec![195], ..Default::default() };
    let refused = scan_one(Path::new("/proc"), &prefix, &accepted, std::process::id());
    assert!(refused.found.is_empty(), "{refused:?}");
    assert_eq!(refused.not_devices, 2);
    accepted.simulated.extend(crate::probe::devcheck::simulated_files(&dir));
    let found = scan(Path::new("/proc"), &prefix, &accepted, 0).found;
    let me = std::process::id();
    let mine: Vec<_> = found.iter().filter(|s| s.tgid == me).collect();
    assert_eq!(mine.len(), 2, "{found:?}");
    assert_eq!(mine[0].dev.file_id, mine[1].dev.file_id);
    assert_eq!(mine[0].dev.kind, device_kind::CTL);
    // SAFETY: closes the fd dup returned above, once; nothing else uses it.
    unsafe { libc::close(dupfd) };
    drop(f);
    std::fs::remove_dir_all(&dir).unwrap();
}
