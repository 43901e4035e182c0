//! The fake's C behaviour called directly (no nvml-wrapper): init refcount, versioned structs, the
//! count-then-fill protocols, bad handles, and the scenario format.
use std::ffi::{c_char, c_uint, c_void};

use fake_nvml::{Device, Process, Scenario, UtilizationSample, abi};
use libloading::Library;

struct Fake {
    _dir: tempfile::TempDir,
    lib: Library,
}

impl Fake {
    fn new(s: &Scenario) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = fake_nvml::install(dir.path(), s).unwrap();
        // SAFETY: `path` is the fake built from this workspace: it defines no constructors, so loading it
        // runs only Rust std's own initialisers, and its statics are const-initialised.
        let lib = unsafe { Library::new(&path) }.unwrap();
        Self { _dir: dir, lib }
    }
    /// The library's export `name` as a `T`.
    ///
    /// # Safety
    /// `T` is the `unsafe extern "C" fn` type of `name` as `fake_nvml`'s ffi.rs defines it, and the
    /// returned pointer is not called after `self` (which keeps the library loaded) is dropped.
    unsafe fn f<T: Copy>(&self, name: &str) -> T {
        // SAFETY: the caller guarantees T is the symbol's own function-pointer type and that it is not
        // used after the library is unloaded.
        *unsafe { self.lib.get::<T>(name.as_bytes()) }.unwrap()
    }
    fn init(&self) -> u32 {
        // SAFETY: nvmlInit_v2 is `extern "C" fn() -> u32` in ffi.rs and takes no arguments.
        unsafe { self.f::<unsafe extern "C" fn() -> u32>("nvmlInit_v2")() }
    }
    fn shutdown(&self) -> u32 {
        // SAFETY: nvmlShutdown is `extern "C" fn() -> u32` in ffi.rs and takes no arguments.
        unsafe { self.f::<unsafe extern "C" fn() -> u32>("nvmlShutdown")() }
    }
    fn handle(&self, i: u32) -> (u32, *mut c_void) {
        let mut h = std::ptr::null_mut();
        // SAFETY: the type is nvmlDeviceGetHandleByIndex_v2's in ffi.rs, and `h` is a live, writable
        // out-parameter.
        let rc = unsafe {
            self.f::<unsafe extern "C" fn(c_uint, *mut *mut c_void) -> u32>("nvmlDeviceGetHandleByIndex_v2")(i, &mut h)
        };
        (rc, h)
    }
}

fn one_gpu() -> Scenario {
    Scenario::new("550.54.15").device(
        Device::new("GPU-0")
            .memory(100, 10, 40)
            .compute_processes(vec![Process::new(1, 5), Process::unavailable(2)])
            .process_utilization(vec![UtilizationSample::new(1, 50, 1, 2, 3, 4)]),
    )
}

#[test]
fn init_is_refcounted_and_calls_need_it() {
    let fake = Fake::new(&one_gpu());
    assert_eq!(fake.handle(0).0, abi::UNINITIALIZED);
    assert_eq!(fake.shutdown(), abi::UNINITIALIZED);
    assert_eq!(fake.init(), abi::SUCCESS);
    assert_eq!(fake.init(), abi::SUCCESS);
    assert_eq!(fake.shutdown(), abi::SUCCESS);
    assert_eq!(fake.handle(0).0, abi::SUCCESS);
    assert_eq!(fake.handle(1).0, abi::INVALID_ARGUMENT);
    assert_eq!(fake.shutdown(), abi::SUCCESS);
    assert_eq!(fake.shutdown(), abi::UNINITIALIZED);
}

#[test]
fn memory_v2_checks_the_struct_version_and_v1_derives_free() {
    let fake = Fake::new(&one_gpu());
    fake.init();
    let (_, h) = fake.handle(0);
    // SAFETY: the signature is nvmlDeviceGetMemoryInfo_v2's in ffi.rs; `fake` outlives every call.
    let v2 =
        unsafe { fake.f::<unsafe extern "C" fn(*mut c_void, *mut abi::MemoryV2) -> u32>("nvmlDeviceGetMemoryInfo_v2") };
    let mut m = abi::MemoryV2 { version: 1, total: 0, reserved: 0, free: 0, used: 0 };
    // SAFETY: `h` is a handle the fake returned and `m` a live nvmlMemory_v2_t (version deliberately wrong).
    assert_eq!(unsafe { v2(h, &mut m) }, abi::ARGUMENT_VERSION_MISMATCH);
    m.version = abi::MEMORY_V2_VERSION;
    // SAFETY: as above, now with the right version.
    assert_eq!(unsafe { v2(h, &mut m) }, abi::SUCCESS);
    assert_eq!((m.total, m.reserved, m.free, m.used), (100, 10, 60, 40));
    // SAFETY: the signature is nvmlDeviceGetMemoryInfo's in ffi.rs; `fake` outlives every call.
    let v1 = unsafe { fake.f::<unsafe extern "C" fn(*mut c_void, *mut abi::Memory) -> u32>("nvmlDeviceGetMemoryInfo") };
    let mut m1 = abi::Memory { total: 0, free: 0, used: 0 };
    // SAFETY: `h` is a handle the fake returned and `m1` a live, writable nvmlMemory_t.
    assert_eq!(unsafe { v1(h, &mut m1) }, abi::SUCCESS);
    assert_eq!((m1.total, m1.free, m1.used), (100, 60, 40));
    // An unknown handle is refused, not dereferenced.
    let mut x = 0u8;
    // SAFETY: the fake resolves handles by address and never dereferences one; `m1` is live and writable.
    assert_eq!(unsafe { v1((&raw mut x).cast(), &mut m1) }, abi::INVALID_ARGUMENT);
}

#[test]
fn count_then_fill_protocols() {
    let fake = Fake::new(&one_gpu());
    fake.init();
    let (_, h) = fake.handle(0);
    type Procs = unsafe extern "C" fn(*mut c_void, *mut c_uint, *mut abi::ProcessInfo) -> u32;
    // SAFETY: Procs is the signature of the three `_v3` process queries in ffi.rs; `fake` outlives the calls.
    let procs = unsafe { fake.f::<Procs>("nvmlDeviceGetComputeRunningProcesses_v3") };
    let mut n: c_uint = 0;
    // SAFETY: `n` is a live c_uint (capacity 0) and a NULL buffer is allowed: the fake only reports the count.
    assert_eq!(unsafe { procs(h, &mut n, std::ptr::null_mut()) }, abi::INSUFFICIENT_SIZE);
    assert_eq!(n, 2);
    let mut buf: Vec<abi::ProcessInfo> = (0..4)
        .map(|_| abi::ProcessInfo { pid: 0, used_gpu_memory: 0, gpu_instance_id: 0, compute_instance_id: 0 })
        .collect();
    n = 4;
    // SAFETY: `buf` holds 4 initialised ProcessInfo and `n` says 4, so the fake writes within it.
    assert_eq!(unsafe { procs(h, &mut n, buf.as_mut_ptr()) }, abi::SUCCESS);
    assert_eq!(n, 2);
    assert_eq!((buf[0].pid, buf[0].used_gpu_memory, buf[0].gpu_instance_id), (1, 5, abi::NO_INSTANCE));
    assert_eq!(buf[1].used_gpu_memory, abi::VALUE_NOT_AVAILABLE);
    // A list the scenario leaves out is not supported.
    // SAFETY: as for `procs`.
    let graphics = unsafe { fake.f::<Procs>("nvmlDeviceGetGraphicsRunningProcesses_v3") };
    // SAFETY: `n` is a live c_uint and the buffer is NULL, which the fake never writes through.
    assert_eq!(unsafe { graphics(h, &mut n, std::ptr::null_mut()) }, abi::NOT_SUPPORTED);

    type Util = unsafe extern "C" fn(*mut c_void, *mut abi::ProcessUtilizationSample, *mut c_uint, u64) -> u32;
    // SAFETY: Util is nvmlDeviceGetProcessUtilization's signature in ffi.rs; `fake` outlives the calls.
    let util = unsafe { fake.f::<Util>("nvmlDeviceGetProcessUtilization") };
    n = 0;
    // SAFETY: `n` is a live c_uint (capacity 0) and the buffer is NULL, which the fake never writes through.
    assert_eq!(unsafe { util(h, std::ptr::null_mut(), &mut n, 0) }, abi::INSUFFICIENT_SIZE);
    assert_eq!(n, 1);
    let mut s =
        abi::ProcessUtilizationSample { pid: 0, time_stamp: 0, sm_util: 0, mem_util: 0, enc_util: 0, dec_util: 0 };
    // SAFETY: `n` is 1 (from the call above) and `s` is one live, writable sample.
    assert_eq!(unsafe { util(h, &mut s, &mut n, 0) }, abi::SUCCESS);
    assert_eq!((s.pid, s.time_stamp, s.sm_util, s.mem_util, s.enc_util, s.dec_util), (1, 50, 1, 2, 3, 4));
    // SAFETY: `n` is a live c_uint and the buffer is NULL, which the fake never writes through.
    assert_eq!(unsafe { util(h, std::ptr::null_mut(), &mut n, 50) }, abi::NOT_FOUND);
}

#[test]
fn strings_that_do_not_fit_are_insufficient_size() {
    let fake = Fake::new(&one_gpu());
    fake.init();
    // SAFETY: the signature is nvmlSystemGetDriverVersion's in ffi.rs; `fake` outlives the calls.
    let version = unsafe { fake.f::<unsafe extern "C" fn(*mut c_char, c_uint) -> u32>("nvmlSystemGetDriverVersion") };
    let mut buf = [0 as c_char; 80];
    // SAFETY: `buf` has 80 writable bytes, more than the 4 we state.
    assert_eq!(unsafe { version(buf.as_mut_ptr(), 4) }, abi::INSUFFICIENT_SIZE);
    // SAFETY: `buf` has exactly the 80 writable bytes we state.
    assert_eq!(unsafe { version(buf.as_mut_ptr(), 80) }, abi::SUCCESS);
    // SAFETY: the successful call wrote a NUL-terminated string into `buf` (and `buf` was zeroed anyway).
    assert_eq!(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap(), "550.54.15");
    // SAFETY: the signature is nvmlErrorString's in ffi.rs; `fake` outlives the call.
    let err = unsafe { fake.f::<unsafe extern "C" fn(u32) -> *const c_char>("nvmlErrorString") };
    // SAFETY: nvmlErrorString takes any code and returns a pointer to a static NUL-terminated C string
    // literal in the library, which stays loaded while `fake` lives.
    assert_eq!(unsafe { std::ffi::CStr::from_ptr(err(abi::GPU_IS_LOST)) }.to_str().unwrap(), "GPU is lost");
}

#[test]
fn a_broken_rewrite_keeps_the_previous_scenario() {
    let dir = tempfile::tempdir().unwrap();
    let path = fake_nvml::install(dir.path(), &one_gpu()).unwrap();
    // SAFETY: as in Fake::new: the fake built from this workspace defines no constructors.
    let fake = Fake { lib: unsafe { Library::new(&path) }.unwrap(), _dir: dir };
    assert_eq!(fake.init(), abi::SUCCESS);
    let json = fake._dir.path().join("fake-nvml.json");
    std::fs::write(&json, "{ not json").unwrap();
    assert_eq!(fake.handle(0).0, abi::SUCCESS, "the last good scenario stays in force");
}

#[test]
fn scenario_json_round_trips_and_rejects_mistakes() {
    let s = one_gpu().nvml_version("12.550.54.15").cuda_driver_version(12040);
    assert_eq!(Scenario::from_json(&s.to_json()).unwrap(), s);
    assert!(s.to_json().contains("\"unavailable\""));
    let typo = r#"{"driver_version": "1", "devices": [{"uuid": "GPU-0", "powr_mw": 5}]}"#;
    assert!(Scenario::from_json(typo).unwrap_err().to_string().contains("powr_mw"));
    let unknown_fn = r#"{"driver_version": "1", "devices": [{"uuid": "GPU-0", "errors": {"nvmlDeviceGetFoo": 3}}]}"#;
    assert!(Scenario::from_json(unknown_fn).unwrap_err().to_string().contains("nvmlDeviceGetFoo"));
    let bad_memory =
        r#"{"driver_version": "1", "devices": [{"uuid": "GPU-0", "memory": {"total": 1, "reserved": 0, "used": 2}}]}"#;
    assert!(Scenario::from_json(bad_memory).is_err());
    let bad_bus = r#"{"driver_version": "1", "devices": [{"uuid": "GPU-0", "pci_bus_id": "3b:00"}]}"#;
    assert!(Scenario::from_json(bad_bus).is_err());
}
