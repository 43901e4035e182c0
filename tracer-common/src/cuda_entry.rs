/// What the kernel does when an entry point is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Count calls per (cgroup, tgid, entry point) in `CUDA_COUNTS`.
    Count,
    /// `(T *out, size_t bytes, ...)`: count calls and bytes; at return, report the pointer.
    Alloc,
    /// `cuMemAllocPitch_v2(dptr*, pitch*, width, height, elem)`: bytes = width × height.
    AllocPitch,
    /// `(T ptr_or_handle, ...)`: report the pointer.
    Free,
    /// `(Handle *out, Handle src, [const char *name])`: report the handle with its name (or the
    /// handle it was derived from), so launches can be named.
    Lookup,
    /// Synchronisation, event records, copies and memsets: counted (copies and memsets with
    /// their bytes, [`crate::timed::bytes`]); in per-event mode also timed, entry to return,
    /// and reported with their first four arguments (user space reads them by entry point).
    Timed,
}
pub const LAUNCH_KERNEL: u32 = 0;
pub const LAUNCH_KERNEL_PTSZ: u32 = 1;
pub const LAUNCH_KERNEL_EX: u32 = 2;
pub const LAUNCH_KERNEL_EX_PTSZ: u32 = 3;
pub const LAUNCH_COOPERATIVE_KERNEL: u32 = 4;
pub const LAUNCH_COOPERATIVE_KERNEL_PTSZ: u32 = 5;
pub const GRAPH_LAUNCH: u32 = 6;
pub const GRAPH_LAUNCH_PTSZ: u32 = 7;
pub const MEM_ALLOC: u32 = 8;
pub const MEM_ALLOC_ASYNC: u32 = 9;
pub const MEM_ALLOC_ASYNC_PTSZ: u32 = 10;
pub const MEM_ALLOC_MANAGED: u32 = 11;
pub const MEM_ALLOC_PITCH: u32 = 12;
pub const MEM_CREATE: u32 = 13;
pub const MEM_ALLOC_HOST: u32 = 14;
pub const MEM_FREE: u32 = 15;
pub const MEM_FREE_ASYNC: u32 = 16;
pub const MEM_FREE_ASYNC_PTSZ: u32 = 17;
pub const MEM_RELEASE: u32 = 18;
pub const MEM_FREE_HOST: u32 = 19;
pub const CTX_CREATE: u32 = 20;
pub const PRIMARY_CTX_RETAIN: u32 = 21;
pub const MODULE_GET_FUNCTION: u32 = 22;
pub const LIBRARY_GET_KERNEL: u32 = 23;
pub const KERNEL_GET_FUNCTION: u32 = 24;
// Synchronisation and events: `(stream)`, `()`, `(event)`, `(stream, event, flags)`,
// `(event, stream[, flags])`.
pub const STREAM_SYNCHRONIZE: u32 = 25;
pub const STREAM_SYNCHRONIZE_PTSZ: u32 = 26;
pub const CTX_SYNCHRONIZE: u32 = 27;
pub const EVENT_SYNCHRONIZE: u32 = 28;
pub const EVENT_QUERY: u32 = 29;
pub const STREAM_WAIT_EVENT: u32 = 30;
pub const STREAM_WAIT_EVENT_PTSZ: u32 = 31;
pub const EVENT_RECORD: u32 = 32;
pub const EVENT_RECORD_PTSZ: u32 = 33;
pub const EVENT_RECORD_WITH_FLAGS: u32 = 34;
pub const EVENT_RECORD_WITH_FLAGS_PTSZ: u32 = 35;
// Copies: `(dst, src, bytes[, stream])`. The `_ptds` ones (synchronous) are what a program
// built with `--default-stream per-thread` calls; they copy on its thread's default stream.
pub const MEMCPY: u32 = 36;
pub const MEMCPY_PTDS: u32 = 37;
pub const MEMCPY_ASYNC: u32 = 38;
pub const MEMCPY_ASYNC_PTSZ: u32 = 39;
pub const MEMCPY_HTOD: u32 = 40;
pub const MEMCPY_HTOD_PTDS: u32 = 41;
pub const MEMCPY_DTOH: u32 = 42;
pub const MEMCPY_DTOH_PTDS: u32 = 43;
pub const MEMCPY_DTOD: u32 = 44;
pub const MEMCPY_DTOD_PTDS: u32 = 45;
pub const MEMCPY_HTOD_ASYNC: u32 = 46;
pub const MEMCPY_HTOD_ASYNC_PTSZ: u32 = 47;
pub const MEMCPY_DTOH_ASYNC: u32 = 48;
pub const MEMCPY_DTOH_ASYNC_PTSZ: u32 = 49;
pub const MEMCPY_DTOD_ASYNC: u32 = 50;
pub const MEMCPY_DTOD_ASYNC_PTSZ: u32 = 51;
// Memsets: `(dst, value, count[, stream])`, count in elements of 1 or 4 bytes.
pub const MEMSET_D8: u32 = 52;
pub const MEMSET_D8_PTDS: u32 = 53;
pub const MEMSET_D32: u32 = 54;
pub const MEMSET_D32_PTDS: u32 = 55;
pub const MEMSET_D8_ASYNC: u32 = 56;
pub const MEMSET_D8_ASYNC_PTSZ: u32 = 57;
pub const MEMSET_D32_ASYNC: u32 = 58;
pub const MEMSET_D32_ASYNC_PTSZ: u32 = 59;
pub const COUNT: u32 = 60;
/// (id, exported symbol, action), in id order.
pub const ALL: [(u32, &str, Action); COUNT as usize] = [
    (LAUNCH_KERNEL, "cuLaunchKernel", Action::Count),
    (LAUNCH_KERNEL_PTSZ, "cuLaunchKernel_ptsz", Action::Count),
    (LAUNCH_KERNEL_EX, "cuLaunchKernelEx", Action::Count),
    (LAUNCH_KERNEL_EX_PTSZ, "cuLaunchKernelEx_ptsz", Action::Count),
    (LAUNCH_COOPERATIVE_KERNEL, "cuLaunchCooperativeKernel", Action::Count),
    (LAUNCH_COOPERATIVE_KERNEL_PTSZ, "cuLaunchCooperativeKernel_ptsz", Action::Count),
    (GRAPH_LAUNCH, "cuGraphLaunch", Action::Count),
    (GRAPH_LAUNCH_PTSZ, "cuGraphLaunch_ptsz", Action::Count),
    (MEM_ALLOC, "cuMemAlloc_v2", Action::Alloc),
    (MEM_ALLOC_ASYNC, "cuMemAllocAsync", Action::Alloc),
    (MEM_ALLOC_ASYNC_PTSZ, "cuMemAllocAsync_ptsz", Action::Alloc),
    (MEM_ALLOC_MANAGED, "cuMemAllocManaged", Action::Alloc),
    (MEM_ALLOC_PITCH, "cuMemAllocPitch_v2", Action::AllocPitch),
    (MEM_CREATE, "cuMemCreate", Action::Alloc),
    (MEM_ALLOC_HOST, "cuMemAllocHost_v2", Action::Alloc),
    (MEM_FREE, "cuMemFree_v2", Action::Free),
    (MEM_FREE_ASYNC, "cuMemFreeAsync", Action::Free),
    (MEM_FREE_ASYNC_PTSZ, "cuMemFreeAsync_ptsz", Action::Free),
    (MEM_RELEASE, "cuMemRelease", Action::Free),
    (MEM_FREE_HOST, "cuMemFreeHost", Action::Free),
    (CTX_CREATE, "cuCtxCreate_v2", Action::Count),
    (PRIMARY_CTX_RETAIN, "cuDevicePrimaryCtxRetain", Action::Count),
    (MODULE_GET_FUNCTION, "cuModuleGetFunction", Action::Lookup),
    (LIBRARY_GET_KERNEL, "cuLibraryGetKernel", Action::Lookup),
    (KERNEL_GET_FUNCTION, "cuKernelGetFunction", Action::Lookup),
    (STREAM_SYNCHRONIZE, "cuStreamSynchronize", Action::Timed),
    (STREAM_SYNCHRONIZE_PTSZ, "cuStreamSynchronize_ptsz", Action::Timed),
    (CTX_SYNCHRONIZE, "cuCtxSynchronize", Action::Timed),
    (EVENT_SYNCHRONIZE, "cuEventSynchronize", Action::Timed),
    (EVENT_QUERY, "cuEventQuery", Action::Timed),
    (STREAM_WAIT_EVENT, "cuStreamWaitEvent", Action::Timed),
    (STREAM_WAIT_EVENT_PTSZ, "cuStreamWaitEvent_ptsz", Action::Timed),
    (EVENT_RECORD, "cuEventRecord", Action::Timed),
    (EVENT_RECORD_PTSZ, "cuEventRecord_ptsz", Action::Timed),
    (EVENT_RECORD_WITH_FLAGS, "cuEventRecordWithFlags", Action::Timed),
    (EVENT_RECORD_WITH_FLAGS_PTSZ, "cuEventRecordWithFlags_ptsz", Action::Timed),
    (MEMCPY, "cuMemcpy", Action::Timed),
    (MEMCPY_PTDS, "cuMemcpy_ptds", Action::Timed),
    (MEMCPY_ASYNC, "cuMemcpyAsync", Action::Timed),
    (MEMCPY_ASYNC_PTSZ, "cuMemcpyAsync_ptsz", Action::Timed),
    (MEMCPY_HTOD, "cuMemcpyHtoD_v2", Action::Timed),
    (MEMCPY_HTOD_PTDS, "cuMemcpyHtoD_v2_ptds", Action::Timed),
    (MEMCPY_DTOH, "cuMemcpyDtoH_v2", Action::Timed),
    (MEMCPY_DTOH_PTDS, "cuMemcpyDtoH_v2_ptds", Action::Timed),
    (MEMCPY_DTOD, "cuMemcpyDtoD_v2", Action::Timed),
    (MEMCPY_DTOD_PTDS, "cuMemcpyDtoD_v2_ptds", Action::Timed),
    (MEMCPY_HTOD_ASYNC, "cuMemcpyHtoDAsync_v2", Action::Timed),
    (MEMCPY_HTOD_ASYNC_PTSZ, "cuMemcpyHtoDAsync_v2_ptsz", Action::Timed),
    (MEMCPY_DTOH_ASYNC, "cuMemcpyDtoHAsync_v2", Action::Timed),
    (MEMCPY_DTOH_ASYNC_PTSZ, "cuMemcpyDtoHAsync_v2_ptsz", Action::Timed),
    (MEMCPY_DTOD_ASYNC, "cuMemcpyDtoDAsync_v2", Action::Timed),
    (MEMCPY_DTOD_ASYNC_PTSZ, "cuMemcpyDtoDAsync_v2_ptsz", Action::Timed),
    (MEMSET_D8, "cuMemsetD8_v2", Action::Timed),
    (MEMSET_D8_PTDS, "cuMemsetD8_v2_ptds", Action::Timed),
    (MEMSET_D32, "cuMemsetD32_v2", Action::Timed),
    (MEMSET_D32_PTDS, "cuMemsetD32_v2_ptds", Action::Timed),
    (MEMSET_D8_ASYNC, "cuMemsetD8Async", Action::Timed),
    (MEMSET_D8_ASYNC_PTSZ, "cuMemsetD8Async_ptsz", Action::Timed),
    (MEMSET_D32_ASYNC, "cuMemsetD32Async", Action::Timed),
    (MEMSET_D32_ASYNC_PTSZ, "cuMemsetD32Async_ptsz", Action::Timed),
];
/// Is this entry point a kernel launch (graph launches included)?
pub const fn is_launch(id: u32) -> bool {
    id <= GRAPH_LAUNCH_PTSZ
}
/// Is this a graph launch?
pub const fn is_graph_launch(id: u32) -> bool {
    id == GRAPH_LAUNCH || id == GRAPH_LAUNCH_PTSZ
}
