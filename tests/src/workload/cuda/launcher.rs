//! A launch loop's caller: a `libcuda.so.1` loaded the way cudart loads it ([`Libcuda`]:
//! `dlopen(RTLD_NOW | RTLD_LOCAL)`), `cuLaunchKernel` resolved through `cuGetProcAddress_v2` and
//! called through that pointer, one launch per [`Launcher::call`] (the benchmark's section 5 times
//! it in a tight loop).
//!
//! Against a library whose `cuInit` succeeds (the fakes) the launches get a real function handle
//! (`cuModuleLoadData` + `cuModuleGetFunction`) and succeed; against one whose `cuInit` fails (the
//! real library without a GPU) the function is NULL, so every launch returns an error at once
//! (a bogus non-NULL handle would crash the real library).
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

// `LaunchFn`: cuLaunchKernel's signature (cuda.h), the workload's own.
use super::{CuResult, LaunchKernelFn as LaunchFn, Libcuda};

/// The CUDA version asked of `cuGetProcAddress` (12.0, as cudart 12 asks).
const PROC_ADDRESS_VERSION: c_int = 12000;

/// A minimal PTX module (the fake only checks the image is non-NULL).
const PTX: &[u8] = b".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry bench_kernel() { ret; }\n\0";

/// What a launch loop needs; plain data so that several threads can share it.
#[derive(Clone, Copy)]
pub struct Launcher {
    launch: LaunchFn,
    /// The `CUfunction` launched (0: NULL).
    func: usize,
    /// What `cuInit(0)` returned.
    pub init_result: i32,
    /// How `cuLaunchKernel` was resolved: `cuGetProcAddress_v2`, `cuGetProcAddress` or `dlsym`.
    pub resolved_via: &'static str,
    /// The resolved address, and what `dlsym("cuLaunchKernel")` gives.
    pub addr: usize,
    pub dlsym_addr: usize,
}

impl Launcher {
    /// Load `path` (never unloaded), initialise it and resolve `cuLaunchKernel`.
    pub fn open(path: &str) -> Result<Self, String> {
        let lib = Libcuda::open(std::path::Path::new(path))?;
        let sym = |name: &CStr| -> usize { lib.symbol(&name.to_string_lossy()).map_or(0, |p| p as usize) };
        macro_rules! func {
            ($name:literal, $ty:ty) => {{
                let p = sym($name);
                if p == 0 {
                    return Err(format!("{path} lacks {}", $name.to_string_lossy()));
                }
                // SAFETY: the CUDA driver entry point of that name has this C signature (cuda.h).
                unsafe { std::mem::transmute::<usize, $ty>(p) }
            }};
        }
        let cu_init = func!(c"cuInit", unsafe extern "C" fn(c_uint) -> CuResult);
        // SAFETY: cuInit(0) takes no pointers.
        let init_result = unsafe { cu_init(0) };

        let dlsym_addr = sym(c"cuLaunchKernel");
        let mut addr = 0usize;
        let mut resolved_via = "dlsym";
        let name = c"cuLaunchKernel";
        if sym(c"cuGetProcAddress_v2") != 0 {
            let f = func!(
                c"cuGetProcAddress_v2",
                unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CuResult
            );
            let (mut p, mut status): (*mut c_void, c_int) = (std::ptr::null_mut(), -1);
            // SAFETY: NUL-terminated name, live out-pointers.
            if unsafe { f(name.as_ptr(), &mut p, PROC_ADDRESS_VERSION, 0, &mut status) } == 0 && !p.is_null() {
                (addr, resolved_via) = (p as usize, "cuGetProcAddress_v2");
            }
        }
        if addr == 0 && sym(c"cuGetProcAddress") != 0 {
            let f = func!(
                c"cuGetProcAddress",
                unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> CuResult
            );
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: NUL-terminated name, live out-pointer.
            if unsafe { f(name.as_ptr(), &mut p, PROC_ADDRESS_VERSION, 0) } == 0 && !p.is_null() {
                (addr, resolved_via) = (p as usize, "cuGetProcAddress");
            }
        }
        if addr == 0 {
            addr = dlsym_addr;
        }
        if addr == 0 {
            return Err(format!("{path}: cuLaunchKernel not found"));
        }
        // SAFETY: the driver's cuLaunchKernel, whose signature is `LaunchFn` (cuda.h).
        let launch = unsafe { std::mem::transmute::<usize, LaunchFn>(addr) };

        let mut func = 0usize;
        if init_result == 0 {
            let device_get = func!(c"cuDeviceGet", unsafe extern "C" fn(*mut c_int, c_int) -> CuResult);
            let retain = func!(c"cuDevicePrimaryCtxRetain", unsafe extern "C" fn(*mut usize, c_int) -> CuResult);
            let set_current = func!(c"cuCtxSetCurrent", unsafe extern "C" fn(usize) -> CuResult);
            let load = func!(c"cuModuleLoadData", unsafe extern "C" fn(*mut usize, *const c_void) -> CuResult);
            let get_function =
                func!(c"cuModuleGetFunction", unsafe extern "C" fn(*mut usize, usize, *const c_char) -> CuResult);
            let (mut dev, mut ctx, mut module) = (0 as c_int, 0usize, 0usize);
            // SAFETY: live out-pointers; handles the library itself returned; NUL-terminated strings.
            let steps = unsafe {
                [
                    ("cuDeviceGet", device_get(&mut dev, 0)),
                    ("cuDevicePrimaryCtxRetain", retain(&mut ctx, dev)),
                    ("cuCtxSetCurrent", set_current(ctx)),
                    ("cuModuleLoadData", load(&mut module, PTX.as_ptr().cast())),
                    ("cuModuleGetFunction", get_function(&mut func, module, c"bench_kernel".as_ptr())),
                ]
            };
            if let Some((op, r)) = steps.iter().find(|(_, r)| *r != 0) {
                return Err(format!("{path}: {op} returned {r}"));
            }
        }
        Ok(Self { launch, func, init_result, resolved_via, addr, dlsym_addr })
    }

    /// One `cuLaunchKernel(func, grid 1×1×1, block 32×1×1, no shared memory, default stream)`.
    #[inline(always)]
    pub fn call(&self) -> i32 {
        // SAFETY: a handle the library returned (or NULL, which it rejects), no parameters.
        unsafe {
            (self.launch)(
                self.func as *mut c_void,
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        }
    }
}
