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
    X(cuGetProcAddress)                    \
    X(cuGetProcAddress_v2)                 \
    X(cuGetErrorString)                    \
    X(cuGetErrorName)

#endif
