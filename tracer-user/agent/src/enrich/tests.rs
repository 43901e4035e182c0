use super::*;

#[test]
fn process_info_from_a_stat_with_odd_comm() {
    let p = ProcessInfo::from(&crate::proc::parse::stat(crate::proc::tests::ODD_STAT).unwrap());
    assert_eq!(p.comm, "my (weird) proc");
    assert_eq!(p.start_time_ticks, 98765);
}

#[test]
fn reads_own_process_and_cgroup_root() {
    let me = std::process::id();
    let info = process_info(Path::new("/proc"), me).unwrap();
    assert!(info.start_time_ticks > 0);
    assert_eq!(tgid_of(Path::new("/proc"), me), Some(me));
    if let Some(root) = crate::proc::cgroup2_mount(Path::new("/proc")) {
        let ino = std::fs::metadata(&root).unwrap().ino();
        let mut r = CgroupResolver::new(Some(root));
        assert_eq!(r.resolve(ino).as_deref(), Some("/"));
        // By id (root: CAP_DAC_READ_SEARCH) or, where refused, by the walk; counted either way.
        let l = r.lookups;
        assert_eq!((l.by_id + l.by_walk, l.unresolved), (1, 0), "{l:?}");
        assert_eq!(r.resolve(ino).as_deref(), Some("/"));
        assert_eq!(r.lookups, l, "a known id is not looked up again");
        assert_eq!(r.resolve(0), None, "cgroup id 0 means unknown");
    }
}

#[test]
fn kernel_paths_are_made_relative_to_the_mount() {
    let m = "/sys/fs/cgroup";
    assert_eq!(relative_cgroup_path(m, "/sys/fs/cgroup").as_deref(), Some("/"));
    assert_eq!(relative_cgroup_path(m, "/sys/fs/cgroup/a.slice/b.scope").as_deref(), Some("/a.slice/b.scope"));
    assert_eq!(relative_cgroup_path(m, "/sys/fs/cgroupx/a"), None, "a sibling mount is not under it");
    assert_eq!(relative_cgroup_path(m, "/other/a"), None);
    assert_eq!(relative_cgroup_path(m, "/sys/fs/cgroup/gone (deleted)"), None);
    assert_eq!(relative_cgroup_path("/", "/a/b").as_deref(), Some("/a/b"));
    assert_eq!(relative_cgroup_path("/", "/").as_deref(), Some("/"));
}

#[test]
fn a_directory_that_is_not_cgroup2_is_refused_for_lookups_by_id() {
    let dir = std::env::temp_dir();
    let e = open_cgroup2_mount(&dir).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::Unsupported, "{e}");
}

/// Without lookups by id (here: the "mount" is a plain directory) a miss walks the tree, at most
/// every 200 ms: a directory made just after a walk is unknown until the next one is due. (With
/// lookups by id, tests/tests/cgroup_paths.rs shows it named at once.)
#[test]
fn without_lookups_by_id_a_miss_walks_at_most_every_200_ms() {
    let root = std::env::temp_dir().join(format!("gpu-tracer-walk-test.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("a/b")).unwrap();
    let ino = |p: &str| std::fs::metadata(root.join(p)).unwrap().ino();
    let mut r = CgroupResolver::new(Some(root.clone()));
    assert_eq!(r.resolve(ino("a/b")).as_deref(), Some("/a/b"));
    assert_eq!((r.lookups.walks, r.lookups.by_walk, r.lookups.by_id), (1, 1, 0), "{:?}", r.lookups);
    std::fs::create_dir(root.join("c")).unwrap();
    assert_eq!(r.resolve(ino("c")), None, "a walk is not due yet");
    assert_eq!((r.lookups.walks, r.lookups.unresolved), (1, 1), "{:?}", r.lookups);
    std::thread::sleep(Duration::from_millis(210));
    assert_eq!(r.resolve(ino("c")).as_deref(), Some("/c"));
    assert_eq!((r.lookups.walks, r.lookups.by_walk), (2, 2), "{:?}", r.lookups);
    std::fs::remove_dir_all(&root).unwrap();
}

/// Issue 45 item 5: a cgroup named by path stays inside the cgroup2 mount: `..`, a file, or a
/// directory on another file system (here a symlink to /proc) is no cgroup; a real one is found,
/// with or without a leading `/` or `./`. The "mount" is a temporary directory.
#[test]
fn a_cgroup_path_cannot_leave_the_cgroup2_mount() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("cg");
    std::fs::create_dir_all(root.join("kubepods/pod1")).unwrap();
    std::fs::write(root.join("kubepods/cgroup.procs"), "").unwrap();
    std::os::unix::fs::symlink("/proc", root.join("elsewhere")).unwrap();
    let e = Enricher::new(PathBuf::from("/proc"), Some(root.clone()));
    let ino = std::fs::metadata(root.join("kubepods/pod1")).unwrap().ino();
    for ok in ["kubepods/pod1", "/kubepods/pod1", "./kubepods/pod1"] {
        assert_eq!(e.cgroup_id(ok), Some(ino), "{ok}");
    }
    for bad in [
        "../cg/kubepods/pod1",
        "kubepods/../../../../etc",
        "../../../../etc",
        "kubepods/cgroup.procs",
        "elsewhere",
        "nope",
    ] {
        assert_eq!(e.cgroup_id(bad), None, "{bad}");
    }
    assert_eq!(e.cgroup_id("12345"), Some(12345), "an id is taken as it is");
}
