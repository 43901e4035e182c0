//! Root tests of the kernel-module double of the NVIDIA driver (tests/kmod: `nvidia.ko`,
//! `nvidia-uvm.ko`, served by `fake-nvidia-driver --kmod`): real character devices with the real
//! driver's entry points, answering the workload's real ioctls through the same RM model as the
//! FUSE double (tests/doubles.rs checks the same facts there).
//!
//! The modules are built for Debian's 6.1 and 5.10 kernels (`cargo xtask kmod [--kernel 5.10]`);
//! this machine's kernel cannot load them. So every test here is `#[ignore]`d (allowed in `cargo
//! xtask test`, see xtask/src/test/mod.rs) and runs in a guest:
//! `cargo xtask kernel-matrix [--kernel 5.10] --test driver_double` builds the modules and passes
//! `--include-ignored`. Run anywhere else with `--include-ignored`, each test fails naming the
//! missing module and the fix.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gpu_tracer_tests::{Answer, FakeDriver, Workload, eventually, require_root, scaled};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// One server at a time can attach to /dev/nvidia-double, and the GPU count is a module
/// parameter: the tests take turns.
static SERIAL: Mutex<()> = Mutex::new(());

/// The double with its turn held; the driver is dropped before the turn is given up.
struct Double {
    d: FakeDriver,
    _turn: MutexGuard<'static, ()>,
}

impl std::ops::Deref for Double {
    type Target = FakeDriver;
    fn deref(&self) -> &FakeDriver {
        &self.d
    }
}

fn double(gpus: u32) -> Double {
    require_root();
    let turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = FakeDriver::builder()
        .gpus(gpus)
        .binary(env!("CARGO_BIN_EXE_fake-nvidia-driver"))
        .start_kmod()
        .unwrap_or_else(|e| panic!("the kernel-module double starts: {e}"));
    Double { d, _turn: turn }
}

fn workload(d: &FakeDriver) -> Workload {
    Workload::builder(d.dev_dir()).binary(env!("CARGO_BIN_EXE_nv-workload")).spawn().expect("nv-workload starts")
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

/// The major of the character-device region `name` in /proc/devices.
fn char_major(name: &str) -> Vec<u32> {
    let text = std::fs::read_to_string("/proc/devices").unwrap();
    text.lines()
        .skip_while(|l| !l.starts_with("Character devices:"))
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.trim().split_once(' '))
        .filter(|(_, n)| *n == name)
        .map(|(m, _)| m.parse().unwrap())
        .collect()
}

/// (major, minor, permission bits) of a character device; panics if it is something else.
fn char_device(path: &str) -> (u32, u32, u32) {
    let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert!(m.file_type().is_char_device(), "{path} is a character device");
    (libc::major(m.rdev()), libc::minor(m.rdev()), m.mode() & 0o777)
}

/// An ioctl straight from this process; Err(errno).
fn raw_ioctl(path: &str, cmd: u32, arg: *mut libc::c_void) -> Result<i32, i32> {
    let f = OpenOptions::new().read(true).write(true).open(path).unwrap();
    // SAFETY: the fd is open; the kernel checks `arg` (the point of these calls is bad ones).
    let r = unsafe { libc::ioctl(f.as_raw_fd(), cmd as _, arg) };
    if r < 0 { Err(std::io::Error::last_os_error().raw_os_error().unwrap()) } else { Ok(r) }
}

/// SIGSTOP `pid` and wait until it is stopped (out of its read of the control device, so the
/// next request stays queued, unread).
fn stop(pid: u32) {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    eventually("the server stopped", Duration::from_secs(10), || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        (stat.rsplit_once(") ")?.1.starts_with('T')).then_some(())
    })
    .unwrap();
}

/// The kernel has not warned or oopsed (`/proc/sys/kernel/tainted` bits W and D); loading our
/// unsigned out-of-tree modules sets O and E, which are expected.
fn assert_kernel_not_warned() {
    let tainted: u64 = std::fs::read_to_string("/proc/sys/kernel/tainted").unwrap().trim().parse().unwrap();
    assert_eq!(tainted & ((1 << 7) | (1 << 9)), 0, "the kernel warned or oopsed (tainted={tainted:#x}); see dmesg");
}

const fn iowr(nr: u32, size: u32) -> u32 {
    (3 << 30) | (size << 16) | ((b'F' as u32) << 8) | nr
}

#[test]
#[ignore = "runs in the Debian 6.1 and 5.10 guests: cargo xtask kernel-matrix --test driver_double"]
fn nodes_are_character_devices_with_the_real_entry_points() {
    let d = double(2);
    assert_eq!(std::fs::read_to_string("/sys/module/nvidia/parameters/gpus").unwrap().trim(), "2");
    assert_eq!(char_major("nvidia"), [195], "/proc/devices");
    assert_eq!(char_major("nvidiactl"), [195], "/proc/devices");
    let uvm = char_major("nvidia-uvm");
    assert_eq!(uvm.len(), 1, "/proc/devices lists nvidia-uvm once");
    let uvm = uvm[0];
    assert_ne!(uvm, 195, "nvidia-uvm has a dynamic major of its own");

    assert_eq!(char_device("/dev/nvidiactl"), (195, 255, 0o666));
    assert_eq!(char_device("/dev/nvidia0"), (195, 0, 0o666));
    assert_eq!(char_device("/dev/nvidia1"), (195, 1, 0o666));
    assert!(std::fs::metadata("/dev/nvidia2").is_err(), "gpus=2 makes two GPU nodes");
    assert_eq!(char_device("/dev/nvidia-uvm"), (uvm, 0, 0o666));
    assert_eq!(char_device("/dev/nvidia-uvm-tools"), (uvm, 1, 0o666));
    assert_eq!(char_device("/dev/nvidia-double").2, 0o600, "the control device is root's");

    // What a tracer kprobes: the real names, each its own symbol, in the right module.
    let kallsyms = std::fs::read_to_string("/proc/kallsyms").unwrap();
    for (sym, module) in [
        ("nvidia_open", "nvidia"),
        ("nvidia_close", "nvidia"),
        ("nvidia_unlocked_ioctl", "nvidia"),
        ("nvidia_mmap", "nvidia"),
        ("uvm_open_entry", "nvidia_uvm"),
        ("uvm_release_entry", "nvidia_uvm"),
        ("uvm_unlocked_ioctl_entry", "nvidia_uvm"),
        ("uvm_mmap_entry", "nvidia_uvm"),
    ] {
        let want = format!("[{module}]");
        let found = kallsyms.lines().find(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 4 && f[2] == sym && f[3] == want
        });
        let line = found.unwrap_or_else(|| panic!("/proc/kallsyms has no `{sym} {want}`"));
        assert!(matches!(line.split_whitespace().nth(1), Some("t" | "T")), "{sym} is text: {line}");
    }

    // And kprobes take them (what the tracer's driver-entry mode attaches).
    let events = "/sys/kernel/tracing/kprobe_events";
    let kprobe = |line: &str| {
        let mut f = OpenOptions::new().append(true).open(events).unwrap_or_else(|e| panic!("{events}: {e}"));
        std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes()).unwrap_or_else(|e| panic!("{line:?}: {e}"));
    };
    for (event, sym) in
        [("nv_ioctl", "nvidia:nvidia_unlocked_ioctl"), ("uvm_ioctl", "nvidia_uvm:uvm_unlocked_ioctl_entry")]
    {
        kprobe(&format!("p:gpu_tracer_test/{event} {sym}"));
        kprobe(&format!("-:gpu_tracer_test/{event}"));
    }

    let s = d.stats().unwrap();
    assert_eq!(s.gpus.len(), 2);
    assert!(s.clients.is_empty() && s.open_files.is_empty());
    // One server at a time.
    let second = OpenOptions::new().read(true).write(true).open("/dev/nvidia-double");
    assert_eq!(second.unwrap_err().raw_os_error(), Some(libc::EBUSY));
}

#[test]
#[ignore = "runs in the Debian 6.1 and 5.10 guests: cargo xtask kernel-matrix --test driver_double"]
fn init_alloc_free_through_the_modules() {
    let d = double(2);
    let mut w = workload(&d);
    let init = ok(&mut w, "init 1");
    let client = init.handle("client").unwrap();
    let device = init.handle("device").unwrap();
    assert_eq!(client & 0xfff0_0000, 0xc1d0_0000, "{}", init.line);

    let rm = handle(&mut w, "alloc-rm 1073741824");
    let rm21 = handle(&mut w, "alloc-rm21 512M");
    let vh = handle(&mut w, "alloc-vidheap 256M");
    let sys = handle(&mut w, "alloc-rm 64M sysmem");
    let mem = handle(&mut w, "alloc-memory 32M");

    let s = d.stats().unwrap();
    let c = s.client(client).expect("client listed");
    assert_eq!(c.pid, w.pid(), "the module names the caller's tgid");
    let size = |h: u32| s.object(client, h).and_then(|o| o.memory.clone()).map(|m| (m.bytes, m.location, m.source));
    assert_eq!(size(rm), Some((GIB, "vidmem".into(), "rm_alloc".into())));
    assert_eq!(size(rm21), Some((512 * MIB, "vidmem".into(), "rm_alloc".into())));
    assert_eq!(size(vh), Some((256 * MIB, "vidmem".into(), "vid_heap".into())));
    assert_eq!(size(sys), Some((64 * MIB, "sysmem".into(), "rm_alloc".into())));
    assert_eq!(size(mem), Some((32 * MIB, "vidmem".into(), "alloc_memory".into())));
    assert_eq!(s.object(client, device).unwrap().gpu, Some(1), "deviceId read from the caller's memory");
    assert_eq!(s.used_bytes(1), GIB + 512 * MIB + 256 * MIB + 32 * MIB);
    assert_eq!(s.used_bytes(0), 0);
    assert_eq!(s.ioctl_calls("CHECK_VERSION_STR"), 1);
    assert_eq!(s.ioctl_calls("REGISTER_FD"), 1, "the ctl fd resolves to /dev/nvidiactl");
    assert_eq!(s.ioctl_calls("UVM_INITIALIZE"), 1);
    assert_eq!(s.ioctl_errnos("UVM_INITIALIZE"), 0, "UVM_INITIALIZE answers 0");
    assert_eq!(s.ioctl_calls("UVM_REGISTER_GPU"), 1);
    assert_eq!(s.ioctl_calls("RM_ALLOC"), 3 + 3);
    let mut nodes: Vec<&str> = s.open_files.iter().map(|f| f.node.as_str()).collect();
    nodes.sort();
    assert_eq!(nodes, ["nvidia-uvm", "nvidia1", "nvidiactl"]);

    ok(&mut w, &format!("free {rm:#x}"));
    ok(&mut w, &format!("free-vidheap {vh:#x}"));
    let e = err(&mut w, &format!("free {rm:#x}"));
    assert_eq!(e.get("status"), Some("0x33"), "NV_ERR_INVALID_OBJECT_HANDLE: {}", e.line);
    let s = d.stats().unwrap();
    assert!(s.object(client, rm).is_none() && s.object(client, vh).is_none());
    assert_eq!(s.used_bytes(1), 512 * MIB + 32 * MIB);
}

#[test]
#[ignore = "runs in the Debian 6.1 and 5.10 guests: cargo xtask kernel-matrix --test driver_double"]
fn last_close_and_exit_free_the_clients_before_returning() {
    let d = double(2);
    let mut w = workload(&d);
    let client = ok(&mut w, "init 0").handle("client").unwrap();
    handle(&mut w, "alloc-rm 1G");
    // A dup'd ctl fd keeps the file, and the client, alive after the original is closed.
    ok(&mut w, "dup ctl");
    ok(&mut w, "close-orig ctl");
    assert!(d.stats().unwrap().client(client).is_some());
    assert_eq!(ok(&mut w, "close-all").number("closed").unwrap(), 3);
    // Release is synchronous here: no polling, the ledger is exact when close() returns.
    let s = d.stats().unwrap();
    assert!(s.clients.is_empty() && s.open_files.is_empty(), "{s:?}");
    assert_eq!(s.used_bytes(0), 0);

    // The same through process exit, without any free or close.
    ok(&mut w, "init 0");
    handle(&mut w, "alloc-vidheap 2G");
    assert_eq!(d.stats().unwrap().used_bytes(0), 2 * GIB);
    ok(&mut w, "exit");
    w.wait().unwrap();
    let s = d.stats().unwrap();
    assert!(s.clients.is_empty() && s.open_files.is_empty(), "{s:?}");
    assert_eq!(s.used_bytes(0), 0);
    assert_eq!(s.totals.opens, s.totals.releases);
}

#[test]
#[ignore = "runs in the Debian 6.1 and 5.10 guests: cargo xtask kernel-matrix --test driver_double"]
fn bad_arguments_fail_in_the_module() {
    let d = double(2);
    let mut w = workload(&d);
    ok(&mut w, "init 0");
    let before = d.assert_bad_arguments_refused(&mut w);
    handle(&mut w, "alloc-rm 1M");
    assert_eq!(d.stats().unwrap().ioctl_errnos("RM_ALLOC"), before.ioctl_errnos("RM_ALLOC") + 1, "bad-size");

    // Straight from here: sizes the module refuses (over 4096; _IOC_SIZE can say 16383), with and
    // without a pointer, and a NULL argument to a command with no data (reaches the model).
    let mut big = vec![0u8; 16384];
    for size in [4097, 16383] {
        assert_eq!(raw_ioctl("/dev/nvidiactl", iowr(0x2b, size), std::ptr::null_mut()), Err(libc::EINVAL));
        assert_eq!(raw_ioctl("/dev/nvidia0", iowr(0x2b, size), big.as_mut_ptr().cast()), Err(libc::EINVAL));
    }
    assert_eq!(raw_ioctl("/dev/nvidiactl", iowr(0x2b, 48), usize::MAX as *mut _), Err(libc::EFAULT));
    assert_eq!(raw_ioctl("/dev/nvidiactl", ((b'F' as u32) << 8) | 0x99, std::ptr::null_mut()), Err(libc::EINVAL));
    assert_eq!(raw_ioctl("/dev/nvidia-uvm", 0xdead, std::ptr::null_mut()), Err(libc::EINVAL), "unrouted UVM number");
    assert_eq!(raw_ioctl("/dev/nvidia-uvm-tools", 0xdead, std::ptr::null_mut()), Ok(0), "uvm-tools answers 0");
    // mmap of nvidiactl is refused; of nvidia-uvm-tools too.
    for path in ["/dev/nvidiactl", "/dev/nvidia-uvm-tools"] {
        let f = OpenOptions::new().read(true).write(true).open(path).unwrap();
        // SAFETY: a fresh mapping request; nothing is mapped on failure.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0) };
        assert_eq!(p, libc::MAP_FAILED, "{path}");
    }

    ok(&mut w, "close-all");
    let s = d.stats().unwrap();
    assert!(s.clients.is_empty() && s.open_files.is_empty(), "race leftovers released: {s:?}");
    assert_kernel_not_warned();
}

#[test]
#[ignore = "runs in the Debian 6.1 and 5.10 guests: cargo xtask kernel-matrix --test driver_double"]
fn a_managed_mapping_holds_the_uvm_file() {
    let d = double(2);
    let mut w = workload(&d);
    ok(&mut w, "init 0");
    let m = ok(&mut w, "managed-mmap 64M");
    let addr = m.number("addr").unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", w.pid())).unwrap();
    let line = maps
        .lines()
        .find(|l| l.starts_with(&format!("{addr:x}-")))
        .unwrap_or_else(|| panic!("no mapping at {addr:#x} in\n{maps}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields[1], "rw-s", "{line}");
    assert_eq!(u64::from_str_radix(fields[2], 16).unwrap(), addr, "offset == address: {line}");
    assert!(line.ends_with("/dev/nvidia-uvm"), "{line}");

    let base = ok(&mut w, "uvm-map-external 0xcaf00001 8M").number("base").unwrap();
    ok(&mut w, &format!("uvm-free {base:#x}"));
    let s = d.stats().unwrap();
    assert_eq!(s.ioctl_calls("UVM_CREATE_EXTERNAL_RANGE"), 1);
    assert_eq!(s.ioctl_calls("UVM_MAP_EXTERNAL_ALLOCATION"), 1);
    assert_eq!(s.ioctl_calls("UVM_FREE"), 1);

    ok(&mut w, "close-all");
    let s = d.stats().unwrap();
    assert_eq!(s.open_files.len(), 1, "{s:?}");
    assert_eq!(s.open_files[0].node, "nvidia-uvm");
    ok(&mut w, &format!("managed-munmap {addr:#x}"));
    assert!(d.stats().unwrap().open_files.is_empty(), "released by the munmap");
}

#[test]
#[ignore = "runs in the Debian 6.1 and 5.10 guests: cargo xtask kernel-matrix --test driver_double"]
fn a_dead_server_fails_pending_calls_at_once() {
    let d = double(2);
    let mut w = workload(&d);
    ok(&mut w, "init 0");
    // Stop the server, so that the next call waits in the module; then kill it.
    let server = d.pid();
    stop(server);
    let killer = std::thread::spawn(move || {
        std::thread::sleep(scaled(Duration::from_millis(500)));
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(server as i32, libc::SIGKILL) };
    });
    let t = Instant::now();
    let a = err(&mut w, "alloc-rm 1G");
    let waited = t.elapsed();
    killer.join().unwrap();
    assert_eq!(a.get("errno"), Some("5"), "EIO for the call in flight: {}", a.line);
    // Well under the module's 30 s last-resort timeout.
    assert!(waited < scaled(Duration::from_secs(5)), "answered after {waited:?}");
    // With no server, calls fail with ENODEV, opens too.
    let a = err(&mut w, "alloc-rm 1G");
    assert_eq!(a.get("errno"), Some("19"), "ENODEV without a server: {}", a.line);
    let open = OpenOptions::new().read(true).write(true).open("/dev/nvidiactl");
    assert_eq!(open.unwrap_err().raw_os_error(), Some(libc::ENODEV));
    // Closing without a server does not hang either.
    ok(&mut w, "close-all");
    drop(w);
    drop(d);

    // A new server starts clean.
    let d = double(2);
    let s = d.stats().unwrap();
    assert!(s.clients.is_empty() && s.open_files.is_empty());
    let mut w = workload(&d);
    ok(&mut w, "init 0");
    assert_kernel_not_warned();
}

#[test]
#[ignore = "runs in the Debian 6.1 and 5.10 guests: cargo xtask kernel-matrix --test driver_double"]
fn a_killed_caller_does_not_wait_for_its_answer() {
    let d = double(2);
    let mut w = workload(&d);
    ok(&mut w, "init 0");
    let server = d.pid();
    stop(server);
    let pid = w.pid();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(scaled(Duration::from_millis(500)));
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        // The dying workload's releases wait for the server (they must reach it): let it go on.
        std::thread::sleep(scaled(Duration::from_millis(500)));
        // SAFETY: as above.
        unsafe { libc::kill(server as i32, libc::SIGCONT) };
    });
    // The call waits in the module (killable); the kill ends it: the workload dies unanswered.
    assert!(w.answer("alloc-rm 1G").is_err());
    killer.join().unwrap();
    w.wait().unwrap();
    let s = d.stats().unwrap();
    assert!(s.clients.is_empty() && s.open_files.is_empty(), "{s:?}");
    assert_eq!(s.ioctl_calls("RM_ALLOC"), 3, "client, device, subdevice: the abandoned call never reached the model");
    assert_kernel_not_warned();
}
