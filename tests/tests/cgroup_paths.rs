//! cgroup ids become paths when first seen (issue 13, item 9): a cgroup v2 id is a kernfs node id,
//! which the kernel turns into the directory at once (`open_by_handle_at` with a `FILEID_KERNFS`
//! handle), so a container created just after a walk of the hierarchy is named by its path from its
//! first record, not `cgroup="id:N"` until a later one. Real cgroup v2 directories, the real eBPF
//! probes, the fake NVIDIA driver over FUSE. Needs root; fails (never skips) without it.
use std::{
    path::PathBuf,
    sync::Mutex,
    time::{Duration, Instant},
};

use gpu_tracer_tests::{FakeDriver, PodCgroup, Tracer, Workload, cgroup2_mount, config_for, require_root};
use tracer_agent::{
    enrich::{CgroupResolver, cgroup_path_by_id, open_cgroup2_mount},
    export::metrics::{ExpositionFormat, MetricsRegistry},
};

/// The probes are global kernel objects and the machine is small: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    require_root();
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A cgroup directory made by the test, removed (leaf first) on drop.
struct TestCgroup(Vec<PathBuf>);

impl TestCgroup {
    /// `<mount>/<name>/<child>...`, each level created now.
    fn create(parts: &[&str]) -> TestCgroup {
        let mut dir = cgroup2_mount().expect("cgroup2 mount");
        let mut made = Vec::new();
        for p in parts {
            dir.push(p);
            std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
            made.push(dir.clone());
        }
        TestCgroup(made)
    }

    fn id(&self, level: usize) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&self.0[level]).unwrap().ino()
    }

    fn remove_leaf(&mut self) {
        let leaf = self.0.pop().unwrap();
        std::fs::remove_dir(&leaf).unwrap_or_else(|e| panic!("rmdir {}: {e}", leaf.display()));
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for d in self.0.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// The resolver names a cgroup made after its last walk at once, by id, without walking again; a
/// removed one is unknown (and not asked about twice); the kernel's answer is the path relative to
/// the mount.
#[test]
fn a_cgroup_made_after_a_walk_is_resolved_by_id_at_once() {
    let _s = serial();
    let mount = cgroup2_mount().expect("cgroup2 mount");
    let top = format!("gpu-tracer-test-by-id.{}", std::process::id());
    let mut cg = TestCgroup::create(&[&top]);
    let mut r = CgroupResolver::new(Some(mount.clone()));
    assert_eq!(r.resolve(cg.id(0)).as_deref(), Some(format!("/{top}").as_str()));
    let before = r.lookups;
    assert_eq!((before.by_id, before.walks), (1, 0), "resolved by id, no walk: {before:?}");

    // A child with an awkward name, made now.
    cg.0.push(cg.0[0].join("a b.scope"));
    std::fs::create_dir(&cg.0[1]).unwrap();
    let child = cg.id(1);
    assert_eq!(r.resolve(child).as_deref(), Some(format!("/{top}/a b.scope").as_str()));
    assert_eq!((r.lookups.by_id, r.lookups.walks, r.lookups.unresolved), (2, 0, 0), "{:?}", r.lookups);

    // Directly, and how long a lookup takes (open_by_handle_at + readlink + close).
    let (fd, prefix) = open_cgroup2_mount(&mount).expect("open the cgroup2 mount");
    let n = 20_000;
    let t = Instant::now();
    for _ in 0..n {
        let p = cgroup_path_by_id(std::os::fd::AsFd::as_fd(&fd), &prefix, child).unwrap();
        assert_eq!(p.as_deref(), Some(format!("/{top}/a b.scope").as_str()));
    }
    eprintln!("cgroup path by id: {:.2} us per lookup", t.elapsed().as_secs_f64() * 1e6 / n as f64);
    println!(
        "reliability: lookup_us={:.2} by_id={} walks={}",
        t.elapsed().as_secs_f64() * 1e6 / n as f64,
        r.lookups.by_id,
        r.lookups.walks
    );
    let root_id = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&mount).unwrap().ino()
    };
    assert_eq!(cgroup_path_by_id(std::os::fd::AsFd::as_fd(&fd), &prefix, root_id).unwrap().as_deref(), Some("/"));

    cg.remove_leaf();
    assert_eq!(cgroup_path_by_id(std::os::fd::AsFd::as_fd(&fd), &prefix, child).unwrap(), None, "removed");
    let mut fresh = CgroupResolver::new(Some(mount));
    assert_eq!(fresh.resolve(child), None);
    assert_eq!(fresh.resolve(child), None);
    assert_eq!((fresh.lookups.unresolved, fresh.lookups.walks), (1, 0), "asked once: {:?}", fresh.lookups);
}

/// The agent has just resolved cgroups (its last walk, before this change, made a miss in the next
/// 200 ms wait for a later record); a pod's container cgroup is made and a GPU workload starts in it
/// right away. The first snapshot after its first records names the cgroup by its path, in the
/// ledger's row, the container identity and the Prometheus labels: never `id:N`.
#[test]
fn a_container_started_right_after_a_scan_is_named_by_path_at_once() {
    let _s = serial();
    let driver = FakeDriver::start(1).unwrap();
    let mut t = Tracer::start(config_for(&driver));
    // Warm the resolver as a running agent has it: cgroups resolved a moment ago (the old resolver
    // walked the whole hierarchy here, then refused to walk again for 200 ms).
    let mut host = Workload::spawn(driver.dev_dir(), None).unwrap();
    assert!(host.cmd("init 0").unwrap().starts_with("ok"));
    t.settle();
    let _ = t.agent.identity_of(u64::MAX - 1);

    let started = Instant::now();
    let pod = PodCgroup::new().unwrap();
    let mut w = Workload::spawn(driver.dev_dir(), Some(&pod)).unwrap();
    assert!(w.cmd("init 0").unwrap().starts_with("ok"));
    assert!(w.cmd("alloc-rm 1073741824").unwrap().starts_with("ok"));
    let s = t.wait_for("the pod's row", |s| s.state.cgroups.iter().any(|c| c.cgroup_id == pod.id()));
    let elapsed = started.elapsed();

    let row = s.state.cgroups.iter().find(|c| c.cgroup_id == pod.id()).unwrap();
    println!(
        "reliability: named_after_ms={} named_by_path={} paths_by_id={} walks={}",
        elapsed.as_millis(),
        row.path.as_deref() == Some(pod.relative_path()),
        s.pipeline.cgroup_paths_by_id,
        s.pipeline.cgroup_walks
    );
    assert_eq!(row.path.as_deref(), Some(pod.relative_path()), "the ledger's row, {elapsed:?} after mkdir");
    let ident = s.containers.get(&pod.id()).expect("the container's identity");
    assert_eq!(ident.cgroup_path.as_deref(), Some(pod.relative_path()));
    assert_eq!(ident.pod_uid.as_deref(), Some(pod.pod_uid()));
    let text = MetricsRegistry::new().encode(&std::sync::Arc::new(s.clone()), ExpositionFormat::Prometheus).unwrap();
    let vidmem =
        |needle: &str| text.lines().any(|l| l.starts_with("gpu_tracer_cgroup_vidmem_bytes{") && l.contains(needle));
    assert!(vidmem(&format!("cgroup=\"{}\"", pod.relative_path())), "labelled by path:\n{text}");
    assert!(!vidmem(&format!("cgroup=\"id:{}\"", pod.id())), "never by id:\n{text}");
    assert!(elapsed < Duration::from_secs(2), "named {elapsed:?} after the cgroup was made");

    // Every new cgroup was resolved by id; the hierarchy was never walked.
    let p = &s.pipeline;
    assert!(p.cgroup_paths_by_id >= 2, "{p:?}");
    assert_eq!((p.cgroup_walks, p.cgroup_paths_by_walk), (0, 0), "{p:?}");
    assert!(text.contains("gpu_tracer_cgroup_path_lookups_total{result=\"by_id\"}"), "{text}");
    drop((w, host, pod, t));
}
