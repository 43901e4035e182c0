/*
 * The entry points the fake libcuda.so.1 exports, as an X-macro list shared by the C
 * implementation (cuGetProcAddress's table) and the thunk variant's assembly (one stub and one
 * slot per name). The Rust side keeps the same list in tests/src/fake_libcuda.rs; a test compares
 * it with each built library's dynamic symbol table.
 *
 * Only preprocessor definitions here: the file is included from C and from assembly.
 */
#ifndef FAKE_LIBCUDA_SYMBOLS_H
#define FAKE_LIBCUDA_SYMBOLS_H

#define FAKE_LIBCUDA_SYMBOLS(X)            \
    X(cuInit)                              \
    X(cuDriverGetVersion)                  \
    X(cuDeviceGet)                         \
    X(cuDeviceGetCount)                    \
    X(cuDevicePrimaryCtxRetain)            \
    X(cuCtxCreate_v2)                      \
    X(cuCtxSetCurrent)                     \
    X(cuCtxGetCurrent)                     \
    X(cuStreamCreate)                      \
    X(cuModuleLoadData)                    \
    X(cuModuleGetFunction)                 \
    X(cuLibraryLoadData)                   \
    X(cuLibraryGetKernel)                  \
    X(cuKernelGetFunction)                 \
    X(cuLaunchKernel)                      \
    X(cuLaunchKernel_ptsz)                 \
    X(cuLaunchKernelEx)                    \
    X(cuLaunchKernelEx_ptsz)               \
    X(cuLaunchCooperativeKernel)           \
    X(cuLaunchCooperativeKernel_ptsz)      \
    X(cuGraphCreate)                       \
    X(cuGraphInstantiate)                  \
    X(cuGraphInstantiateWithFlags)         \
    X(cuGraphLaunch)                       \
    X(cuGraphLaunch_ptsz)                  \
    X(cuMemAlloc_v2)                       \
    X(cuMemAllocAsync)                     \
    X(cuMemAllocAsync_ptsz)                \
    X(cuMemAllocManaged)                   \
    X(cuMemAllocPitch_v2)                  \
    X(cuMemAllocHost_v2)                   \
    X(cuMemCreate)                         \
    X(cuMemRelease)                        \
    X(cuMemFree_v2)                        \
    X(cuMemFreeAsync)                      \
    X(cuMemFreeAsync_ptsz)                 \
    X(cuMemFreeHost)                       \
    X(cuEventCreate)                       \
    X(cuEventDestroy_v2)                   \
    X(cuStreamSynchronize)                 \
    X(cuStreamSynchronize_ptsz)            \
    X(cuCtxSynchronize)                    \
    X(cuEventSynchronize)                  \
    X(cuEventQuery)                        \
    X(cuStreamWaitEvent)                   \
    X(cuStreamWaitEvent_ptsz)              \
    X(cuEventRecord)                       \
    X(cuEventRecord_ptsz)                  \
    X(cuEventRecordWithFlags)              \
    X(cuEventRecordWithFlags_ptsz)         \
    X(cuMemcpy)                            \
    X(cuMemcpy_ptds)                       \
    X(cuMemcpyAsync)                       \
    X(cuMemcpyAsync_ptsz)                  \
    X(cuMemcpyHtoD_v2)                     \
    X(cuMemcpyHtoD_v2_ptds)                \
    X(cuMemcpyDtoH_v2)                     \
    X(cuMemcpyDtoH_v2_ptds)                \
    X(cuMemcpyDtoD_v2)                     \
    X(cuMemcpyDtoD_v2_ptds)                \
    X(cuMemcpyHtoDAsync_v2)                \
    X(cuMemcpyHtoDAsync_v2_ptsz)           \
    X(cuMemcpyDtoHAsync_v2)                \
    X(cuMemcpyDtoHAsync_v2_ptsz)           \
    X(cuMemcpyDtoDAsync_v2)                \
    X(cuMemcpyDtoDAsync_v2_ptsz)           \
    X(cuMemsetD8_v2)                       \
    X(cuMemsetD8_v2_ptds)                  \
    X(cuMemsetD32_v2)                      \
    X(cuMemsetD32_v2_ptds)                 \
    X(cuMemsetD8Async)                     \
    X(cuMemsetD8Async_ptsz)                \
    X(cuMemsetD32Async)                    \
    X(cuMemsetD32Async_ptsz)               \
    X(cuGetProcAddress)                    \
    X(cuGetProcAddress_v2)                 \
    X(cuGetErrorString)                    \
    X(cuGetErrorName)

#endif
