//! The CUDA mode of `nv-workload`: driver-API calls through a `libcuda.so.1` the workload
//! `dlopen`s (`--libcuda PATH`), as cudart does: `dlopen(RTLD_NOW | RTLD_LOCAL)`, entry points from
//! `dlsym` (and, for `cuda-procaddr*`, from `cuGetProcAddress_v2`).
//!
//! It works against the fake library (`tests/fake_libcuda`, see [`crate::fake_libcuda`]) and the
//! real one: there `cuInit` fails (CUDA_ERROR_NO_DEVICE without a GPU) and every later call
//! returns an error, which the commands report as `err op=<symbol> code=N name=<CUDA_ERROR_...>`.
//! The workload only ever passes handles the library itself returned, or NULL: a bogus non-NULL
//! function handle crashes the real library.

mod launcher;

pub use launcher::Launcher;

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{Outcome, parse_bytes, parse_number};

/// The CUDA help lines, spliced into the workload's `HELP` (a macro so that `concat!` can use it).
macro_rules! cuda_help {
    () => {
        "\
cuda-init                        cuInit, cuDeviceGet 0, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, cuStreamCreate,
                                 cuModuleLoadData + cuModuleGetFunction \"fake_kernel\", cuLibraryLoadData +
                                 cuLibraryGetKernel \"fake_library_kernel\" + cuKernelGetFunction, cuGraphCreate +
                                 cuGraphInstantiateWithFlags (needs --libcuda)
                                 -> ok ctx=0x.. func=0x.. module=0x.. library=0x.. kernel=0x.. kernel_func=0x..
                                    stream=0x.. graph_exec=0x..
cuda-ctx-create                  cuCtxCreate_v2 on device 0 (it becomes current) -> ok ctx=0x..
cuda-get-function <name>         cuModuleGetFunction in the init module; launches then use it -> ok func=0x..
cuda-get-kernel <name>           cuLibraryGetKernel + cuKernelGetFunction; launches then use the CUkernel, as
                                 cudart 12 does -> ok kernel=0x.. func=0x..
cuda-state                       -> ok ctx=0x.. func=0x.. (the handle launches use) stream=0x.. graph_exec=0x..
cuda-launch <n>                  n x cuLaunchKernel(func, grid 128x2x1, block 32x4x2, 4096 B shared, stream, params)
                                 -> ok launched=n ns=T (T: the loop's wall time). Every launch command makes all
                                 n calls; if any failed: err op=<symbol> code=C name=.. calls=n failed=F ns=T
                                 (C: the first failure's CUresult)
cuda-launch-ptsz <n>             the same through cuLaunchKernel_ptsz -> ok launched=n
cuda-launch-ex <n>               cuLaunchKernelEx, CUlaunchConfig with the same dims -> ok launched=n
cuda-launch-ex-ptsz <n>          cuLaunchKernelEx_ptsz -> ok launched=n
cuda-launch-coop <n>             cuLaunchCooperativeKernel -> ok launched=n
cuda-launch-coop-ptsz <n>        cuLaunchCooperativeKernel_ptsz -> ok launched=n
cuda-graph-launch <n>            cuGraphLaunch(graph_exec, stream) -> ok launched=n
cuda-graph-launch-ptsz <n>       cuGraphLaunch_ptsz -> ok launched=n
cuda-launch-threads <t> <n>      t threads, each pinned to one of the allowed CPUs (round robin), cuCtxSetCurrent then
                                 n x cuLaunchKernel (cuCtxSetCurrent only if init got a context)
                                 -> ok launched=t*n ns=T threads=t cpus=K
cuda-procaddr-launch <n>         cuLaunchKernel resolved through cuGetProcAddress_v2(\"cuLaunchKernel\", 12000, 0),
                                 called n times -> ok launched=n ns=T addr=0x.. dlsym=0x..
cuda-procaddr <name> [version] [flags]  cuGetProcAddress_v2 (version 12000, flags 0 by default)
                                 -> ok addr=0x.. dlsym=0x.. status=N (dlsym of the name as given; 0x0 if absent)
cuda-alloc <bytes>               cuMemAlloc_v2 -> ok ptr=0x..
cuda-alloc-async <bytes>         cuMemAllocAsync on the stream -> ok ptr=0x..
cuda-alloc-async-ptsz <bytes>    cuMemAllocAsync_ptsz -> ok ptr=0x..
cuda-alloc-managed <bytes>       cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL) -> ok ptr=0x..
cuda-alloc-pitch <width> <height>  cuMemAllocPitch_v2, 4-byte elements -> ok ptr=0x.. pitch=N bytes=pitch*height
cuda-alloc-host <bytes>          cuMemAllocHost_v2 -> ok ptr=0x..
cuda-mem-create <bytes>          cuMemCreate, pinned device memory on device 0, size rounded up to 2 MiB
                                 -> ok handle=0x.. size=N
cuda-free <ptr>                  cuMemFree_v2 -> ok
cuda-free-async <ptr>            cuMemFreeAsync on the stream -> ok
cuda-free-async-ptsz <ptr>       cuMemFreeAsync_ptsz -> ok
cuda-free-host <ptr>             cuMemFreeHost -> ok
cuda-mem-release <handle>        cuMemRelease -> ok
cuda-caching-pattern [blocks] [bytes] [launches]  a caching allocator's life (PyTorch-like): blocks x cuMemAlloc_v2
                                 of bytes (default 4 x 512M) once, then launches x cuLaunchKernel (default 1000), no
                                 frees -> ok launched=N ns=T blocks=N bytes=TOTAL ptrs=0x..,0x..
cuda-event-create                cuEventCreate -> ok event=0x..
cuda-event-record <event>        cuEventRecord on the stream -> ok
cuda-event-sync <event>          cuEventSynchronize -> ok ns=T (T: how long it blocked)
cuda-event-query <event>         cuEventQuery -> ok ready=0|1
cuda-stream-wait-event <event>   cuStreamWaitEvent(stream, event, 0) -> ok
cuda-stream-sync                 cuStreamSynchronize on the stream -> ok ns=T
cuda-ctx-sync                    cuCtxSynchronize -> ok ns=T
cuda-call-loop <call> <n> [event]  n calls of stream-sync (cuStreamSynchronize), ctx-sync (cuCtxSynchronize)
                                 or event-query (cuEventQuery(event)), timed on the thread's CPU clock
                                 -> ok calls=n cpu_ns=T wall_ns=W
cuda-memcpy-htod <ptr> <bytes>   cuMemcpyHtoD_v2 from a host buffer -> ok ns=T
cuda-memcpy-dtoh <ptr> <bytes>   cuMemcpyDtoH_v2 into a host buffer -> ok ns=T
cuda-memcpy-async <ptr> <bytes>  cuMemcpyAsync(ptr, host buffer, bytes, stream) -> ok ns=T
cuda-memset <ptr> <bytes>        cuMemsetD8_v2 -> ok ns=T
cuda-memset-d32-async <ptr> <n>  cuMemsetD32Async(ptr, 0, n, stream) -> ok ns=T
cuda-memcpy-htod-ptds <ptr> <bytes>  cuMemcpyHtoD_v2_ptds (a --default-stream per-thread program's copy) -> ok ns=T
cuda-memcpy-dtoh-async-ptsz <ptr> <bytes>  cuMemcpyDtoHAsync_v2_ptsz(host buffer, ptr, bytes, stream) -> ok ns=T
cuda-memset-ptds <ptr> <bytes>   cuMemsetD8_v2_ptds -> ok ns=T
(The fake library simulates GPU time when FAKE_LIBCUDA_KERNEL_NS is set in the workload's environment.)
"
    };
}
pub(crate) use cuda_help;

/// Every CUDA command name, in the order of the help text.
pub const COMMANDS: &[&str] = &[
    "cuda-init",
    "cuda-ctx-create",
    "cuda-get-function",
    "cuda-get-kernel",
    "cuda-state",
    "cuda-launch",
    "cuda-launch-ptsz",
    "cuda-launch-ex",
    "cuda-launch-ex-ptsz",
    "cuda-launch-coop",
    "cuda-launch-coop-ptsz",
    "cuda-graph-launch",
    "cuda-graph-launch-ptsz",
    "cuda-launch-threads",
    "cuda-procaddr-launch",
    "cuda-procaddr",
    "cuda-alloc",
    "cuda-alloc-async",
    "cuda-alloc-async-ptsz",
    "cuda-alloc-managed",
    "cuda-alloc-pitch",
    "cuda-alloc-host",
    "cuda-mem-create",
    "cuda-free",
    "cuda-free-async",
    "cuda-free-async-ptsz",
    "cuda-free-host",
    "cuda-mem-release",
    "cuda-caching-pattern",
    "cuda-event-create",
    "cuda-event-record",
    "cuda-event-sync",
    "cuda-event-query",
    "cuda-stream-wait-event",
    "cuda-stream-sync",
    "cuda-ctx-sync",
    "cuda-call-loop",
    "cuda-memcpy-htod",
    "cuda-memcpy-dtoh",
    "cuda-memcpy-async",
    "cuda-memset",
    "cuda-memset-d32-async",
    "cuda-memcpy-htod-ptds",
    "cuda-memcpy-dtoh-async-ptsz",
    "cuda-memset-ptds",
];

/// The function `cuda-init` gets from its module (cuModuleGetFunction).
pub const INIT_FUNCTION_NAME: &str = "fake_kernel";
/// The kernel `cuda-init` gets from its library (cuLibraryGetKernel).
pub const INIT_KERNEL_NAME: &str = "fake_library_kernel";
/// Grid dimensions of every launch.
pub const LAUNCH_GRID: [u32; 3] = [128, 2, 1];
/// Block dimensions of every launch (blockDimZ is cuLaunchKernel's first stack argument).
pub const LAUNCH_BLOCK: [u32; 3] = [32, 4, 2];
/// Dynamic shared memory of every launch.
pub const LAUNCH_SHARED_BYTES: u32 = 4096;
/// Element size `cuda-alloc-pitch` passes.
pub const PITCH_ELEMENT_BYTES: u32 = 4;
/// The allocation granularity `cuda-mem-create` rounds to (what cuMemGetAllocationGranularity
/// reports on current GPUs).
pub const MEM_CREATE_GRANULE: u64 = 2 << 20;
/// The version `cuda-procaddr*` asks cuGetProcAddress_v2 for (CUDA 12.0).
pub const PROCADDR_VERSION: i32 = 12000;

/// What the library is asked to compile: a minimal PTX module, NUL-terminated (the fake only
/// checks it is non-NULL).
const PTX_IMAGE: &[u8] = b".version 8.0\n.target sm_90\n.address_size 64\n\
.visible .entry fake_kernel() { ret; }\n.visible .entry fake_library_kernel() { ret; }\n\0";

const CU_MEM_ATTACH_GLOBAL: c_uint = 1;
const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;

/// `CUresult`.
pub type CuResult = c_int;
/// An opaque driver handle (`CUcontext`, `CUfunction`, ...): a pointer.
type Handle = *mut c_void;

/// The readable name of a `CUresult` (the common ones).
pub fn error_name(code: CuResult) -> &'static str {
    match code {
        0 => "CUDA_SUCCESS",
        1 => "CUDA_ERROR_INVALID_VALUE",
        2 => "CUDA_ERROR_OUT_OF_MEMORY",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        4 => "CUDA_ERROR_DEINITIALIZED",
        34 => "CUDA_ERROR_STUB_LIBRARY",
        46 => "CUDA_ERROR_DEVICE_UNAVAILABLE",
        100 => "CUDA_ERROR_NO_DEVICE",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        200 => "CUDA_ERROR_INVALID_IMAGE",
        201 => "CUDA_ERROR_INVALID_CONTEXT",
        400 => "CUDA_ERROR_INVALID_HANDLE",
        500 => "CUDA_ERROR_NOT_FOUND",
        600 => "CUDA_ERROR_NOT_READY",
        700 => "CUDA_ERROR_ILLEGAL_ADDRESS",
        719 => "CUDA_ERROR_LAUNCH_FAILED",
        801 => "CUDA_ERROR_NOT_SUPPORTED",
        803 => "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        999 => "CUDA_ERROR_UNKNOWN",
        _ => "unknown",
    }
}

fn check(op: &str, code: CuResult) -> Result<(), String> {
    if code == 0 { Ok(()) } else { Err(format!("op={op} code={code} name={}", error_name(code))) }
}

/// One call, answered with how long it took (`ns=T`).
fn timed(op: &str, call: impl FnOnce() -> CuResult) -> Outcome {
    let start = Instant::now();
    check(op, call())?;
    Ok(format!("ns={}", start.elapsed().as_nanos()))
}

/// `CUlaunchConfig` (cuda.h, 56 bytes).
#[repr(C)]
struct LaunchConfig {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    stream: Handle,
    attrs: *mut c_void,
    num_attrs: c_uint,
}
const _: () = assert!(size_of::<LaunchConfig>() == 56);

/// `CUmemAllocationProp` (cuda.h, 32 bytes).
#[repr(C)]
#[derive(Default)]
struct MemAllocationProp {
    kind: c_int,
    requested_handle_types: c_int,
    location_type: c_int,
    location_id: c_int,
    win32_handle_meta_data: usize,
    alloc_flags: [u8; 8],
}
const _: () = assert!(size_of::<MemAllocationProp>() == 32);

/// A `dlopen`ed library, never closed (as with CUDA applications: probes stay on its inode).
#[derive(Debug)]
pub struct Libcuda {
    path: PathBuf,
    handle: usize,
}

impl Libcuda {
    /// `dlopen(path, RTLD_NOW | RTLD_LOCAL)`.
    pub fn open(path: &Path) -> Result<Self, String> {
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| format!("libcuda path {} contains NUL", path.display()))?;
        // SAFETY: `c` is a NUL-terminated path; loading runs the library's constructors, which is
        // the point (the library is the one under test).
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return Err(format!("dlopen {}: {}", path.display(), dlerror()));
        }
        Ok(Self { path: path.to_path_buf(), handle: h as usize })
    }

    /// The path it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `dlsym` of `name`, NULL (`None`) if absent.
    pub fn symbol(&self, name: &str) -> Option<*mut c_void> {
        let c = CString::new(name).ok()?;
        // SAFETY: a handle from dlopen that is never closed, and a NUL-terminated name.
        let p = unsafe { libc::dlsym(self.handle as *mut c_void, c.as_ptr()) };
        (!p.is_null()).then_some(p)
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated message valid until the next dl* call.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: checked non-NULL above.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// Declares [`Api`]: one optional function pointer per entry point, resolved by `dlsym`.
macro_rules! api {
    ($($field:ident: $sym:literal fn($($arg:ty),* $(,)?);)*) => {
        /// The entry points the workload calls, `None` where the library lacks the symbol.
        #[derive(Clone, Copy, Debug)]
        struct Api {
            $($field: Option<unsafe extern "C" fn($($arg),*) -> CuResult>,)*
        }

        impl Api {
            fn resolve(lib: &Libcuda) -> Self {
                Self {
                    $($field: lib.symbol($sym).map(|p| {
                        // SAFETY: the symbol is the CUDA driver entry point of that name, whose C
                        // signature (cuda.h) is the one declared here.
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> CuResult>(p) }
                    }),)*
                }
            }
        }
    };
}

api! {
    init: "cuInit" fn(c_uint);
    device_get: "cuDeviceGet" fn(*mut c_int, c_int);
    primary_ctx_retain: "cuDevicePrimaryCtxRetain" fn(*mut Handle, c_int);
    ctx_create: "cuCtxCreate_v2" fn(*mut Handle, c_uint, c_int);
    ctx_set_current: "cuCtxSetCurrent" fn(Handle);
    stream_create: "cuStreamCreate" fn(*mut Handle, c_uint);
    module_load_data: "cuModuleLoadData" fn(*mut Handle, *const c_void);
    module_get_function: "cuModuleGetFunction" fn(*mut Handle, Handle, *const c_char);
    library_load_data: "cuLibraryLoadData" fn(
        *mut Handle, *const c_void, *mut c_int, *mut *mut c_void, c_uint, *mut c_int, *mut *mut c_void, c_uint,
    );
    library_get_kernel: "cuLibraryGetKernel" fn(*mut Handle, Handle, *const c_char);
    kernel_get_function: "cuKernelGetFunction" fn(*mut Handle, Handle);
    launch_kernel: "cuLaunchKernel" fn(
        Handle, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Handle, *mut *mut c_void, *mut *mut c_void,
    );
    launch_kernel_ptsz: "cuLaunchKernel_ptsz" fn(
        Handle, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Handle, *mut *mut c_void, *mut *mut c_void,
    );
    launch_kernel_ex: "cuLaunchKernelEx" fn(*const LaunchConfig, Handle, *mut *mut c_void, *mut *mut c_void);
    launch_kernel_ex_ptsz: "cuLaunchKernelEx_ptsz" fn(*const LaunchConfig, Handle, *mut *mut c_void, *mut *mut c_void);
    launch_coop: "cuLaunchCooperativeKernel" fn(
        Handle, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Handle, *mut *mut c_void,
    );
    launch_coop_ptsz: "cuLaunchCooperativeKernel_ptsz" fn(
        Handle, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Handle, *mut *mut c_void,
    );
    graph_create: "cuGraphCreate" fn(*mut Handle, c_uint);
    graph_instantiate: "cuGraphInstantiateWithFlags" fn(*mut Handle, Handle, u64);
    graph_launch: "cuGraphLaunch" fn(Handle, Handle);
    graph_launch_ptsz: "cuGraphLaunch_ptsz" fn(Handle, Handle);
    mem_alloc: "cuMemAlloc_v2" fn(*mut u64, usize);
    mem_alloc_async: "cuMemAllocAsync" fn(*mut u64, usize, Handle);
    mem_alloc_async_ptsz: "cuMemAllocAsync_ptsz" fn(*mut u64, usize, Handle);
    mem_alloc_managed: "cuMemAllocManaged" fn(*mut u64, usize, c_uint);
    mem_alloc_pitch: "cuMemAllocPitch_v2" fn(*mut u64, *mut usize, usize, usize, c_uint);
    mem_alloc_host: "cuMemAllocHost_v2" fn(*mut *mut c_void, usize);
    mem_create: "cuMemCreate" fn(*mut u64, usize, *const MemAllocationProp, u64);
    mem_release: "cuMemRelease" fn(u64);
    mem_free: "cuMemFree_v2" fn(u64);
    mem_free_async: "cuMemFreeAsync" fn(u64, Handle);
    mem_free_async_ptsz: "cuMemFreeAsync_ptsz" fn(u64, Handle);
    mem_free_host: "cuMemFreeHost" fn(*mut c_void);
    get_proc_address: "cuGetProcAddress_v2" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int);
    event_create: "cuEventCreate" fn(*mut Handle, c_uint);
    event_record: "cuEventRecord" fn(Handle, Handle);
    event_synchronize: "cuEventSynchronize" fn(Handle);
    event_query: "cuEventQuery" fn(Handle);
    stream_wait_event: "cuStreamWaitEvent" fn(Handle, Handle, c_uint);
    stream_synchronize: "cuStreamSynchronize" fn(Handle);
    ctx_synchronize: "cuCtxSynchronize" fn();
    memcpy_htod: "cuMemcpyHtoD_v2" fn(u64, *const c_void, usize);
    memcpy_dtoh: "cuMemcpyDtoH_v2" fn(*mut c_void, u64, usize);
    memcpy_async: "cuMemcpyAsync" fn(u64, u64, usize, Handle);
    memset_d8: "cuMemsetD8_v2" fn(u64, u8, usize);
    memset_d32_async: "cuMemsetD32Async" fn(u64, c_uint, usize, Handle);
    memcpy_htod_ptds: "cuMemcpyHtoD_v2_ptds" fn(u64, *const c_void, usize);
    memcpy_dtoh_async_ptsz: "cuMemcpyDtoHAsync_v2_ptsz" fn(*mut c_void, u64, usize, Handle);
    memset_d8_ptds: "cuMemsetD8_v2_ptds" fn(u64, u8, usize);
}

/// The entry point `$field` of `$api`, or an `err op=dlsym` answer.
macro_rules! entry {
    ($api:expr, $field:ident, $sym:literal) => {
        $api.$field.ok_or_else(|| format!("op=dlsym symbol={} missing=1", $sym))?
    };
}

/// Which launch entry point a launch loop calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Launch {
    Kernel,
    KernelPtsz,
    Ex,
    ExPtsz,
    Coop,
    CoopPtsz,
    Graph,
    GraphPtsz,
}

impl Launch {
    fn symbol(self) -> &'static str {
        match self {
            Launch::Kernel => "cuLaunchKernel",
            Launch::KernelPtsz => "cuLaunchKernel_ptsz",
            Launch::Ex => "cuLaunchKernelEx",
            Launch::ExPtsz => "cuLaunchKernelEx_ptsz",
            Launch::Coop => "cuLaunchCooperativeKernel",
            Launch::CoopPtsz => "cuLaunchCooperativeKernel_ptsz",
            Launch::Graph => "cuGraphLaunch",
            Launch::GraphPtsz => "cuGraphLaunch_ptsz",
        }
    }
}

/// The handles a launch needs, as plain numbers so that threads can share them.
#[derive(Clone, Copy, Debug, Default)]
struct LaunchTarget {
    func: u64,
    stream: u64,
    graph_exec: u64,
}

/// The CUDA side of the simulated application: the library and the handles it returned.
#[derive(Debug)]
pub struct CudaSession {
    lib: Libcuda,
    api: Api,
    ctx: u64,
    module: u64,
    library: u64,
    kernel: u64,
    kernel_func: u64,
    target: LaunchTarget,
}

fn h(v: u64) -> Handle {
    v as usize as Handle
}

impl CudaSession {
    /// Load the library at `path` and resolve its entry points (missing ones are reported by the
    /// commands that need them).
    pub fn open(path: &Path) -> Result<Self, String> {
        let lib = Libcuda::open(path)?;
        let api = Api::resolve(&lib);
        Ok(Self { lib, api, ctx: 0, module: 0, library: 0, kernel: 0, kernel_func: 0, target: LaunchTarget::default() })
    }

    /// The loaded library.
    pub fn library(&self) -> &Libcuda {
        &self.lib
    }

    /// Run one `cuda-*` command.
    pub fn execute(&mut self, cmd: &str, args: &[&str]) -> Outcome {
        let number = |i: usize| -> Result<u64, String> {
            args.get(i).and_then(|s| parse_number(s)).ok_or_else(|| format!("usage: {cmd}: expected a number"))
        };
        let count =
            |i: usize, default: u64| -> Result<u64, String> { if args.len() > i { number(i) } else { Ok(default) } };
        let bytes = |i: usize| -> Result<u64, String> {
            args.get(i).and_then(|s| parse_bytes(s)).ok_or_else(|| format!("usage: {cmd}: expected a size"))
        };
        let size = |i: usize| -> Result<usize, String> {
            usize::try_from(bytes(i)?).map_err(|_| format!("usage: {cmd}: size too large"))
        };
        match cmd {
            "cuda-init" => self.init(),
            "cuda-ctx-create" => self.ctx_create(),
            "cuda-get-function" => self.get_function(args.first().ok_or("usage: cuda-get-function <name>")?),
            "cuda-get-kernel" => self.get_kernel(args.first().ok_or("usage: cuda-get-kernel <name>")?),
            "cuda-state" => Ok(format!(
                "ctx={:#x} func={:#x} stream={:#x} graph_exec={:#x}",
                self.ctx, self.target.func, self.target.stream, self.target.graph_exec
            )),
            "cuda-launch" => self.launch(Launch::Kernel, number(0)?),
            "cuda-launch-ptsz" => self.launch(Launch::KernelPtsz, number(0)?),
            "cuda-launch-ex" => self.launch(Launch::Ex, number(0)?),
            "cuda-launch-ex-ptsz" => self.launch(Launch::ExPtsz, number(0)?),
            "cuda-launch-coop" => self.launch(Launch::Coop, number(0)?),
            "cuda-launch-coop-ptsz" => self.launch(Launch::CoopPtsz, number(0)?),
            "cuda-graph-launch" => self.launch(Launch::Graph, number(0)?),
            "cuda-graph-launch-ptsz" => self.launch(Launch::GraphPtsz, number(0)?),
            "cuda-launch-threads" => self.launch_threads(number(0)?, number(1)?),
            "cuda-procaddr-launch" => self.procaddr_launch(number(0)?),
            "cuda-procaddr" => {
                let name = args.first().ok_or("usage: cuda-procaddr <name> [version] [flags]")?;
                let version = i32::try_from(count(1, PROCADDR_VERSION as u64)?)
                    .map_err(|_| "usage: cuda-procaddr: version out of range".to_string())?;
                self.procaddr(name, version, count(2, 0)?)
            }
            "cuda-alloc" => {
                let (f, n) = (entry!(self.api, mem_alloc, "cuMemAlloc_v2"), size(0)?);
                // SAFETY: the out-pointer is a live local.
                self.alloc("cuMemAlloc_v2", |p| unsafe { f(p, n) })
            }
            "cuda-alloc-async" => {
                let (f, n) = (entry!(self.api, mem_alloc_async, "cuMemAllocAsync"), size(0)?);
                let stream = h(self.target.stream);
                // SAFETY: the out-pointer is a live local; the stream is the library's or NULL.
                self.alloc("cuMemAllocAsync", |p| unsafe { f(p, n, stream) })
            }
            "cuda-alloc-async-ptsz" => {
                let (f, n) = (entry!(self.api, mem_alloc_async_ptsz, "cuMemAllocAsync_ptsz"), size(0)?);
                let stream = h(self.target.stream);
                // SAFETY: as above.
                self.alloc("cuMemAllocAsync_ptsz", |p| unsafe { f(p, n, stream) })
            }
            "cuda-alloc-managed" => {
                let (f, n) = (entry!(self.api, mem_alloc_managed, "cuMemAllocManaged"), size(0)?);
                // SAFETY: the out-pointer is a live local.
                self.alloc("cuMemAllocManaged", |p| unsafe { f(p, n, CU_MEM_ATTACH_GLOBAL) })
            }
            "cuda-alloc-pitch" => {
                let f = entry!(self.api, mem_alloc_pitch, "cuMemAllocPitch_v2");
                let (width, height) = (size(0)?, size(1)?);
                let (mut ptr, mut pitch) = (0u64, 0usize);
                // SAFETY: both out-pointers are live locals.
                check("cuMemAllocPitch_v2", unsafe { f(&mut ptr, &mut pitch, width, height, PITCH_ELEMENT_BYTES) })?;
                Ok(format!("ptr={ptr:#x} pitch={pitch} bytes={}", pitch as u64 * height as u64))
            }
            "cuda-alloc-host" => {
                let f = entry!(self.api, mem_alloc_host, "cuMemAllocHost_v2");
                let mut p: *mut c_void = std::ptr::null_mut();
                // SAFETY: the out-pointer is a live local.
                check("cuMemAllocHost_v2", unsafe { f(&mut p, size(0)?) })?;
                Ok(format!("ptr={:#x}", p as usize))
            }
            "cuda-mem-create" => self.mem_create(bytes(0)?),
            "cuda-free" => {
                let f = entry!(self.api, mem_free, "cuMemFree_v2");
                // SAFETY: plain value argument; the library validates it.
                check("cuMemFree_v2", unsafe { f(number(0)?) }).map(|()| String::new())
            }
            "cuda-free-async" => {
                let f = entry!(self.api, mem_free_async, "cuMemFreeAsync");
                // SAFETY: value arguments; the stream is the library's or NULL.
                check("cuMemFreeAsync", unsafe { f(number(0)?, h(self.target.stream)) }).map(|()| String::new())
            }
            "cuda-free-async-ptsz" => {
                let f = entry!(self.api, mem_free_async_ptsz, "cuMemFreeAsync_ptsz");
                // SAFETY: as above.
                check("cuMemFreeAsync_ptsz", unsafe { f(number(0)?, h(self.target.stream)) }).map(|()| String::new())
            }
            "cuda-free-host" => {
                let f = entry!(self.api, mem_free_host, "cuMemFreeHost");
                // SAFETY: the pointer is passed through; the library validates it against its own
                // allocations.
                check("cuMemFreeHost", unsafe { f(number(0)? as usize as *mut c_void) }).map(|()| String::new())
            }
            "cuda-mem-release" => {
                let f = entry!(self.api, mem_release, "cuMemRelease");
                // SAFETY: a value argument.
                check("cuMemRelease", unsafe { f(number(0)?) }).map(|()| String::new())
            }
            "cuda-caching-pattern" => {
                let blocks = count(0, 4)?;
                let block = if args.len() > 1 { bytes(1)? } else { 512 << 20 };
                self.caching_pattern(blocks, block, count(2, 1000)?)
            }
            "cuda-event-create" => {
                let f = entry!(self.api, event_create, "cuEventCreate");
                let mut e: Handle = std::ptr::null_mut();
                // SAFETY: the out-pointer is a live local.
                check("cuEventCreate", unsafe { f(&mut e, 0) })?;
                Ok(format!("event={:#x}", e as usize))
            }
            "cuda-event-record" => {
                let f = entry!(self.api, event_record, "cuEventRecord");
                // SAFETY: an event handle the library returned (checked by the library), the stream.
                check("cuEventRecord", unsafe { f(h(number(0)?), h(self.target.stream)) }).map(|()| String::new())
            }
            "cuda-event-sync" => {
                let f = entry!(self.api, event_synchronize, "cuEventSynchronize");
                let e = h(number(0)?);
                // SAFETY: as above.
                timed("cuEventSynchronize", || unsafe { f(e) })
            }
            "cuda-event-query" => {
                let f = entry!(self.api, event_query, "cuEventQuery");
                // SAFETY: as above.
                match unsafe { f(h(number(0)?)) } {
                    0 => Ok("ready=1".into()),
                    600 => Ok("ready=0".into()),
                    code => check("cuEventQuery", code).map(|()| String::new()),
                }
            }
            "cuda-stream-wait-event" => {
                let f = entry!(self.api, stream_wait_event, "cuStreamWaitEvent");
                // SAFETY: the stream and an event handle the library returned.
                check("cuStreamWaitEvent", unsafe { f(h(self.target.stream), h(number(0)?), 0) })
                    .map(|()| String::new())
            }
            "cuda-stream-sync" => {
                let f = entry!(self.api, stream_synchronize, "cuStreamSynchronize");
                let stream = h(self.target.stream);
                // SAFETY: the library's stream or NULL.
                timed("cuStreamSynchronize", || unsafe { f(stream) })
            }
            "cuda-ctx-sync" => {
                let f = entry!(self.api, ctx_synchronize, "cuCtxSynchronize");
                // SAFETY: no arguments.
                timed("cuCtxSynchronize", || unsafe { f() })
            }
            "cuda-call-loop" => {
                let call = args.first().ok_or("usage: cuda-call-loop <call> <n> [event]")?.to_string();
                let n = count(1, 1000)?;
                let mut one: Box<dyn FnMut() -> CuResult> = match call.as_str() {
                    "stream-sync" => {
                        let f = entry!(self.api, stream_synchronize, "cuStreamSynchronize");
                        let stream = h(self.target.stream);
                        // SAFETY: the library's stream or NULL.
                        Box::new(move || unsafe { f(stream) })
                    }
                    "ctx-sync" => {
                        let f = entry!(self.api, ctx_synchronize, "cuCtxSynchronize");
                        // SAFETY: no arguments.
                        Box::new(move || unsafe { f() })
                    }
                    "event-query" => {
                        let f = entry!(self.api, event_query, "cuEventQuery");
                        let e = h(count(2, 0)?);
                        // SAFETY: an event handle the library returned (checked by the library).
                        Box::new(move || match unsafe { f(e) } {
                            600 => 0,
                            r => r,
                        })
                    }
                    other => {
                        return Err(format!(
                            "cuda-call-loop: unknown call {other:?} (stream-sync, ctx-sync, event-query)"
                        ));
                    }
                };
                let cpu = || {
                    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
                    // SAFETY: a valid out-pointer.
                    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
                    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
                };
                let (c0, w0) = (cpu(), Instant::now());
                for _ in 0..n {
                    check("cuda-call-loop", one())?;
                }
                Ok(format!("calls={n} cpu_ns={} wall_ns={}", cpu() - c0, w0.elapsed().as_nanos()))
            }
            "cuda-memcpy-htod" => {
                let f = entry!(self.api, memcpy_htod, "cuMemcpyHtoD_v2");
                let (dst, n) = (number(0)?, size(1)?);
                let buf = vec![0u8; n];
                // SAFETY: the host buffer holds n bytes; the device pointer is checked by the library.
                timed("cuMemcpyHtoD_v2", || unsafe { f(dst, buf.as_ptr().cast(), n) })
            }
            "cuda-memcpy-dtoh" => {
                let f = entry!(self.api, memcpy_dtoh, "cuMemcpyDtoH_v2");
                let (src, n) = (number(0)?, size(1)?);
                let mut buf = vec![0u8; n];
                // SAFETY: as above.
                timed("cuMemcpyDtoH_v2", || unsafe { f(buf.as_mut_ptr().cast(), src, n) })
            }
            "cuda-memcpy-async" => {
                let f = entry!(self.api, memcpy_async, "cuMemcpyAsync");
                let (dst, n) = (number(0)?, size(1)?);
                // Pinned memory would outlive the call; a leaked buffer stands in for it.
                let src = Box::leak(vec![0u8; n].into_boxed_slice()).as_ptr() as u64;
                let stream = h(self.target.stream);
                // SAFETY: as above; the source stays valid for ever.
                timed("cuMemcpyAsync", || unsafe { f(dst, src, n, stream) })
            }
            "cuda-memset" => {
                let f = entry!(self.api, memset_d8, "cuMemsetD8_v2");
                let (dst, n) = (number(0)?, size(1)?);
                // SAFETY: the device pointer is checked by the library.
                timed("cuMemsetD8_v2", || unsafe { f(dst, 0, n) })
            }
            "cuda-memset-d32-async" => {
                let f = entry!(self.api, memset_d32_async, "cuMemsetD32Async");
                let (dst, n) = (number(0)?, size(1)?);
                let stream = h(self.target.stream);
                // SAFETY: as above.
                timed("cuMemsetD32Async", || unsafe { f(dst, 0, n, stream) })
            }
            "cuda-memcpy-htod-ptds" => {
                let f = entry!(self.api, memcpy_htod_ptds, "cuMemcpyHtoD_v2_ptds");
                let (dst, n) = (number(0)?, size(1)?);
                let buf = vec![0u8; n];
                // SAFETY: the host buffer holds n bytes; the device pointer is checked by the library.
                timed("cuMemcpyHtoD_v2_ptds", || unsafe { f(dst, buf.as_ptr().cast(), n) })
            }
            "cuda-memcpy-dtoh-async-ptsz" => {
                let f = entry!(self.api, memcpy_dtoh_async_ptsz, "cuMemcpyDtoHAsync_v2_ptsz");
                let (src, n) = (number(0)?, size(1)?);
                // The copy may land after the call returns: a leaked buffer outlives it.
                let dst = Box::leak(vec![0u8; n].into_boxed_slice()).as_mut_ptr();
                let stream = h(self.target.stream);
                // SAFETY: the host buffer holds n bytes for ever; the device pointer is checked by the library.
                timed("cuMemcpyDtoHAsync_v2_ptsz", || unsafe { f(dst.cast(), src, n, stream) })
            }
            "cuda-memset-ptds" => {
                let f = entry!(self.api, memset_d8_ptds, "cuMemsetD8_v2_ptds");
                let (dst, n) = (number(0)?, size(1)?);
                // SAFETY: the device pointer is checked by the library.
                timed("cuMemsetD8_v2_ptds", || unsafe { f(dst, 0, n) })
            }
            other => Err(format!("usage: unknown command {other}")),
        }
    }

    fn alloc(&self, op: &str, call: impl FnOnce(*mut u64) -> CuResult) -> Outcome {
        let mut ptr = 0u64;
        check(op, call(&mut ptr))?;
        Ok(format!("ptr={ptr:#x}"))
    }

    fn init(&mut self) -> Outcome {
        let api = self.api;
        let mut dev: c_int = 0;
        let (mut ctx, mut module, mut func, mut library, mut kernel, mut kernel_func): (
            Handle,
            Handle,
            Handle,
            Handle,
            Handle,
            Handle,
        ) = Default::default();
        let (mut stream, mut graph, mut exec): (Handle, Handle, Handle) = Default::default();
        let fname = CString::new(INIT_FUNCTION_NAME).expect("no NUL");
        let kname = CString::new(INIT_KERNEL_NAME).expect("no NUL");
        // SAFETY: for every call below: out-pointers are live locals, the image and names are
        // NUL-terminated and outlive the calls, and handles passed in are ones the library just
        // returned (each step runs only after the previous one succeeded).
        unsafe {
            check("cuInit", entry!(api, init, "cuInit")(0))?;
            check("cuDeviceGet", entry!(api, device_get, "cuDeviceGet")(&mut dev, 0))?;
            check(
                "cuDevicePrimaryCtxRetain",
                entry!(api, primary_ctx_retain, "cuDevicePrimaryCtxRetain")(&mut ctx, dev),
            )?;
            check("cuCtxSetCurrent", entry!(api, ctx_set_current, "cuCtxSetCurrent")(ctx))?;
            self.ctx = ctx as u64;
            check("cuStreamCreate", entry!(api, stream_create, "cuStreamCreate")(&mut stream, 0))?;
            self.target.stream = stream as u64;
            check(
                "cuModuleLoadData",
                entry!(api, module_load_data, "cuModuleLoadData")(&mut module, PTX_IMAGE.as_ptr().cast()),
            )?;
            self.module = module as u64;
            check(
                "cuModuleGetFunction",
                entry!(api, module_get_function, "cuModuleGetFunction")(&mut func, module, fname.as_ptr()),
            )?;
            self.target.func = func as u64;
            check(
                "cuLibraryLoadData",
                entry!(api, library_load_data, "cuLibraryLoadData")(
                    &mut library,
                    PTX_IMAGE.as_ptr().cast(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    0,
                ),
            )?;
            self.library = library as u64;
            check(
                "cuLibraryGetKernel",
                entry!(api, library_get_kernel, "cuLibraryGetKernel")(&mut kernel, library, kname.as_ptr()),
            )?;
            self.kernel = kernel as u64;
            check(
                "cuKernelGetFunction",
                entry!(api, kernel_get_function, "cuKernelGetFunction")(&mut kernel_func, kernel),
            )?;
            self.kernel_func = kernel_func as u64;
            check("cuGraphCreate", entry!(api, graph_create, "cuGraphCreate")(&mut graph, 0))?;
            check(
                "cuGraphInstantiateWithFlags",
                entry!(api, graph_instantiate, "cuGraphInstantiateWithFlags")(&mut exec, graph, 0),
            )?;
            self.target.graph_exec = exec as u64;
        }
        Ok(format!(
            "ctx={:#x} func={:#x} module={:#x} library={:#x} kernel={:#x} kernel_func={:#x} stream={:#x} graph_exec={:#x}",
            self.ctx,
            self.target.func,
            self.module,
            self.library,
            self.kernel,
            self.kernel_func,
            self.target.stream,
            self.target.graph_exec
        ))
    }

    fn ctx_create(&mut self) -> Outcome {
        let f = entry!(self.api, ctx_create, "cuCtxCreate_v2");
        let mut ctx: Handle = std::ptr::null_mut();
        // SAFETY: the out-pointer is a live local.
        check("cuCtxCreate_v2", unsafe { f(&mut ctx, 0, 0) })?;
        self.ctx = ctx as u64;
        Ok(format!("ctx={:#x}", self.ctx))
    }

    fn get_function(&mut self, name: &str) -> Outcome {
        let f = entry!(self.api, module_get_function, "cuModuleGetFunction");
        let c = CString::new(name).map_err(|_| "usage: name contains NUL".to_string())?;
        let mut func: Handle = std::ptr::null_mut();
        // SAFETY: live out-pointer, NUL-terminated name; the module is the library's or NULL.
        check("cuModuleGetFunction", unsafe { f(&mut func, h(self.module), c.as_ptr()) })?;
        self.target.func = func as u64;
        Ok(format!("func={:#x}", self.target.func))
    }

    fn get_kernel(&mut self, name: &str) -> Outcome {
        let get_kernel = entry!(self.api, library_get_kernel, "cuLibraryGetKernel");
        let get_function = entry!(self.api, kernel_get_function, "cuKernelGetFunction");
        let c = CString::new(name).map_err(|_| "usage: name contains NUL".to_string())?;
        let (mut kernel, mut func): (Handle, Handle) = Default::default();
        // SAFETY: live out-pointers, NUL-terminated name; the library handle is the library's or
        // NULL, and the kernel is the one it just returned.
        unsafe {
            check("cuLibraryGetKernel", get_kernel(&mut kernel, h(self.library), c.as_ptr()))?;
            check("cuKernelGetFunction", get_function(&mut func, kernel))?;
        }
        self.target.func = kernel as u64;
        Ok(format!("kernel={:#x} func={:#x}", kernel as u64, func as u64))
    }

    fn launch(&self, kind: Launch, n: u64) -> Outcome {
        launch_loop(&self.api, kind, self.target, n)?.answer(kind, "")
    }

    fn launch_threads(&self, threads: u64, n: u64) -> Outcome {
        if threads == 0 {
            return Err("usage: cuda-launch-threads <threads> <n>: threads must be > 0".into());
        }
        let set_current = entry!(self.api, ctx_set_current, "cuCtxSetCurrent");
        let cpus = allowed_cpus();
        let (api, target, ctx) = (self.api, self.target, self.ctx);
        let mut used = std::collections::BTreeSet::new();
        let start = Instant::now();
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let cpu = (!cpus.is_empty()).then(|| cpus[i as usize % cpus.len()]);
                if let Some(c) = cpu {
                    used.insert(c);
                }
                std::thread::spawn(move || -> Result<LaunchTally, String> {
                    if let Some(c) = cpu {
                        pin_to_cpu(c);
                    }
                    // As cudart does on a new thread; without a context (the real library after
                    // a failed cuInit) there is nothing to make current.
                    if ctx != 0 {
                        // SAFETY: a context the library returned.
                        check("cuCtxSetCurrent", unsafe { set_current(h(ctx)) })?;
                    }
                    launch_loop(&api, Launch::Kernel, target, n)
                })
            })
            .collect();
        let mut total = LaunchTally::default();
        let mut thread_err = None;
        for t in handles {
            match t.join() {
                Ok(Ok(tally)) => total.add(&tally),
                Ok(Err(e)) => {
                    thread_err.get_or_insert(e);
                }
                Err(_) => {
                    thread_err.get_or_insert("panic: a launch thread panicked".into());
                }
            }
        }
        if let Some(e) = thread_err {
            return Err(e);
        }
        total.ns = start.elapsed().as_nanos() as u64;
        total.answer(Launch::Kernel, &format!(" threads={threads} cpus={}", used.len()))
    }

    fn procaddr(&self, name: &str, version: i32, flags: u64) -> Outcome {
        let f = entry!(self.api, get_proc_address, "cuGetProcAddress_v2");
        let c = CString::new(name).map_err(|_| "usage: name contains NUL".to_string())?;
        let mut pfn: *mut c_void = std::ptr::null_mut();
        let mut status: c_int = -1;
        // SAFETY: NUL-terminated name, live out-pointers.
        check("cuGetProcAddress_v2", unsafe { f(c.as_ptr(), &mut pfn, version, flags, &mut status) })
            .map_err(|e| format!("{e} status={status}"))?;
        let dl = self.lib.symbol(name).map_or(0, |p| p as usize);
        Ok(format!("addr={:#x} dlsym={dl:#x} status={status}", pfn as usize))
    }

    fn procaddr_launch(&self, n: u64) -> Outcome {
        let f = entry!(self.api, get_proc_address, "cuGetProcAddress_v2");
        let mut pfn: *mut c_void = std::ptr::null_mut();
        let mut status: c_int = -1;
        // SAFETY: NUL-terminated name, live out-pointers.
        check("cuGetProcAddress_v2", unsafe {
            f(c"cuLaunchKernel".as_ptr(), &mut pfn, PROCADDR_VERSION, 0, &mut status)
        })
        .map_err(|e| format!("{e} status={status}"))?;
        if pfn.is_null() {
            return Err(format!("op=cuGetProcAddress_v2 code=0 status={status} addr=0x0"));
        }
        let dl = self.lib.symbol("cuLaunchKernel").map_or(0, |p| p as usize);
        // Launch through the resolved pointer only: a copy of the API whose cuLaunchKernel is it.
        let mut api = self.api;
        // SAFETY: cuGetProcAddress returned the driver's cuLaunchKernel for CUDA 12.0, whose
        // signature is the one declared for `launch_kernel`.
        api.launch_kernel = Some(unsafe { std::mem::transmute::<*mut c_void, LaunchKernelFn>(pfn) });
        launch_loop(&api, Launch::Kernel, self.target, n)?
            .answer(Launch::Kernel, &format!(" addr={:#x} dlsym={dl:#x}", pfn as usize))
    }

    fn mem_create(&self, bytes: u64) -> Outcome {
        let f = entry!(self.api, mem_create, "cuMemCreate");
        let size = bytes.max(1).div_ceil(MEM_CREATE_GRANULE) * MEM_CREATE_GRANULE;
        let size = usize::try_from(size).map_err(|_| "usage: cuda-mem-create: size too large".to_string())?;
        let prop = MemAllocationProp {
            kind: CU_MEM_ALLOCATION_TYPE_PINNED,
            location_type: CU_MEM_LOCATION_TYPE_DEVICE,
            location_id: 0,
            ..Default::default()
        };
        let mut handle = 0u64;
        // SAFETY: live out-pointer and a complete CUmemAllocationProp.
        check("cuMemCreate", unsafe { f(&mut handle, size, &prop, 0) })?;
        Ok(format!("handle={handle:#x} size={size}"))
    }

    fn caching_pattern(&self, blocks: u64, block: u64, launches: u64) -> Outcome {
        let f = entry!(self.api, mem_alloc, "cuMemAlloc_v2");
        let size = usize::try_from(block).map_err(|_| "usage: cuda-caching-pattern: size too large".to_string())?;
        let mut ptrs = Vec::new();
        for i in 0..blocks {
            let mut p = 0u64;
            // SAFETY: the out-pointer is a live local.
            check("cuMemAlloc_v2", unsafe { f(&mut p, size) }).map_err(|e| format!("{e} allocated={i}"))?;
            ptrs.push(format!("{p:#x}"));
        }
        launch_loop(&self.api, Launch::Kernel, self.target, launches)?
            .answer(Launch::Kernel, &format!(" blocks={blocks} bytes={} ptrs={}", blocks * block, ptrs.join(",")))
    }
}

type LaunchKernelFn = unsafe extern "C" fn(
    Handle,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Handle,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CuResult;

/// What a launch loop did.
#[derive(Clone, Copy, Debug, Default)]
struct LaunchTally {
    calls: u64,
    failed: u64,
    /// The first non-zero result, if any call failed.
    first_error: CuResult,
    /// Wall time of the loop.
    ns: u64,
}

impl LaunchTally {
    fn add(&mut self, o: &LaunchTally) {
        if self.failed == 0 {
            self.first_error = o.first_error;
        }
        self.calls += o.calls;
        self.failed += o.failed;
    }

    /// `ok launched=N ns=T<extra>`, or `err op=<symbol> code=C name=.. calls=N failed=F ns=T<extra>`.
    fn answer(&self, kind: Launch, extra: &str) -> Outcome {
        let ns = self.ns;
        if self.failed == 0 {
            Ok(format!("launched={} ns={ns}{extra}", self.calls))
        } else {
            Err(format!(
                "{} calls={} failed={} ns={ns}{extra}",
                check(kind.symbol(), self.first_error).unwrap_err(),
                self.calls,
                self.failed
            ))
        }
    }
}

/// `n` calls of `kind`, all made even when some fail (a probe counts calls, and the real library
/// fails them all).
fn launch_loop(api: &Api, kind: Launch, t: LaunchTarget, n: u64) -> Result<LaunchTally, String> {
    let [gx, gy, gz] = LAUNCH_GRID;
    let [bx, by, bz] = LAUNCH_BLOCK;
    let (func, stream, exec) = (h(t.func), h(t.stream), h(t.graph_exec));
    // The kernel's parameters: one pointer argument and one int, as kernelParams expects them
    // (an array of pointers to each argument).
    let (mut arg_ptr, mut arg_n) = (0u64, 0u32);
    let mut params: [*mut c_void; 2] = [(&raw mut arg_ptr).cast(), (&raw mut arg_n).cast()];
    let pp = params.as_mut_ptr();
    let config = LaunchConfig {
        grid: LAUNCH_GRID,
        block: LAUNCH_BLOCK,
        shared_mem_bytes: LAUNCH_SHARED_BYTES,
        stream,
        attrs: std::ptr::null_mut(),
        num_attrs: 0,
    };
    let sym = kind.symbol();
    let missing = || format!("op=dlsym symbol={sym} missing=1");
    let mut tally = LaunchTally { calls: n, ..Default::default() };
    let start = Instant::now();
    for _ in 0..n {
        let null = std::ptr::null_mut();
        // SAFETY: every pointer argument points at a live local (params, the config) or is NULL;
        // the function, stream and graph exec are handles the library returned, or NULL.
        let r = unsafe {
            match kind {
                Launch::Kernel => api.launch_kernel.ok_or_else(missing)?(
                    func,
                    gx,
                    gy,
                    gz,
                    bx,
                    by,
                    bz,
                    LAUNCH_SHARED_BYTES,
                    stream,
                    pp,
                    null,
                ),
                Launch::KernelPtsz => api.launch_kernel_ptsz.ok_or_else(missing)?(
                    func,
                    gx,
                    gy,
                    gz,
                    bx,
                    by,
                    bz,
                    LAUNCH_SHARED_BYTES,
                    stream,
                    pp,
                    null,
                ),
                Launch::Ex => api.launch_kernel_ex.ok_or_else(missing)?(&config, func, pp, null),
                Launch::ExPtsz => api.launch_kernel_ex_ptsz.ok_or_else(missing)?(&config, func, pp, null),
                Launch::Coop => {
                    api.launch_coop.ok_or_else(missing)?(func, gx, gy, gz, bx, by, bz, LAUNCH_SHARED_BYTES, stream, pp)
                }
                Launch::CoopPtsz => api.launch_coop_ptsz.ok_or_else(missing)?(
                    func,
                    gx,
                    gy,
                    gz,
                    bx,
                    by,
                    bz,
                    LAUNCH_SHARED_BYTES,
                    stream,
                    pp,
                ),
                Launch::Graph => api.graph_launch.ok_or_else(missing)?(exec, stream),
                Launch::GraphPtsz => api.graph_launch_ptsz.ok_or_else(missing)?(exec, stream),
            }
        };
        if r != 0 {
            if tally.failed == 0 {
                tally.first_error = r;
            }
            tally.failed += 1;
        }
    }
    tally.ns = start.elapsed().as_nanos() as u64;
    // The parameter block must live until the last call.
    std::hint::black_box(&mut params);
    Ok(tally)
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

/// Pin the calling thread to `cpu`; best effort (a cpuset may forbid it).
fn pin_to_cpu(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; pid 0 is the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

#[cfg(test)]
mod tests;
