//! The exported NVML functions. Each body runs under `catch_unwind` and returns a code: a panic never
//! unwinds into the caller, a poisoned lock is recovered, and no input is `unwrap`ped.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::os::unix::fs::MetadataExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use crate::abi::*;
use crate::scenario::{ComputeMode, Device, MigInstance, Process, Scenario, UsedBytes, parse_bus_id};

/// `nvmlDevice_t`: an opaque pointer. The fake's handles point into these arrays, so a handle is
/// turned back into (device, MIG index) by address, and anything else is INVALID_ARGUMENT.
type Handle = *mut c_void;
static GPU_HANDLES: [u8; MAX_DEVICES] = [0; MAX_DEVICES];
static MIG_HANDLES: [[u8; MAX_MIG]; MAX_DEVICES] = [[0; MAX_MIG]; MAX_DEVICES];

/// (inode, mtime s, mtime ns, size): a change means the scenario was rewritten.
type FileKey = (u64, i64, i64, u64);

struct State {
    inits: u32,
    loaded: Option<(FileKey, Arc<Scenario>)>,
}

static STATE: Mutex<State> = Mutex::new(State { inits: 0, loaded: None });
/// When this instance first loaded a scenario: the origin of `energy_rate_mw`.
static EPOCH: OnceLock<Instant> = OnceLock::new();

fn lock() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn guarded(f: impl FnOnce() -> Result<(), u32>) -> u32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => UNKNOWN,
    }
}

/// `$FAKE_NVML_SCENARIO`, else `fake-nvml.json` beside this loaded `.so` (found with dladdr).
fn scenario_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FAKE_NVML_SCENARIO") {
        return Some(PathBuf::from(p));
    }
    // SAFETY: Dl_info is a C struct of four raw pointers, for which all zeroes (null) is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let addr = nvmlInit_v2 as *const c_void;
    // SAFETY: `addr` is the address of a function of this object, and `info` is a live, writable Dl_info
    // that dladdr only writes to; it keeps no pointer to it after returning.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr succeeded and `dli_fname` is non-null (both checked above); it then points to the
    // NUL-terminated path of the object containing `addr`, which stays mapped while this code (which is
    // in that object) runs, and `so` is converted to an owned PathBuf before returning.
    let so = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let so = PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(so.to_bytes()));
    Some(so.parent()?.join("fake-nvml.json"))
}

/// The current scenario, re-read when the file changed. A scenario that cannot be read keeps the
/// previous one (and says why on stderr); with none loaded yet the call fails with UNKNOWN.
fn refresh(state: &mut State) -> Result<Arc<Scenario>, u32> {
    let fail = |state: &State, why: String| {
        eprintln!("fake-nvml: {why}");
        state.loaded.as_ref().map(|(_, s)| s.clone()).ok_or(UNKNOWN)
    };
    let Some(path) = scenario_path() else {
        return fail(state, "cannot tell where the library was loaded from; set FAKE_NVML_SCENARIO".into());
    };
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) => return fail(state, format!("cannot stat scenario {}: {e}", path.display())),
    };
    let key = (meta.ino(), meta.mtime(), meta.mtime_nsec(), meta.size());
    if let Some((k, s)) = &state.loaded
        && *k == key
    {
        return Ok(s.clone());
    }
    let parsed = std::fs::read_to_string(&path)
        .map_err(|e| e.to_string())
        .and_then(|t| Scenario::from_json(&t).map_err(|e| e.to_string()));
    match parsed {
        Ok(s) => {
            EPOCH.get_or_init(Instant::now);
            let s = Arc::new(s);
            state.loaded = Some((key, s.clone()));
            Ok(s)
        }
        Err(e) => fail(state, format!("scenario {}: {e}", path.display())),
    }
}

fn current() -> Result<Arc<Scenario>, u32> {
    let mut state = lock();
    if state.inits == 0 {
        return Err(UNINITIALIZED);
    }
    refresh(&mut state)
}

fn forced(errors: &std::collections::BTreeMap<String, u32>, name: &str) -> Result<(), u32> {
    match errors.get(name).or_else(|| errors.get("*")) {
        Some(code) => Err(*code),
        None => Ok(()),
    }
}

/// A call not about one device; top-level `errors` apply.
fn library_call(name: &str, f: impl FnOnce(&Scenario) -> Result<(), u32>) -> u32 {
    guarded(|| {
        let s = current()?;
        forced(&s.errors, name)?;
        f(&s)
    })
}

/// What a handle refers to.
struct Dev<'a> {
    index: usize,
    gpu: &'a Device,
    mig: Option<(usize, &'a MigInstance)>,
}

impl Dev<'_> {
    /// The physical GPU; MIG handles do not answer device-wide readings.
    fn whole(&self) -> Result<&Device, u32> {
        if self.mig.is_some() { Err(NOT_SUPPORTED) } else { Ok(self.gpu) }
    }
}

fn resolve(s: &Scenario, h: Handle) -> Result<Dev<'_>, u32> {
    let p = h as usize;
    let gpus = GPU_HANDLES.as_ptr() as usize;
    let migs = MIG_HANDLES.as_ptr() as usize;
    if (gpus..gpus + MAX_DEVICES).contains(&p) {
        let index = p - gpus;
        let gpu = s.devices.get(index).ok_or(INVALID_ARGUMENT)?;
        return Ok(Dev { index, gpu, mig: None });
    }
    if (migs..migs + MAX_DEVICES * MAX_MIG).contains(&p) {
        let (index, j) = ((p - migs) / MAX_MIG, (p - migs) % MAX_MIG);
        let gpu = s.devices.get(index).ok_or(INVALID_ARGUMENT)?;
        let mig = gpu.mig_instances.get(j).ok_or(INVALID_ARGUMENT)?;
        return Ok(Dev { index, gpu, mig: Some((j, mig)) });
    }
    Err(INVALID_ARGUMENT)
}

/// A call on one device handle; top-level, device and (for a MIG handle) instance `errors` apply.
fn device_call(name: &str, h: Handle, f: impl FnOnce(&Dev) -> Result<(), u32>) -> u32 {
    guarded(|| {
        let s = current()?;
        forced(&s.errors, name)?;
        let d = resolve(&s, h)?;
        if let Some((_, m)) = d.mig {
            forced(&m.errors, name)?;
        }
        forced(&d.gpu.errors, name)?;
        f(&d)
    })
}

/// Writes `v` to the caller's out-parameter `p`; INVALID_ARGUMENT when `p` is NULL.
///
/// # Safety
/// `p` is NULL or valid for an aligned write of one `T` (NVML's contract for its out-parameters).
unsafe fn put<T>(p: *mut T, v: T) -> Result<(), u32> {
    if p.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: `p` is non-null (checked above), so by this function's contract it is valid for an
    // aligned write of a T; `write` does not read or drop the old (possibly uninitialised) value.
    unsafe { p.write(v) };
    Ok(())
}

/// Copies `s` with its NUL into a caller buffer of `len` bytes; INSUFFICIENT_SIZE when it does not fit.
///
/// # Safety
/// `buf` is NULL or valid for writes of `len` bytes (NVML's contract for its string out-parameters).
unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> Result<(), u32> {
    if buf.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    if s.len() + 1 > len as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` is non-null, so by this function's contract it is writable for `len` bytes, and
    // s.len() + 1 <= len (checked above): the copy of s.len() bytes and the NUL at offset s.len() stay in
    // bounds. `s` borrows our scenario, which the caller's buffer cannot alias; u8 and c_char have
    // alignment 1.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        buf.add(s.len()).write(0);
    }
    Ok(())
}

fn fixed<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let n = s.len().min(N - 1);
    out[..n].copy_from_slice(&s.as_bytes()[..n]);
    out
}

// ---- library ----

fn init(name: &str) -> u32 {
    guarded(|| {
        let mut state = lock();
        let s = refresh(&mut state)?;
        if let Some(code) = s.init_error {
            return Err(code);
        }
        // Only an exact name: a top-level "*" is about the calls after init.
        if let Some(code) = s.errors.get(name) {
            return Err(*code);
        }
        state.inits += 1;
        Ok(())
    })
}

/// Says "this is gpu-tracer's NVML double" to the agent, which initialises an explicit
/// `nvml.library` on a node without the NVIDIA driver (`--simulated-devices`) only when its dynamic
/// symbol table has this name (`tracer-agent` `nvml::sampler::DOUBLE_MARKER`).
#[unsafe(no_mangle)]
pub static GPU_TRACER_NVML_DOUBLE: u32 = 1;

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> u32 {
    init("nvmlInit_v2")
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> u32 {
    init("nvmlInitWithFlags")
}

/// Reference-counted like the real library: UNINITIALIZED once every init is matched.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> u32 {
    guarded(|| {
        let mut state = lock();
        if state.inits == 0 {
            return Err(UNINITIALIZED);
        }
        state.inits -= 1;
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: u32) -> *const c_char {
    let s: &'static std::ffi::CStr = match result {
        SUCCESS => c"Success",
        UNINITIALIZED => c"Uninitialized",
        INVALID_ARGUMENT => c"Invalid Argument",
        NOT_SUPPORTED => c"Not Supported",
        NO_PERMISSION => c"Insufficient Permissions",
        NOT_FOUND => c"Not Found",
        INSUFFICIENT_SIZE => c"Insufficient Size",
        DRIVER_NOT_LOADED => c"Driver Not Loaded",
        LIBRARY_NOT_FOUND => c"NVML Shared Library Not Found",
        FUNCTION_NOT_FOUND => c"Function Not Found",
        GPU_IS_LOST => c"GPU is lost",
        ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> u32 {
    // SAFETY: per NVML's API `version` is NULL or a buffer of `length` writable bytes; put_str rejects NULL and a
    // string (with its NUL) longer than `length`.
    library_call("nvmlSystemGetDriverVersion", |s| unsafe { put_str(version, length, &s.driver_version) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> u32 {
    // SAFETY: per NVML's API `version` is NULL or a buffer of `length` writable bytes; put_str rejects NULL and a
    // string (with its NUL) longer than `length`.
    library_call("nvmlSystemGetNVMLVersion", |s| unsafe {
        put_str(version, length, s.nvml_version.as_deref().ok_or(NOT_SUPPORTED)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> u32 {
    // SAFETY: per NVML's API `v` is NULL or points to a writable c_int; put rejects NULL.
    library_call("nvmlSystemGetCudaDriverVersion", |s| unsafe { put(v, s.cuda_driver_version.ok_or(NOT_SUPPORTED)?) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> u32 {
    // SAFETY: per NVML's API `v` is NULL or points to a writable c_int; put rejects NULL.
    library_call("nvmlSystemGetCudaDriverVersion_v2", |s| unsafe {
        put(v, s.cuda_driver_version.ok_or(NOT_SUPPORTED)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> u32 {
    // SAFETY: per NVML's API `count` is NULL or points to a writable c_uint; put rejects NULL.
    library_call("nvmlDeviceGetCount_v2", |s| unsafe { put(count, s.devices.len() as c_uint) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut Handle) -> u32 {
    let name = "nvmlDeviceGetHandleByIndex_v2";
    library_call(name, |s| {
        let gpu = s.devices.get(index as usize).ok_or(INVALID_ARGUMENT)?;
        forced(&gpu.errors, name)?;
        // SAFETY: per NVML's API `device` is NULL or points to a writable nvmlDevice_t; put rejects NULL. The
        // handle written is an address inside GPU_HANDLES, never dereferenced.
        unsafe { put(device, (&raw const GPU_HANDLES[index as usize]) as Handle) }
    })
}

// ---- identity ----

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(device: Handle, uuid: *mut c_char, length: c_uint) -> u32 {
    device_call("nvmlDeviceGetUUID", device, |d| {
        let v = d.mig.map_or(&d.gpu.uuid, |(_, m)| &m.uuid);
        // SAFETY: per NVML's API `uuid` is NULL or a buffer of `length` writable bytes; put_str rejects NULL and a
        // string (with its NUL) longer than `length`.
        unsafe { put_str(uuid, length, v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(device: Handle, name: *mut c_char, length: c_uint) -> u32 {
    device_call("nvmlDeviceGetName", device, |d| {
        let v = match d.mig {
            Some((_, m)) => m.name.as_deref(),
            None => d.gpu.name.as_deref(),
        };
        // SAFETY: per NVML's API `name` is NULL or a buffer of `length` writable bytes; put_str rejects NULL and a
        // string (with its NUL) longer than `length`.
        unsafe { put_str(name, length, v.ok_or(NOT_SUPPORTED)?) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(device: Handle, minor: *mut c_uint) -> u32 {
    // SAFETY: per NVML's API `minor` is NULL or points to a writable c_uint; put rejects NULL.
    device_call("nvmlDeviceGetMinorNumber", device, |d| unsafe { put(minor, d.whole()?.minor.ok_or(NOT_SUPPORTED)?) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(device: Handle, pci: *mut PciInfo) -> u32 {
    device_call("nvmlDeviceGetPciInfo_v3", device, |d| {
        let bus_id = d.whole()?.pci_bus_id.as_deref().ok_or(NOT_SUPPORTED)?;
        let (domain, bus, dev) = parse_bus_id(bus_id).ok_or(UNKNOWN)?;
        // The legacy field has a 4-digit domain.
        let legacy = bus_id.get(4..).unwrap_or(bus_id);
        let info = PciInfo {
            bus_id_legacy: fixed(legacy),
            domain,
            bus,
            device: dev,
            pci_device_id: 0,
            pci_sub_system_id: 0,
            bus_id: fixed(bus_id),
        };
        // SAFETY: per NVML's API `pci` is NULL or points to a writable nvmlPciInfo_t; put rejects NULL.
        unsafe { put(pci, info) }
    })
}

// ---- memory, utilization, power ----

fn scenario_memory(d: &Dev) -> Result<crate::scenario::Memory, u32> {
    match d.mig {
        Some((_, m)) => m.memory,
        None => d.gpu.memory,
    }
    .ok_or(NOT_SUPPORTED)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(device: Handle, memory: *mut Memory) -> u32 {
    device_call("nvmlDeviceGetMemoryInfo", device, |d| {
        let m = scenario_memory(d)?;
        // SAFETY: per NVML's API `memory` is NULL or points to a writable nvmlMemory_t; put rejects NULL.
        unsafe { put(memory, Memory { total: m.total, free: m.total - m.used, used: m.used }) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: Handle, memory: *mut MemoryV2) -> u32 {
    device_call("nvmlDeviceGetMemoryInfo_v2", device, |d| {
        if memory.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // As the real library: the caller states the struct version it passes.
        // SAFETY: `memory` is non-null (checked above) and NVML's API has the caller pass an nvmlMemory_v2_t with
        // its `version` field set, so the aligned u32 read of that field is in bounds and initialised.
        if unsafe { (*memory).version } != MEMORY_V2_VERSION {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let m = scenario_memory(d)?;
        let v = MemoryV2 {
            version: MEMORY_V2_VERSION,
            total: m.total,
            reserved: m.reserved,
            free: m.total - m.used,
            used: m.used,
        };
        // SAFETY: per NVML's API `memory` is NULL or points to a writable nvmlMemory_v2_t; put rejects NULL.
        unsafe { put(memory, v) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(device: Handle, u: *mut Utilization) -> u32 {
    device_call("nvmlDeviceGetUtilizationRates", device, |d| {
        let v = d.whole()?.utilization.ok_or(NOT_SUPPORTED)?;
        // SAFETY: per NVML's API `u` is NULL or points to a writable nvmlUtilization_t; put rejects NULL.
        unsafe { put(u, Utilization { gpu: v.gpu, memory: v.memory }) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(device: Handle, power: *mut c_uint) -> u32 {
    // SAFETY: per NVML's API `power` is NULL or points to a writable c_uint; put rejects NULL.
    device_call("nvmlDeviceGetPowerUsage", device, |d| unsafe { put(power, d.whole()?.power_mw.ok_or(NOT_SUPPORTED)?) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(device: Handle, energy: *mut c_ulonglong) -> u32 {
    device_call("nvmlDeviceGetTotalEnergyConsumption", device, |d| {
        let gpu = d.whole()?;
        let base = gpu.energy_mj.ok_or(NOT_SUPPORTED)?;
        let grown = match (gpu.energy_rate_mw, EPOCH.get()) {
            (Some(rate), Some(epoch)) => (rate as u128 * epoch.elapsed().as_millis() / 1000) as u64,
            _ => 0,
        };
        // SAFETY: per NVML's API `energy` is NULL or points to a writable c_ulonglong; put rejects NULL.
        unsafe { put(energy, base.saturating_add(grown)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(device: Handle, kind: c_uint, clock: *mut c_uint) -> u32 {
    device_call("nvmlDeviceGetClockInfo", device, |d| {
        let c = d.whole()?.clocks.ok_or(NOT_SUPPORTED)?;
        let v = match kind {
            0 => c.graphics_mhz,
            1 => c.sm_mhz,
            2 => c.memory_mhz,
            _ => None,
        };
        // SAFETY: per NVML's API `clock` is NULL or points to a writable c_uint; put rejects NULL.
        unsafe { put(clock, v.ok_or(NOT_SUPPORTED)?) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(device: Handle, sensor: c_uint, temp: *mut c_uint) -> u32 {
    device_call("nvmlDeviceGetTemperature", device, |d| {
        if sensor != 0 {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: per NVML's API `temp` is NULL or points to a writable c_uint; put rejects NULL.
        unsafe { put(temp, d.whole()?.temperature_c.ok_or(NOT_SUPPORTED)?) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(device: Handle, mode: *mut c_uint) -> u32 {
    device_call("nvmlDeviceGetComputeMode", device, |d| {
        let v = match d.whole()?.compute_mode.ok_or(NOT_SUPPORTED)? {
            ComputeMode::Default => 0,
            ComputeMode::ExclusiveThread => 1,
            ComputeMode::Prohibited => 2,
            ComputeMode::ExclusiveProcess => 3,
        };
        // SAFETY: per NVML's API `mode` is NULL or points to a writable c_uint (nvmlComputeMode_t); put rejects
        // NULL.
        unsafe { put(mode, v) }
    })
}

// ---- MIG ----

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(device: Handle, current: *mut c_uint, pending: *mut c_uint) -> u32 {
    device_call("nvmlDeviceGetMigMode", device, |d| {
        let m = d.whole()?.mig_mode.ok_or(NOT_SUPPORTED)?;
        // SAFETY: per NVML's API `current` and `pending` are each NULL or point to a writable c_uint; put rejects
        // NULL.
        unsafe {
            put(current, m.current as c_uint)?;
            put(pending, m.pending as c_uint)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(device: Handle, count: *mut c_uint) -> u32 {
    device_call("nvmlDeviceGetMaxMigDeviceCount", device, |d| {
        let gpu = d.whole()?;
        gpu.mig_mode.ok_or(NOT_SUPPORTED)?;
        let n = gpu.max_mig_devices.unwrap_or(7).max(gpu.mig_instances.len() as u32);
        // SAFETY: per NVML's API `count` is NULL or points to a writable c_uint; put rejects NULL.
        unsafe { put(count, n) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(device: Handle, index: c_uint, mig: *mut Handle) -> u32 {
    device_call("nvmlDeviceGetMigDeviceHandleByIndex", device, |d| {
        let gpu = d.whole()?;
        let mode = gpu.mig_mode.ok_or(NOT_SUPPORTED)?;
        if !mode.current || index as usize >= gpu.mig_instances.len() {
            return Err(NOT_FOUND);
        }
        // SAFETY: per NVML's API `mig` is NULL or points to a writable nvmlDevice_t; put rejects NULL. The handle
        // written is an address inside MIG_HANDLES, never dereferenced.
        unsafe { put(mig, (&raw const MIG_HANDLES[d.index][index as usize]) as Handle) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig: Handle, device: *mut Handle) -> u32 {
    device_call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", mig, |d| {
        if d.mig.is_none() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: per NVML's API `device` is NULL or points to a writable nvmlDevice_t; put rejects NULL. The
        // handle written is an address inside GPU_HANDLES, never dereferenced.
        unsafe { put(device, (&raw const GPU_HANDLES[d.index]) as Handle) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(device: Handle, is_mig: *mut c_uint) -> u32 {
    // SAFETY: per NVML's API `is_mig` is NULL or points to a writable c_uint; put rejects NULL.
    device_call("nvmlDeviceIsMigDeviceHandle", device, |d| unsafe { put(is_mig, d.mig.is_some() as c_uint) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(device: Handle, id: *mut c_uint) -> u32 {
    device_call("nvmlDeviceGetGpuInstanceId", device, |d| {
        let (_, m) = d.mig.ok_or(NOT_SUPPORTED)?;
        // SAFETY: per NVML's API `id` is NULL or points to a writable c_uint; put rejects NULL.
        unsafe { put(id, m.gpu_instance_id) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(device: Handle, id: *mut c_uint) -> u32 {
    device_call("nvmlDeviceGetComputeInstanceId", device, |d| {
        let (_, m) = d.mig.ok_or(NOT_SUPPORTED)?;
        // SAFETY: per NVML's API `id` is NULL or points to a writable c_uint; put rejects NULL.
        unsafe { put(id, m.compute_instance_id) }
    })
}

// ---- processes ----

#[derive(Clone, Copy)]
enum ProcessList {
    Compute,
    Graphics,
    Mps,
}

/// The count-then-fill protocol: a short buffer (or NULL) gets INSUFFICIENT_SIZE and the count;
/// an empty list is SUCCESS with 0.
///
/// # Safety
/// `count` is NULL or valid for reading and writing a c_uint, and `infos` is NULL or valid for writing
/// as many ProcessInfo as `*count` says on entry (NVML's contract for the `_v3` process queries).
unsafe fn processes(d: &Dev, which: ProcessList, count: *mut c_uint, infos: *mut ProcessInfo) -> Result<(), u32> {
    let (list, ids) = match d.mig {
        Some((_, m)) => {
            let l = match which {
                ProcessList::Compute => &m.compute_processes,
                ProcessList::Graphics => &m.graphics_processes,
                ProcessList::Mps => &m.mps_processes,
            };
            (l, (m.gpu_instance_id, m.compute_instance_id))
        }
        None => {
            let l = match which {
                ProcessList::Compute => &d.gpu.compute_processes,
                ProcessList::Graphics => &d.gpu.graphics_processes,
                ProcessList::Mps => &d.gpu.mps_processes,
            };
            (l, (NO_INSTANCE, NO_INSTANCE))
        }
    };
    let list: &[Process] = list.as_deref().ok_or(NOT_SUPPORTED)?;
    if count.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: `count` is non-null (checked above), so by this function's contract it is valid for reading
    // and writing a c_uint (the caller initialises it with its buffer's capacity).
    let capacity = unsafe { count.read() } as usize;
    // SAFETY: as above: `count` is non-null and writable.
    unsafe { count.write(list.len() as c_uint) };
    if list.is_empty() {
        return Ok(());
    }
    if infos.is_null() || capacity < list.len() {
        return Err(INSUFFICIENT_SIZE);
    }
    for (k, p) in list.iter().enumerate() {
        let info = ProcessInfo {
            pid: p.pid,
            used_gpu_memory: match p.used_bytes {
                UsedBytes::Bytes(b) => b,
                UsedBytes::Unavailable(_) => VALUE_NOT_AVAILABLE,
            },
            gpu_instance_id: p.gpu_instance_id.unwrap_or(ids.0),
            compute_instance_id: p.compute_instance_id.unwrap_or(ids.1),
        };
        // SAFETY: `infos` is non-null and k < list.len() <= capacity (both checked above), and by this
        // function's contract `infos` is writable for `capacity` elements, so slot k is in the caller's buffer.
        unsafe { infos.add(k).write(info) };
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: Handle,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> u32 {
    // SAFETY: per NVML's API `count` is NULL or points to the caller's buffer capacity (read, then overwritten
    // with the number of processes), and `infos` is NULL or has room for that many entries: exactly what
    // `processes` requires.
    device_call("nvmlDeviceGetComputeRunningProcesses_v3", device, |d| unsafe {
        processes(d, ProcessList::Compute, count, infos)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: Handle,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> u32 {
    // SAFETY: per NVML's API `count` is NULL or points to the caller's buffer capacity (read, then overwritten
    // with the number of processes), and `infos` is NULL or has room for that many entries: exactly what
    // `processes` requires.
    device_call("nvmlDeviceGetGraphicsRunningProcesses_v3", device, |d| unsafe {
        processes(d, ProcessList::Graphics, count, infos)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: Handle,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> u32 {
    // SAFETY: per NVML's API `count` is NULL or points to the caller's buffer capacity (read, then overwritten
    // with the number of processes), and `infos` is NULL or has room for that many entries: exactly what
    // `processes` requires.
    device_call("nvmlDeviceGetMPSComputeRunningProcesses_v3", device, |d| unsafe {
        processes(d, ProcessList::Mps, count, infos)
    })
}

/// Samples newer than `last_seen`; NOT_FOUND when there are none (as documented for NVML).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: Handle,
    samples: *mut ProcessUtilizationSample,
    count: *mut c_uint,
    last_seen: c_ulonglong,
) -> u32 {
    device_call("nvmlDeviceGetProcessUtilization", device, |d| {
        let all = d.whole()?.process_utilization.as_deref().ok_or(NOT_SUPPORTED)?;
        if count.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let newer: Vec<_> = all.iter().filter(|s| s.timestamp_us > last_seen).collect();
        if newer.is_empty() {
            return Err(NOT_FOUND);
        }
        // SAFETY: `count` is non-null (checked above), and NVML's API has it point to the caller's
        // buffer capacity, which we read and then overwrite with the number of samples.
        let capacity = unsafe { count.read() } as usize;
        // SAFETY: as above: `count` is non-null and, per NVML's API, writable.
        unsafe { count.write(newer.len() as c_uint) };
        if samples.is_null() || capacity < newer.len() {
            return Err(INSUFFICIENT_SIZE);
        }
        for (k, s) in newer.iter().enumerate() {
            let v = ProcessUtilizationSample {
                pid: s.pid,
                time_stamp: s.timestamp_us,
                sm_util: s.sm,
                mem_util: s.mem,
                enc_util: s.enc,
                dec_util: s.dec,
            };
            // SAFETY: `samples` is non-null and k < newer.len() <= capacity (both checked above); per NVML's
            // API the buffer holds `capacity` (the caller's *count) samples, so slot k is in bounds.
            unsafe { samples.add(k).write(v) };
        }
        Ok(())
    })
}

/// Every other symbol nvml-wrapper-sys resolves: NOT_SUPPORTED, as a driver lacking the feature.
mod stubs {
    include!(concat!(env!("OUT_DIR"), "/stubs.rs"));
}
