//! Where the fake `libcuda.so.1` builds are, and what they export.
//!
//! `tests/build.rs` compiles `tests/fake_libcuda/` (C, plus x86_64 assembly for the thunks) with
//! the system C compiler in three variants that differ only in what a uprobe on an exported entry
//! point meets first:
//!
//! | variant   | first instruction at each exported symbol                                    |
//! |-----------|------------------------------------------------------------------------------|
//! | `push`    | `push %rbp` (the kernel emulates it)                                         |
//! | `endbr64` | `endbr64`, then `push %rbp` (single-stepped)                                 |
//! | `thunk`   | the real 535 libcuda's stub: `cmpl $0x321cba00, FLAG(%rip)` (single-stepped); `je` to `mov $4,%eax; ret`; `jmp *SLOT(%rip)`, the slot filled by an `R_X86_64_RELATIVE` relocation with the hidden implementation `fake_impl_<name>` (first instruction `push %rbp`) |
//!
//! The fake's behaviour (pointer scheme, handles, error codes) is described at the top of
//! `tests/fake_libcuda/fake_libcuda.c`.

use std::path::PathBuf;

/// The directory holding `<variant>/libcuda.so.1` for every variant.
pub const FAKE_LIBCUDA_DIR: &str = env!("FAKE_LIBCUDA_DIR");

/// Where `cargo xtask setup` installs the real driver library (Debian non-free `libcuda1`); on
/// arm64, where Debian's `libcuda1:arm64` puts it (the arm64 guest of `cargo xtask arm64` links
/// the unpacked copy there).
#[cfg(not(target_arch = "aarch64"))]
pub const REAL_LIBCUDA: &str = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";
#[cfg(target_arch = "aarch64")]
pub const REAL_LIBCUDA: &str = "/usr/lib/aarch64-linux-gnu/libcuda.so.1";

/// Every prologue variant, in a stable order (arm64: `VARIANTS_AARCH64` in tests/build.rs).
pub const VARIANTS: &[&str] = &[PLAIN, PROTECTED, "thunk"];

/// The variant whose entry points begin with the plain frame set-up: x86-64 `push %rbp` (emulated
/// by the kernel); arm64 `stp x29, x30, [sp, #-N]!` (single-stepped).
#[cfg(not(target_arch = "aarch64"))]
pub const PLAIN: &str = "push";
#[cfg(target_arch = "aarch64")]
pub const PLAIN: &str = "stp";
/// The variant built with control-flow protection: x86-64 `endbr64` first; arm64
/// (`-mbranch-protection=standard`) `paciasp` first where a function saves its return address,
/// `bti c` elsewhere.
#[cfg(not(target_arch = "aarch64"))]
pub const PROTECTED: &str = "endbr64";
#[cfg(target_arch = "aarch64")]
pub const PROTECTED: &str = "pac";

/// The entry points every variant exports (the same list as `tests/fake_libcuda/symbols.h`; a
/// test compares the two through the built libraries' dynamic symbol tables).
pub const EXPORTED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuDevicePrimaryCtxRetain",
    "cuCtxCreate_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuStreamCreate",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuLibraryLoadData",
    "cuLibraryGetKernel",
    "cuKernelGetFunction",
    "cuLaunchKernel",
    "cuLaunchKernel_ptsz",
    "cuLaunchKernelEx",
    "cuLaunchKernelEx_ptsz",
    "cuLaunchCooperativeKernel",
    "cuLaunchCooperativeKernel_ptsz",
    "cuGraphCreate",
    "cuGraphInstantiate",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphLaunch_ptsz",
    "cuMemAlloc_v2",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemAllocManaged",
    "cuMemAllocPitch_v2",
    "cuMemAllocHost_v2",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemFree_v2",
    "cuMemFreeAsync",
    "cuMemFreeAsync_ptsz",
    "cuMemFreeHost",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamSynchronize_ptsz",
    "cuCtxSynchronize",
    "cuEventSynchronize",
    "cuEventQuery",
    "cuStreamWaitEvent",
    "cuStreamWaitEvent_ptsz",
    "cuEventRecord",
    "cuEventRecord_ptsz",
    "cuEventRecordWithFlags",
    "cuEventRecordWithFlags_ptsz",
    "cuMemcpy",
    "cuMemcpy_ptds",
    "cuMemcpyAsync",
    "cuMemcpyAsync_ptsz",
    "cuMemcpyHtoD_v2",
    "cuMemcpyHtoD_v2_ptds",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoH_v2_ptds",
    "cuMemcpyDtoD_v2",
    "cuMemcpyDtoD_v2_ptds",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyHtoDAsync_v2_ptsz",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoHAsync_v2_ptsz",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyDtoDAsync_v2_ptsz",
    "cuMemsetD8_v2",
    "cuMemsetD8_v2_ptds",
    "cuMemsetD32_v2",
    "cuMemsetD32_v2_ptds",
    "cuMemsetD8Async",
    "cuMemsetD8Async_ptsz",
    "cuMemsetD32Async",
    "cuMemsetD32Async_ptsz",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuGetErrorString",
    "cuGetErrorName",
];

/// In the thunk variant, the (local, non-exported) name of the implementation behind the stub
/// exported as `symbol`.
pub fn thunk_implementation(symbol: &str) -> String {
    format!("fake_impl_{symbol}")
}

/// The first fake device address the allocator hands out (2 MiB aligned; sizes are rounded up to
/// [`FAKE_GRANULE`]). `cuInit` reserves `[FAKE_VA_BASE, FAKE_VA_END)` in the process (PROT_NONE),
/// as the real driver reserves its unified address range, so host mappings never land there.
/// Freed ranges are reused only after the allocator has gone once through the whole range (next
/// fit), so in a test a freed pointer does not come back.
pub const FAKE_VA_BASE: u64 = 0x7000_0000_0000;
/// One past the last fake device address (8 TiB above the base).
pub const FAKE_VA_END: u64 = 0x7800_0000_0000;
/// Alignment and rounding of device allocations, and the granularity `cuMemCreate` requires.
pub const FAKE_GRANULE: u64 = 2 << 20;
/// The fake card's memory; device allocations and `cuMemCreate` beyond it fail with
/// CUDA_ERROR_OUT_OF_MEMORY (managed memory does not count).
pub const FAKE_DEVICE_MEMORY: u64 = 80 << 30;

/// The path of the fake `libcuda.so.1` built in `variant` (one of [`VARIANTS`]).
///
/// # Panics
/// On an unknown variant, or when the library is not where the build put it (the target
/// directory was cleaned after this crate was compiled).
pub fn fake_libcuda(variant: &str) -> PathBuf {
    assert!(VARIANTS.contains(&variant), "unknown fake libcuda variant {variant:?}; known: {VARIANTS:?}");
    let p = PathBuf::from(FAKE_LIBCUDA_DIR).join(variant).join("libcuda.so.1");
    assert!(p.is_file(), "{} is missing; `cargo build -p gpu-tracer-tests` builds it", p.display());
    p
}
