use super::*;

#[test]
fn parses_stat_with_odd_comm() {
    let s = "1234 (my (weird) proc) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10";
    let p = parse_stat(s).unwrap();
    assert_eq!(p.comm, "my (weird) proc");
    assert_eq!(p.start_time_ticks, 98765);
}

#[test]
fn reads_own_process_and_cgroup_root() {
    let me = std::process::id();
    let info = process_info(Path::new("/proc"), me).unwrap();
    assert!(info.start_time_ticks > 0);
    assert_eq!(tgid_of(Path::new("/proc"), me), Some(me));
    if let Some(root) = crate::source::procscan::cgroup2_mount(Path::new("/proc/self/mountinfo")) {
        let ino = std::fs::metadata(&root).unwrap().ino();
        let mut r = CgroupResolver::new(Some(root));
        assert_eq!(r.resolve(ino).as_deref(), Some("/"));
    }
}
