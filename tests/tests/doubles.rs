//! Root tests of the doubles themselves: the FUSE fake driver answering real ioctls from the
//! workload program, pod-like cgroups, and the guards' cleanup. Every test needs root and /dev/fuse
//! and fails (never skips) without them.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use gpu_tracer_tests::fake_driver::{self, is_stale_mount};
use gpu_tracer_tests::{Answer, FakeDriver, PodCgroup, Qos, Runtime, Workload, require_root};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);

fn driver(gpus: u32) -> FakeDriver {
    FakeDriver::builder()
        .gpus(gpus)
        .binary(env!("CARGO_BIN_EXE_fake-nvidia-driver"))
        .start()
        .expect("fake driver mounts")
}

fn workload(d: &FakeDriver, cg: Option<&PodCgroup>) -> Workload {
    let mut b = Workload::builder(d.dev_dir()).binary(env!("CARGO_BIN_EXE_nv-workload"));
    if let Some(cg) = cg {
        b = b.cgroup(cg);
    }
    b.spawn().expect("nv-workload starts")
}

fn ok(w: &mut Workload, cmd: &str) -> Answer {
    w.ok(cmd).unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

fn err(w: &mut Workload, cmd: &str) -> Answer {
    let a = w.answer(cmd).unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(!a.ok, "{cmd} should fail, got {:?}", a.line);
    a
}

fn handle(w: &mut Workload, cmd: &str) -> u32 {
    ok(w, cmd).handle("handle").unwrap()
}

#[test]
fn driver_mounts_and_serves_device_files() {
    require_root();
    let d = driver(2);
    let mut names: Vec<String> =
        std::fs::read_dir(d.dev_dir()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(
        names,
        [".fake-driver-stats", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1", "nvidiactl"]
    );
    let m = std::fs::metadata(d.path("nvidiactl")).unwrap();
    assert!(m.is_file());
    assert_eq!(m.mode() & 0o777, 0o666);
    assert_eq!(std::fs::read(d.path("nvidia0")).unwrap(), b"", "device files read as empty");
    assert!(std::fs::metadata(d.path("nvidia2")).is_err());
    let s = d.stats().unwrap();
    assert_eq!(s.driver_version, "535.261.03");
    assert_eq!(s.gpus.len(), 2);
    assert_eq!(s.gpus[1].capacity_bytes, 80 * GIB);
    assert!(s.clients.is_empty() && s.open_files.is_empty());
    assert!(fake_driver::fake_driver_mounts().iter().any(|p| p == d.dev_dir()));
}

#[test]
fn init_alloc_free_through_real_ioctls() {
    require_root();
    let d = driver(2);
    let mut w = workload(&d, None);
    let init = ok(&mut w, "init 1");
    let client = init.handle("client").unwrap();
    let device = init.handle("device").unwrap();
    let subdevice = init.handle("subdevice").unwrap();
    assert_eq!(client & 0xfff0_0000, 0xc1d0_0000, "{}", init.line);
    assert_eq!(device & 0xfff0_0000, 0xcaf0_0000);
    assert_ne!(device, subdevice);

    let rm = handle(&mut w, "alloc-rm 1073741824");
    let rm21 = handle(&mut w, "alloc-rm21 512M");
    let vh = handle(&mut w, "alloc-vidheap 256M");
    let sys = handle(&mut w, "alloc-rm 64M sysmem");
    let mem = handle(&mut w, "alloc-memory 32M");

    let s = d.stats().unwrap();
    let c = s.client(client).expect("client listed");
    assert_eq!(c.pid, w.pid());
    let size = |h: u32| s.object(client, h).and_then(|o| o.memory.clone()).map(|m| (m.bytes, m.location, m.source));
    assert_eq!(size(rm), Some((GIB, "vidmem".into(), "rm_alloc".into())));
    assert_eq!(size(rm21), Some((512 * MIB, "vidmem".into(), "rm_alloc".into())));
    assert_eq!(size(vh), Some((256 * MIB, "vidmem".into(), "vid_heap".into())));
    assert_eq!(size(sys), Some((64 * MIB, "sysmem".into(), "rm_alloc".into())));
    assert_eq!(size(mem), Some((32 * MIB, "vidmem".into(), "alloc_memory".into())));
    assert_eq!(s.object(client, device).unwrap().gpu, Some(1), "deviceId read from NV0080_ALLOC_PARAMETERS");
    assert_eq!(s.used_bytes(1), GIB + 512 * MIB + 256 * MIB + 32 * MIB);
    assert_eq!(s.used_bytes(0), 0);
    assert_eq!(s.ioctl_calls("CHECK_VERSION_STR"), 1);
    assert_eq!(s.ioctl_calls("REGISTER_FD"), 1);
    assert_eq!(s.ioctl_calls("RM_CONTROL"), 3);
    assert_eq!(s.ioctl_calls("UVM_INITIALIZE"), 1);
    assert_eq!(s.ioctl_calls("UVM_REGISTER_GPU"), 1);
    assert_eq!(s.ioctl_calls("RM_ALLOC"), 3 + 3, "client, device, subdevice + 3 RM_ALLOC memory allocations");
    assert_eq!(s.ioctl_calls("RM_VID_HEAP_CONTROL"), 1);
    assert_eq!(s.ioctl_calls("RM_ALLOC_MEMORY"), 1);

    ok(&mut w, &format!("free {rm:#x}"));
    ok(&mut w, &format!("free-vidheap {vh:#x}"));
    let e = err(&mut w, &format!("free {rm:#x}"));
    assert_eq!(e.get("status"), Some("0x33"), "NV_ERR_INVALID_OBJECT_HANDLE: {}", e.line);
    assert_eq!(e.get("op"), Some("RM_FREE"));
    let s = d.stats().unwrap();
    assert!(s.object(client, rm).is_none() && s.object(client, vh).is_none());
    assert_eq!(s.used_bytes(1), 512 * MIB + 32 * MIB);

    // dup-object: a second handle to the same memory, not new memory.
    let dup = handle(&mut w, &format!("dup-object {rm21:#x}"));
    let s = d.stats().unwrap();
    assert_eq!(s.object(client, dup).unwrap().memory.as_ref().unwrap().refs, 2);
    assert_eq!(s.used_bytes(1), 512 * MIB + 32 * MIB);
}

#[test]
fn capacity_exhaustion_gives_no_memory() {
    require_root();
    let d = FakeDriver::builder()
        .gpus(1)
        .gpu_memory_bytes(2 * GIB)
        .binary(env!("CARGO_BIN_EXE_fake-nvidia-driver"))
        .start()
        .unwrap();
    let mut w = workload(&d, None);
    ok(&mut w, "init 0");
    let big = handle(&mut w, "alloc-vidheap 1536M");
    for cmd in ["alloc-vidheap 1G", "alloc-rm 1G", "alloc-rm21 1G", "alloc-memory 1G"] {
        let e = err(&mut w, cmd);
        assert_eq!(e.get("status"), Some("0x51"), "{cmd}: {}", e.line);
        assert_eq!(e.get("name"), Some("NV_ERR_NO_MEMORY"));
    }
    // System memory is not charged against the GPU.
    handle(&mut w, "alloc-rm 4G sysmem");
    assert_eq!(d.stats().unwrap().used_bytes(0), 1536 * MIB);
    ok(&mut w, &format!("free-vidheap {big:#x}"));
    handle(&mut w, "alloc-rm 1G");
    assert_eq!(d.stats().unwrap().used_bytes(0), GIB);
}

#[test]
fn whole_client_free_releases_everything() {
    require_root();
    let d = driver(1);
    let mut w = workload(&d, None);
    let client = ok(&mut w, "init 0").handle("client").unwrap();
    handle(&mut w, "alloc-rm 1G");
    handle(&mut w, "alloc-vidheap 1G");
    handle(&mut w, "alloc-rm21 1G");
    let s = d.stats().unwrap();
    assert_eq!(s.client(client).unwrap().objects.len(), 5);
    ok(&mut w, "free-client");
    let s = d.stats().unwrap();
    assert!(s.clients.is_empty());
    assert_eq!(s.used_bytes(0), 0);
    assert_eq!(s.totals.objects_freed, 5);
    assert_eq!(s.open_files.len(), 3, "the fds stay open");
    // Later calls on the freed client fail like the real driver's.
    let e = err(&mut w, &format!("free {client:#x}"));
    assert_eq!(e.get("status"), Some("0x23"), "NV_ERR_INVALID_CLIENT: {}", e.line);
}

#[test]
fn close_all_and_exit_release_clients_at_last_close() {
    require_root();
    let d = driver(1);
    let mut w = workload(&d, None);
    let client = ok(&mut w, "init 0").handle("client").unwrap();
    handle(&mut w, "alloc-rm 2G");

    // A dup'd ctl fd keeps the file (and the client) alive after the original is closed.
    let dup = ok(&mut w, "dup ctl");
    assert_ne!(dup.number("fd").unwrap(), dup.number("orig").unwrap());
    ok(&mut w, "close-orig ctl");
    handle(&mut w, "alloc-vidheap 1G");
    let s = d.stats().unwrap();
    assert_eq!(s.client(client).unwrap().objects.len(), 4);
    assert_eq!(s.used_bytes(0), 3 * GIB);

    assert_eq!(ok(&mut w, "close-all").number("closed").unwrap(), 3);
    let s = d.wait_for_stats("clients released", RELEASE_TIMEOUT, |s| s.clients.is_empty()).unwrap();
    assert_eq!(s.used_bytes(0), 0);
    assert!(s.open_files.is_empty());
    assert_eq!(s.totals.releases, 3);

    // The same through process exit, without any free or close.
    let mut w2 = workload(&d, None);
    let c2 = ok(&mut w2, "init 0").handle("client").unwrap();
    handle(&mut w2, "alloc-rm 1G");
    assert!(d.stats().unwrap().client(c2).is_some());
    assert_eq!(ok(&mut w2, "exit").line, "ok bye");
    assert!(w2.wait().unwrap().success());
    let s = d
        .wait_for_stats("exit releases", RELEASE_TIMEOUT, |s| s.clients.is_empty() && s.open_files.is_empty())
        .unwrap();
    assert_eq!(s.used_bytes(0), 0);

    // The workload can start over after close-all.
    ok(&mut w, "init 0");
}

#[test]
fn release_is_per_open_file() {
    require_root();
    let d = driver(1);
    let (mut a, mut b) = (workload(&d, None), workload(&d, None));
    let ca = ok(&mut a, "init 0").handle("client").unwrap();
    let cb = ok(&mut b, "init 0").handle("client").unwrap();
    assert_ne!(ca, cb);
    handle(&mut a, "alloc-rm 1G");
    handle(&mut b, "alloc-rm 2G");
    ok(&mut a, "close-all");
    let s = d.wait_for_stats("a released", RELEASE_TIMEOUT, |s| s.client(ca).is_none()).unwrap();
    assert!(s.client(cb).is_some());
    assert_eq!(s.used_bytes(0), 2 * GIB);
    assert_eq!(s.clients_of(b.pid()).count(), 1);
}

#[test]
fn managed_mmap_of_uvm_works() {
    require_root();
    let d = driver(1);
    let mut w = workload(&d, None);
    ok(&mut w, "init 0");
    let m = ok(&mut w, "managed-mmap 64M");
    let addr = m.number("addr").unwrap();
    assert_eq!(m.number("len").unwrap(), 64 * MIB);
    // /proc/PID/maps: a shared RW mapping of nvidia-uvm whose file offset equals its address.
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", w.pid())).unwrap();
    let line = maps
        .lines()
        .find(|l| l.starts_with(&format!("{addr:x}-")))
        .unwrap_or_else(|| panic!("no mapping at {addr:#x} in\n{maps}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields[1], "rw-s", "{line}");
    assert_eq!(u64::from_str_radix(fields[2], 16).unwrap(), addr, "offset == address: {line}");
    assert!(line.ends_with("/nvidia-uvm"), "{line}");

    let base = ok(&mut w, "uvm-map-external 0xcaf00001 8M").number("base").unwrap();
    ok(&mut w, &format!("uvm-free {base:#x}"));
    let s = d.stats().unwrap();
    assert_eq!(s.ioctl_calls("UVM_CREATE_EXTERNAL_RANGE"), 1);
    assert_eq!(s.ioctl_calls("UVM_MAP_EXTERNAL_ALLOCATION"), 1);
    assert_eq!(s.ioctl_calls("UVM_FREE"), 1);

    // A mapping holds its file: after close-all nvidia-uvm stays open until the munmap.
    ok(&mut w, "close-all");
    d.wait_for_stats("ctl and gpu released", RELEASE_TIMEOUT, |s| s.open_files.len() == 1).unwrap();
    assert_eq!(d.stats().unwrap().open_files[0].node, "nvidia-uvm");
    ok(&mut w, &format!("managed-munmap {addr:#x}"));
    d.wait_for_stats("uvm released", RELEASE_TIMEOUT, |s| s.open_files.is_empty()).unwrap();
}

#[test]
fn bad_inputs_do_not_crash_either_process() {
    require_root();
    let d = driver(1);
    let mut w = workload(&d, None);
    ok(&mut w, "init 0");
    let before = d.assert_bad_arguments_refused(&mut w);
    // Both processes are still fine.
    ok(&mut w, "pid");
    handle(&mut w, "alloc-rm 1M");
    let s = d.stats().unwrap();
    assert_eq!(s.ioctl_errnos("RM_ALLOC"), before.ioctl_errnos("RM_ALLOC") + 1, "bad-size");
    // bad-size, bad-nested-null, the race, the last alloc-rm.
    assert!(s.ioctl_calls("RM_ALLOC") >= before.ioctl_calls("RM_ALLOC") + 3 + 400);
    // Whatever the race created is the client's and goes with it.
    ok(&mut w, "close-all");
    d.wait_for_stats("race leftovers released", RELEASE_TIMEOUT, |s| s.clients.is_empty()).unwrap();
}

#[test]
fn workload_runs_inside_a_pod_cgroup() {
    require_root();
    let d = driver(1);
    let cg = PodCgroup::new().unwrap();
    let rel = cg.relative_path().to_string();
    let uid_ = cg.pod_uid().replace('-', "_");
    assert!(
        rel.starts_with(&format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-"
        )) || std::env::var_os("GPU_TRACER_TEST_CGROUP_BASE").is_some(),
        "{rel}"
    );
    assert!(rel.ends_with(&format!("cri-containerd-{}.scope", cg.container_id())));
    assert_eq!(cg.container_id().len(), 64);
    assert!(cg.container_id().bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(cg.id(), std::fs::metadata(cg.path()).unwrap().ino());

    let mut w = workload(&d, Some(&cg));
    let own = std::fs::read_to_string(format!("/proc/{}/cgroup", w.pid())).unwrap();
    assert!(own.lines().any(|l| l == format!("0::{rel}")), "/proc/PID/cgroup:\n{own}");
    assert_eq!(cg.procs().unwrap(), vec![w.pid()]);
    // And it works from there.
    ok(&mut w, "init 0");
    handle(&mut w, "alloc-rm 1G");
    assert_eq!(d.stats().unwrap().clients[0].pid, w.pid());

    // Dropping the guard kills what is left and removes the directories.
    let path = cg.path().to_path_buf();
    let pod_dir = path.parent().unwrap().to_path_buf();
    drop(cg);
    assert!(!path.exists() && !pod_dir.exists());
    assert!(w.wait().is_ok());
}

#[test]
fn pod_cgroup_naming_variants() {
    require_root();
    let g = PodCgroup::create(Qos::Guaranteed, Runtime::CriO).unwrap();
    let uid_ = g.pod_uid().replace('-', "_");
    assert!(
        g.relative_path()
            .ends_with(&format!("/kubepods.slice/kubepods-pod{uid_}.slice/crio-{}.scope", g.container_id()))
    );
    let b = PodCgroup::create(Qos::BestEffort, Runtime::Docker).unwrap();
    let uid_ = b.pod_uid().replace('-', "_");
    assert!(b.relative_path().ends_with(&format!(
        "/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/docker-{}.scope",
        b.container_id()
    )));
    // A process moved in after start is seen, and killed on drop.
    let mut child = Command::new("sleep").arg("60").spawn().unwrap();
    b.add_process(child.id()).unwrap();
    assert_eq!(b.procs().unwrap(), vec![child.id()]);
    let path = b.path().to_path_buf();
    drop(b);
    assert!(!path.exists());
    assert!(!child.wait().unwrap().success());
    drop(g);
}

#[test]
fn stale_mount_is_cleaned_up() {
    require_root();
    let d = driver(1);
    let dev = d.dev_dir().to_path_buf();
    // SIGKILL: no chance to unmount; the mount stays with a dead connection.
    // SAFETY: kill(2) takes plain integers and touches no memory of ours. The pid is the driver child
    // `d` still owns (started above, not yet waited for), so it cannot name a recycled process.
    unsafe { libc::kill(d.pid() as libc::pid_t, libc::SIGKILL) };
    // (A FakeDriver started concurrently by another test may already have detached it.)
    let gone = || !fake_driver::fake_driver_mounts().contains(&dev);
    gpu_tracer_tests::eventually("mount goes stale", Duration::from_secs(5), || {
        (is_stale_mount(&dev) || gone()).then_some(())
    })
    .unwrap();
    drop(d);
    assert!(!fake_driver::fake_driver_mounts().contains(&dev), "stale mount detached");
    assert!(!dev.exists());
}

#[test]
fn driver_version_selects_layouts_and_is_checked() {
    require_root();
    let d = FakeDriver::builder()
        .driver_version("550.54.14")
        .binary(env!("CARGO_BIN_EXE_fake-nvidia-driver"))
        .start()
        .unwrap();
    assert_eq!(d.stats().unwrap().driver_version, "550.54.14");
    // A client built for another driver fails the strict version check, like libcuda would.
    let mut old = workload(&d, None);
    let e = err(&mut old, "init 0");
    assert_eq!((e.get("op"), e.get("errno")), (Some("CHECK_VERSION_STR"), Some("22")), "{}", e.line);
    // A matching client uses the 550 layouts (9264-byte UVM_MAP_EXTERNAL_ALLOCATION).
    let mut w = Workload::builder(d.dev_dir())
        .binary(env!("CARGO_BIN_EXE_nv-workload"))
        .driver_version("550.54.14")
        .spawn()
        .unwrap();
    ok(&mut w, "init 0");
    let h = handle(&mut w, "alloc-rm 16M");
    ok(&mut w, &format!("uvm-map-external {h:#x} 16M"));
}

#[test]
fn script_mode_runs_a_sequence() {
    require_root();
    let d = driver(1);
    let bin = env!("CARGO_BIN_EXE_nv-workload");
    let run = |script: &str| {
        Command::new(bin).arg("--dev-dir").arg(d.dev_dir()).arg("--script").arg(script).output().unwrap()
    };
    let out = run("init 0; alloc-rm 1G; alloc-vidheap 256M; free-client; close-all");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 5, "{text}");
    assert!(text.lines().all(|l| l.starts_with("ok")), "{text}");
    let out = run("init 0; free 0x1234");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8(out.stdout).unwrap().lines().last().unwrap().starts_with("err op=RM_FREE"));
}

#[test]
fn device_files_are_identified_by_path() {
    require_root();
    let d = driver(1);
    let mut w = workload(&d, None);
    ok(&mut w, "init 0");
    let fds = ok(&mut w, "fds");
    for (name, file) in [("ctl", "nvidiactl"), ("gpu", "nvidia0"), ("uvm", "nvidia-uvm")] {
        let fd = fds.number(name).unwrap();
        let target = std::fs::read_link(format!("/proc/{}/fd/{fd}", w.pid())).unwrap();
        assert_eq!(target, Path::new(d.dev_dir()).join(file));
    }
}
