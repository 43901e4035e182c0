/*
 * A fake libcuda.so.1: the CUDA driver API entry points a tracer probes, with the real exported
 * names and C signatures (CUDA 12 cuda.h; docs in /work/shared/reference/nvidia-abi.md §6.2),
 * writing out-parameters the way the real library does, without a GPU.
 *
 * What it models:
 *   - cuInit must come first: every other call (except cuGetErrorString/Name, cuDriverGetVersion
 *     and cuGetProcAddress*) returns CUDA_ERROR_NOT_INITIALIZED (3) before it, like the real one.
 *   - Device pointers (cuMemAlloc_v2, cuMemAllocAsync(_ptsz), cuMemAllocManaged,
 *     cuMemAllocPitch_v2) come from a next-fit allocator over a fake device address range
 *     [FAKE_VA_BASE, FAKE_VA_END), which cuInit reserves (PROT_NONE) so that host memory never
 *     lands there; 2 MiB aligned and rounded; never two live ones overlap. The
 *     library tracks live allocations: freeing an unknown pointer (or twice) returns
 *     CUDA_ERROR_INVALID_VALUE (1). Device memory is FAKE_DEVICE_MEMORY bytes; beyond that
 *     allocations fail with CUDA_ERROR_OUT_OF_MEMORY (2) (managed memory does not count: it is not
 *     device memory until touched).
 *   - cuMemAllocHost_v2 returns real, usable host memory (an anonymous mapping).
 *   - cuMemCreate returns opaque handles (size must be a non-zero multiple of 2 MiB, the
 *     granularity; prop must describe pinned device memory on device 0).
 *   - Contexts, streams, modules, functions, libraries, kernels, graphs and graph execs are heap
 *     objects whose addresses are the handles, as in the real library. cuModuleGetFunction and
 *     cuLibraryGetKernel return the same handle for the same name in the same module/library.
 *   - Launches return CUDA_SUCCESS for a non-NULL function (and non-zero dimensions), and
 *     CUDA_ERROR_INVALID_VALUE otherwise; they touch no shared state, so launch loops on several
 *     threads do not contend. cuGraphLaunch does the same for the graph exec.
 *   - GPU time, only when FAKE_LIBCUDA_KERNEL_NS is set (read by cuInit; unset or 0: launches touch
 *     no shared state, as above): each launch occupies its stream for that many ns after the
 *     stream's previous work (the NULL, legacy and per-thread default streams are one stream here),
 *     so cuStreamSynchronize sleeps until its stream is done, cuCtxSynchronize until every stream
 *     is, cuEventRecord marks the event done when its stream's work so far is, cuEventSynchronize
 *     sleeps until then, cuEventQuery answers CUDA_ERROR_NOT_READY (600) before it, and
 *     cuStreamWaitEvent delays the stream's later work until the event. Copies and memsets check
 *     their arguments (non-NULL pointers) and return; the synchronous ones first wait for the
 *     default stream, like the real legacy stream.
 *   - cuGetProcAddress(_v2) returns the exported symbol's own address (what dlsym returns), as the
 *     real 535 library was seen to do; it maps base names to `_v2` and, with
 *     CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, to `_ptsz` or `_ptds` (also after `_v2`).
 *
 * Prologue variants (what a uprobe at the exported symbol sees), chosen by how it is compiled:
 *   - push:    -fcf-protection=none; every exported function starts with `push %rbp`.
 *   - endbr64: -fcf-protection=full; `endbr64`, then `push %rbp`.
 *   - thunk:   -DFAKE_LIBCUDA_THUNK plus thunks.S: the exported symbols are 24-byte stubs like the
 *              real 535 libcuda's (cmpl $0x321cba00, FLAG(%rip); je ret4; jmp *SLOT(%rip)), and the
 *              implementations below are hidden `fake_impl_<name>` functions starting with
 *              `push %rbp`.
 * The build (tests/build.rs) compiles at -O0 with -fno-omit-frame-pointer so that the frame set-up
 * is the first thing in every function: at -O1 gcc drops it from leaf functions that never touch
 * the stack (cuInit, cuDeviceGet, ...) even with -fno-omit-frame-pointer.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "symbols.h"

/* ----- types (cuda.h) ------------------------------------------------------------------------ */

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef unsigned long long cuuint64_t;
typedef struct fake_object *CUcontext;
typedef struct fake_object *CUstream;
typedef struct fake_object *CUmodule;
typedef struct fake_object *CUfunction;
typedef struct fake_object *CUlibrary;
typedef struct fake_object *CUkernel;
typedef struct fake_object *CUgraph;
typedef struct fake_object *CUgraphExec;
typedef struct fake_object *CUgraphNode;
typedef struct fake_object *CUevent;
typedef int CUjit_option;
typedef int CUlibraryOption;
typedef int CUdriverProcAddressQueryResult;

typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    void *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;
_Static_assert(sizeof(CUlaunchConfig) == 56, "CUlaunchConfig is 56 bytes");
_Static_assert(offsetof(CUlaunchConfig, hStream) == 32, "CUlaunchConfig.hStream at 32");

typedef struct {
    int type;
    int requestedHandleTypes;
    struct {
        int type;
        int id;
    } location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp is 32 bytes");

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
};

enum { CU_MEM_ATTACH_GLOBAL = 1, CU_MEM_ATTACH_HOST = 2 };
enum { CU_MEM_ALLOCATION_TYPE_PINNED = 1, CU_MEM_LOCATION_TYPE_DEVICE = 1 };
enum { CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2 };
enum { CU_GET_PROC_ADDRESS_SUCCESS = 0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1 };

/* ----- the fake device ----------------------------------------------------------------------- */

#define FAKE_DRIVER_VERSION 12020                /* what a 535 driver reports */
#define FAKE_DEVICE_COUNT 1
#define FAKE_VA_BASE 0x700000000000ULL           /* first fake device address */
#define FAKE_VA_END 0x780000000000ULL            /* one past the last (8 TiB) */
#define FAKE_GRANULE (2ULL << 20)                /* allocation alignment and rounding */
#define FAKE_DEVICE_MEMORY (80ULL << 30)         /* an 80 GiB card */
#define FAKE_PITCH_ALIGN 512ULL
#define FAKE_HANDLE_BASE 0x4d0000000000ULL       /* cuMemCreate handles: base + n * 0x40 */
#define FAKE_DEINIT_MAGIC 0x321cba00u            /* the value the thunks compare the flag with */

#ifdef FAKE_LIBCUDA_THUNK
/* The implementation behind the stub of the same name in thunks.S. */
#define API(name) __attribute__((visibility("hidden"), noinline, used)) fake_impl_##name
#else
#define API(name) __attribute__((visibility("default"), noinline)) name
#endif

/* Set to FAKE_DEINIT_MAGIC while the library is being unloaded; the thunks then return
 * CUDA_ERROR_DEINITIALIZED without calling the implementation (as the real stubs do). */
__attribute__((visibility("hidden"))) volatile unsigned int fake_cuda_teardown;

__attribute__((destructor)) static void fake_cuda_fini(void) { fake_cuda_teardown = FAKE_DEINIT_MAGIC; }

static atomic_int initialized;

#define REQUIRE_INIT()                                                    \
    do {                                                                  \
        if (!atomic_load_explicit(&initialized, memory_order_acquire))    \
            return CUDA_ERROR_NOT_INITIALIZED;                            \
    } while (0)

enum object_kind {
    OBJ_CONTEXT = 1,
    OBJ_STREAM,
    OBJ_MODULE,
    OBJ_FUNCTION,
    OBJ_LIBRARY,
    OBJ_KERNEL,
    OBJ_GRAPH,
    OBJ_EXEC,
    OBJ_EVENT
};

/* Every handle the library gives out points at one of these. */
struct fake_object {
    uint32_t magic;
    uint32_t kind;
    char *name;                    /* functions and kernels */
    struct fake_object *parent;    /* a function's module, a kernel's library */
    struct fake_object *children;  /* a module's functions, a library's kernels */
    struct fake_object *next;      /* sibling in the parent's list */
    struct fake_object *function;  /* a kernel's CUfunction (cuKernelGetFunction) */
    _Atomic uint64_t done_at;      /* a stream's work, an event's: CLOCK_MONOTONIC ns when done */
};
#define OBJECT_MAGIC 0xfacec0deu

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct fake_object primary_context = {OBJECT_MAGIC, OBJ_CONTEXT, NULL, NULL, NULL, NULL, NULL, 0};
static __thread CUcontext current_context;

static struct fake_object *new_object(uint32_t kind, struct fake_object *parent, const char *name) {
    struct fake_object *o = calloc(1, sizeof *o);
    if (!o)
        return NULL;
    o->magic = OBJECT_MAGIC;
    o->kind = kind;
    o->parent = parent;
    if (name && !(o->name = strdup(name))) {
        free(o);
        return NULL;
    }
    return o;
}

/* The child of `parent` called `name`, created on first use. Caller holds `lock`. */
static struct fake_object *named_child(struct fake_object *parent, uint32_t kind, const char *name) {
    for (struct fake_object *c = parent->children; c; c = c->next)
        if (strcmp(c->name, name) == 0)
            return c;
    struct fake_object *c = new_object(kind, parent, name);
    if (c) {
        c->next = parent->children;
        parent->children = c;
    }
    return c;
}

static int is_object(const struct fake_object *o, uint32_t kind) {
    return o && o->magic == OBJECT_MAGIC && o->kind == kind;
}

/* ----- live allocations ---------------------------------------------------------------------- */

enum block_kind { BLOCK_DEVICE = 1, BLOCK_MANAGED, BLOCK_HOST, BLOCK_HANDLE };

struct block {
    uint64_t addr; /* pointer, or handle for BLOCK_HANDLE */
    uint64_t size; /* bytes reserved (rounded) */
    int kind;
};

/* Sorted by addr. */
struct table {
    struct block *v;
    size_t n, cap;
};

static struct table device_blocks; /* BLOCK_DEVICE and BLOCK_MANAGED */
static struct table host_blocks;
static struct table handles;
static uint64_t va_cursor = FAKE_VA_BASE;
static uint64_t next_handle = 1;
static uint64_t device_bytes_in_use; /* BLOCK_DEVICE + BLOCK_HANDLE */

/* Index of the first block with addr >= `addr`. */
static size_t lower_bound(const struct table *t, uint64_t addr) {
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->v[mid].addr < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int table_insert(struct table *t, uint64_t addr, uint64_t size, int kind) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        struct block *v = realloc(t->v, cap * sizeof *v);
        if (!v)
            return -1;
        t->v = v;
        t->cap = cap;
    }
    size_t i = lower_bound(t, addr);
    memmove(&t->v[i + 1], &t->v[i], (t->n - i) * sizeof *t->v);
    t->v[i] = (struct block){addr, size, kind};
    t->n++;
    return 0;
}

/* Remove the block starting exactly at `addr`; 0 and the block if there was one. */
static int table_remove(struct table *t, uint64_t addr, struct block *out) {
    size_t i = lower_bound(t, addr);
    if (i == t->n || t->v[i].addr != addr)
        return -1;
    *out = t->v[i];
    memmove(&t->v[i], &t->v[i + 1], (t->n - i - 1) * sizeof *t->v);
    t->n--;
    return 0;
}

static uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

/* Next-fit placement of `size` bytes (a multiple of FAKE_GRANULE) among the live device blocks:
 * from the cursor to the end of the range, then once from its start. Caller holds `lock`. */
static int place(uint64_t size, uint64_t *out) {
    for (int pass = 0; pass < 2; pass++) {
        uint64_t cand = pass == 0 ? va_cursor : FAKE_VA_BASE;
        size_t i = lower_bound(&device_blocks, cand);
        if (i > 0) {
            const struct block *prev = &device_blocks.v[i - 1];
            if (prev->addr + prev->size > cand)
                cand = prev->addr + prev->size;
        }
        for (; i < device_blocks.n; i++) {
            if (cand + size <= device_blocks.v[i].addr)
                break;
            uint64_t end = device_blocks.v[i].addr + device_blocks.v[i].size;
            if (end > cand)
                cand = end;
        }
        if (cand + size <= FAKE_VA_END && cand + size > cand) {
            *out = cand;
            va_cursor = cand + size;
            return 0;
        }
    }
    return -1;
}

static CUresult device_alloc(CUdeviceptr *dptr, size_t bytesize, int kind) {
    REQUIRE_INIT();
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (bytesize > FAKE_DEVICE_MEMORY)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t size = round_up(bytesize, FAKE_GRANULE), addr;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    if (kind == BLOCK_DEVICE && device_bytes_in_use + size > FAKE_DEVICE_MEMORY)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    else if (place(size, &addr) != 0 || table_insert(&device_blocks, addr, size, kind) != 0)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    else if (kind == BLOCK_DEVICE)
        device_bytes_in_use += size;
    pthread_mutex_unlock(&lock);
    if (r == CUDA_SUCCESS)
        *dptr = addr;
    return r;
}

static CUresult device_free(CUdeviceptr dptr) {
    REQUIRE_INIT();
    struct block b;
    pthread_mutex_lock(&lock);
    int found = table_remove(&device_blocks, dptr, &b) == 0;
    if (found && b.kind == BLOCK_DEVICE)
        device_bytes_in_use -= b.size;
    pthread_mutex_unlock(&lock);
    return found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ----- initialisation, devices, contexts, streams ------------------------------------------- */

/* Reserve the fake device address range in this process (PROT_NONE, nothing committed), as the
 * real driver reserves its unified address range, so that no host mapping ever lands on a fake
 * device pointer. Best effort: the pointers are never dereferenced, so a failure only means a
 * host address could coincide with one. */
static void reserve_device_range(void) {
    mmap((void *)(uintptr_t)FAKE_VA_BASE, FAKE_VA_END - FAKE_VA_BASE, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
}

/* ----- simulated GPU time (FAKE_LIBCUDA_KERNEL_NS) -------------------------------------------- */

static uint64_t kernel_ns;                    /* 0: no GPU time is simulated */
static struct fake_object default_stream;     /* NULL, CU_STREAM_LEGACY (1), CU_STREAM_PER_THREAD (2) */
static _Atomic uint64_t all_done_at;          /* the latest done_at of any stream */

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t) {
    for (uint64_t now = now_ns(); now < t; now = now_ns()) {
        struct timespec d = {(time_t)((t - now) / 1000000000ull), (long)((t - now) % 1000000000ull)};
        nanosleep(&d, NULL);
    }
}

/* The stream object a handle means: a created stream, or the default stream. NULL if invalid. */
static struct fake_object *stream_of(CUstream s) {
    if ((uintptr_t)s <= 2)
        return &default_stream;
    return is_object(s, OBJ_STREAM) ? s : NULL;
}

static void raise_to(_Atomic uint64_t *v, uint64_t t) {
    uint64_t old = atomic_load(v);
    while (old < t && !atomic_compare_exchange_weak(v, &old, t)) {
    }
}

/* Queue `ns` of work on stream `s` after what it has. */
static void enqueue(CUstream s, uint64_t ns) {
    struct fake_object *o = stream_of(s);
    if (!o || !ns)
        return;
    uint64_t now = now_ns(), old = atomic_load(&o->done_at), next;
    do {
        next = (old > now ? old : now) + ns;
    } while (!atomic_compare_exchange_weak(&o->done_at, &old, next));
    raise_to(&all_done_at, next);
}

/* A launch on `s`: GPU time when it is simulated (no shared state is touched otherwise). */
static CUresult launched(CUresult r, CUstream s) {
    if (r == CUDA_SUCCESS && kernel_ns)
        enqueue(s, kernel_ns);
    return r;
}

CUresult API(cuInit)(unsigned int Flags) {
    static pthread_once_t reserve_once = PTHREAD_ONCE_INIT;
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&reserve_once, reserve_device_range);
    const char *k = getenv("FAKE_LIBCUDA_KERNEL_NS");
    kernel_ns = k ? strtoull(k, NULL, 10) : 0;
    default_stream.magic = OBJECT_MAGIC;
    default_stream.kind = OBJ_STREAM;
    atomic_store_explicit(&initialized, 1, memory_order_release);
    return CUDA_SUCCESS;
}

CUresult API(cuDriverGetVersion)(int *driverVersion) {
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = FAKE_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

CUresult API(cuDeviceGet)(CUdevice *device, int ordinal) {
    REQUIRE_INIT();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= FAKE_DEVICE_COUNT)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult API(cuDeviceGetCount)(int *count) {
    REQUIRE_INIT();
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = FAKE_DEVICE_COUNT;
    return CUDA_SUCCESS;
}

CUresult API(cuDevicePrimaryCtxRetain)(CUcontext *pctx, CUdevice dev) {
    REQUIRE_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= FAKE_DEVICE_COUNT)
        return CUDA_ERROR_INVALID_DEVICE;
    *pctx = &primary_context;
    return CUDA_SUCCESS;
}

CUresult API(cuCtxCreate_v2)(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    REQUIRE_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= FAKE_DEVICE_COUNT)
        return CUDA_ERROR_INVALID_DEVICE;
    struct fake_object *c = new_object(OBJ_CONTEXT, NULL, NULL);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    current_context = c;
    *pctx = c;
    return CUDA_SUCCESS;
}

CUresult API(cuCtxSetCurrent)(CUcontext ctx) {
    REQUIRE_INIT();
    if (ctx && !is_object(ctx, OBJ_CONTEXT))
        return CUDA_ERROR_INVALID_CONTEXT;
    current_context = ctx;
    return CUDA_SUCCESS;
}

CUresult API(cuCtxGetCurrent)(CUcontext *pctx) {
    REQUIRE_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = current_context;
    return CUDA_SUCCESS;
}

CUresult API(cuStreamCreate)(CUstream *phStream, unsigned int Flags) {
    (void)Flags;
    REQUIRE_INIT();
    if (!phStream)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_object *s = new_object(OBJ_STREAM, NULL, NULL);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phStream = s;
    return CUDA_SUCCESS;
}

/* ----- modules, libraries, functions, kernels ------------------------------------------------ */

CUresult API(cuModuleLoadData)(CUmodule *module, const void *image) {
    REQUIRE_INIT();
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_object *m = new_object(OBJ_MODULE, NULL, NULL);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *module = m;
    return CUDA_SUCCESS;
}

CUresult API(cuModuleGetFunction)(CUfunction *hfunc, CUmodule hmod, const char *name) {
    REQUIRE_INIT();
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!is_object(hmod, OBJ_MODULE))
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&lock);
    struct fake_object *f = named_child(hmod, OBJ_FUNCTION, name);
    pthread_mutex_unlock(&lock);
    if (!f)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *hfunc = f;
    return CUDA_SUCCESS;
}

CUresult API(cuLibraryLoadData)(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                void **jitOptionsValues, unsigned int numJitOptions,
                                CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                unsigned int numLibraryOptions) {
    (void)jitOptions, (void)jitOptionsValues, (void)numJitOptions;
    (void)libraryOptions, (void)libraryOptionValues, (void)numLibraryOptions;
    REQUIRE_INIT();
    if (!library || !code)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_object *l = new_object(OBJ_LIBRARY, NULL, NULL);
    if (!l)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *library = l;
    return CUDA_SUCCESS;
}

CUresult API(cuLibraryGetKernel)(CUkernel *pKernel, CUlibrary library, const char *name) {
    REQUIRE_INIT();
    if (!pKernel || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (!is_object(library, OBJ_LIBRARY))
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&lock);
    struct fake_object *k = named_child(library, OBJ_KERNEL, name);
    pthread_mutex_unlock(&lock);
    if (!k)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pKernel = k;
    return CUDA_SUCCESS;
}

CUresult API(cuKernelGetFunction)(CUfunction *pFunc, CUkernel kernel) {
    REQUIRE_INIT();
    if (!pFunc)
        return CUDA_ERROR_INVALID_VALUE;
    if (!is_object(kernel, OBJ_KERNEL))
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&lock);
    if (!kernel->function)
        kernel->function = new_object(OBJ_FUNCTION, kernel, kernel->name);
    struct fake_object *f = kernel->function;
    pthread_mutex_unlock(&lock);
    if (!f)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pFunc = f;
    return CUDA_SUCCESS;
}

/* ----- launches ------------------------------------------------------------------------------ */

static CUresult check_launch(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                             unsigned int by, unsigned int bz) {
    REQUIRE_INIT();
    if (!f || !gx || !gy || !gz || !bx || !by || !bz)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

CUresult API(cuLaunchKernel)(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                             unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra) {
    (void)sharedMemBytes, (void)kernelParams, (void)extra;
    return launched(check_launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ), hStream);
}

CUresult API(cuLaunchKernel_ptsz)(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                  unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                  unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                                  void **extra) {
    (void)sharedMemBytes, (void)kernelParams, (void)extra;
    return launched(check_launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ), hStream);
}

static CUresult check_launch_ex(const CUlaunchConfig *config, CUfunction f) {
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    return check_launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                        config->blockDimY, config->blockDimZ);
}

CUresult API(cuLaunchKernelEx)(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
    (void)kernelParams, (void)extra;
    CUresult r = check_launch_ex(config, f);
    return launched(r, r == CUDA_SUCCESS ? config->hStream : NULL);
}

CUresult API(cuLaunchKernelEx_ptsz)(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
    (void)kernelParams, (void)extra;
    CUresult r = check_launch_ex(config, f);
    return launched(r, r == CUDA_SUCCESS ? config->hStream : NULL);
}

CUresult API(cuLaunchCooperativeKernel)(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams) {
    (void)sharedMemBytes, (void)kernelParams;
    return launched(check_launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ), hStream);
}

CUresult API(cuLaunchCooperativeKernel_ptsz)(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                             unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                             unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                             void **kernelParams) {
    (void)sharedMemBytes, (void)kernelParams;
    return launched(check_launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ), hStream);
}

/* ----- graphs -------------------------------------------------------------------------------- */

CUresult API(cuGraphCreate)(CUgraph *phGraph, unsigned int flags) {
    REQUIRE_INIT();
    if (!phGraph || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_object *g = new_object(OBJ_GRAPH, NULL, NULL);
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phGraph = g;
    return CUDA_SUCCESS;
}

static CUresult instantiate(CUgraphExec *phGraphExec, CUgraph hGraph) {
    REQUIRE_INIT();
    if (!phGraphExec)
        return CUDA_ERROR_INVALID_VALUE;
    if (!is_object(hGraph, OBJ_GRAPH))
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_object *e = new_object(OBJ_EXEC, hGraph, NULL);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phGraphExec = e;
    return CUDA_SUCCESS;
}

/* The legacy (CUDA 11) signature the unversioned symbol keeps. */
CUresult API(cuGraphInstantiate)(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                 char *logBuffer, size_t bufferSize) {
    if (phErrorNode)
        *phErrorNode = NULL;
    if (logBuffer && bufferSize)
        logBuffer[0] = 0;
    return instantiate(phGraphExec, hGraph);
}

CUresult API(cuGraphInstantiateWithFlags)(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags) {
    (void)flags;
    return instantiate(phGraphExec, hGraph);
}

CUresult API(cuGraphLaunch)(CUgraphExec hGraphExec, CUstream hStream) {
    REQUIRE_INIT();
    return launched(hGraphExec ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE, hStream);
}

CUresult API(cuGraphLaunch_ptsz)(CUgraphExec hGraphExec, CUstream hStream) {
    REQUIRE_INIT();
    return launched(hGraphExec ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE, hStream);
}

/* ----- events, synchronisation --------------------------------------------------------------- */

CUresult API(cuEventCreate)(CUevent *phEvent, unsigned int Flags) {
    (void)Flags;
    REQUIRE_INIT();
    if (!phEvent)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_object *e = new_object(OBJ_EVENT, NULL, NULL);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phEvent = e;
    return CUDA_SUCCESS;
}

CUresult API(cuEventDestroy_v2)(CUevent hEvent) {
    REQUIRE_INIT();
    if (!is_object(hEvent, OBJ_EVENT))
        return CUDA_ERROR_INVALID_HANDLE;
    hEvent->magic = 0;
    free(hEvent);
    return CUDA_SUCCESS;
}

static CUresult stream_synchronize(CUstream s) {
    REQUIRE_INIT();
    struct fake_object *o = stream_of(s);
    if (!o)
        return CUDA_ERROR_INVALID_HANDLE;
    sleep_until(atomic_load(&o->done_at));
    return CUDA_SUCCESS;
}

CUresult API(cuStreamSynchronize)(CUstream hStream) { return stream_synchronize(hStream); }

CUresult API(cuStreamSynchronize_ptsz)(CUstream hStream) { return stream_synchronize(hStream); }

CUresult API(cuCtxSynchronize)(void) {
    REQUIRE_INIT();
    sleep_until(atomic_load(&all_done_at));
    return CUDA_SUCCESS;
}

static CUresult event_record(CUevent e, CUstream s) {
    REQUIRE_INIT();
    struct fake_object *o = stream_of(s);
    if (!is_object(e, OBJ_EVENT) || !o)
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t now = now_ns(), done = atomic_load(&o->done_at);
    atomic_store(&e->done_at, done > now ? done : now);
    return CUDA_SUCCESS;
}

CUresult API(cuEventRecord)(CUevent hEvent, CUstream hStream) { return event_record(hEvent, hStream); }

CUresult API(cuEventRecord_ptsz)(CUevent hEvent, CUstream hStream) { return event_record(hEvent, hStream); }

CUresult API(cuEventRecordWithFlags)(CUevent hEvent, CUstream hStream, unsigned int flags) {
    (void)flags;
    return event_record(hEvent, hStream);
}

CUresult API(cuEventRecordWithFlags_ptsz)(CUevent hEvent, CUstream hStream, unsigned int flags) {
    (void)flags;
    return event_record(hEvent, hStream);
}

CUresult API(cuEventSynchronize)(CUevent hEvent) {
    REQUIRE_INIT();
    if (!is_object(hEvent, OBJ_EVENT))
        return CUDA_ERROR_INVALID_HANDLE;
    sleep_until(atomic_load(&hEvent->done_at));
    return CUDA_SUCCESS;
}

CUresult API(cuEventQuery)(CUevent hEvent) {
    REQUIRE_INIT();
    if (!is_object(hEvent, OBJ_EVENT))
        return CUDA_ERROR_INVALID_HANDLE;
    return now_ns() >= atomic_load(&hEvent->done_at) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

static CUresult stream_wait_event(CUstream s, CUevent e) {
    REQUIRE_INIT();
    struct fake_object *o = stream_of(s);
    if (!is_object(e, OBJ_EVENT) || !o)
        return CUDA_ERROR_INVALID_HANDLE;
    raise_to(&o->done_at, atomic_load(&e->done_at));
    return CUDA_SUCCESS;
}

CUresult API(cuStreamWaitEvent)(CUstream hStream, CUevent hEvent, unsigned int Flags) {
    (void)Flags;
    return stream_wait_event(hStream, hEvent);
}

CUresult API(cuStreamWaitEvent_ptsz)(CUstream hStream, CUevent hEvent, unsigned int Flags) {
    (void)Flags;
    return stream_wait_event(hStream, hEvent);
}

/* ----- copies and memsets -------------------------------------------------------------------- */

/* Argument checks; a synchronous call first waits for the default stream (legacy semantics). */
static CUresult copy(uint64_t dst, uint64_t src, CUstream s, int sync) {
    REQUIRE_INIT();
    if (!dst || !src || !stream_of(s))
        return CUDA_ERROR_INVALID_VALUE;
    if (sync)
        sleep_until(atomic_load(&default_stream.done_at));
    return CUDA_SUCCESS;
}

CUresult API(cuMemcpy)(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
    (void)ByteCount;
    return copy(dst, src, NULL, 1);
}

/* The `_ptds`/`_ptsz` forms (per-thread default stream) behave as their base forms: the default
 * streams are one stream here. */
CUresult API(cuMemcpy_ptds)(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
    (void)ByteCount;
    return copy(dst, src, NULL, 1);
}

CUresult API(cuMemcpyAsync)(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
    (void)ByteCount;
    return copy(dst, src, hStream, 0);
}

CUresult API(cuMemcpyAsync_ptsz)(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
    (void)ByteCount;
    return copy(dst, src, hStream, 0);
}

CUresult API(cuMemcpyHtoD_v2)(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) {
    (void)ByteCount;
    return copy(dstDevice, (uint64_t)(uintptr_t)srcHost, NULL, 1);
}

CUresult API(cuMemcpyHtoD_v2_ptds)(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) {
    (void)ByteCount;
    return copy(dstDevice, (uint64_t)(uintptr_t)srcHost, NULL, 1);
}

CUresult API(cuMemcpyDtoH_v2)(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
    (void)ByteCount;
    return copy((uint64_t)(uintptr_t)dstHost, srcDevice, NULL, 1);
}

CUresult API(cuMemcpyDtoH_v2_ptds)(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
    (void)ByteCount;
    return copy((uint64_t)(uintptr_t)dstHost, srcDevice, NULL, 1);
}

CUresult API(cuMemcpyDtoD_v2)(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
    (void)ByteCount;
    return copy(dstDevice, srcDevice, NULL, 1);
}

CUresult API(cuMemcpyDtoD_v2_ptds)(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
    (void)ByteCount;
    return copy(dstDevice, srcDevice, NULL, 1);
}

CUresult API(cuMemcpyHtoDAsync_v2)(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream) {
    (void)ByteCount;
    return copy(dstDevice, (uint64_t)(uintptr_t)srcHost, hStream, 0);
}

CUresult API(cuMemcpyHtoDAsync_v2_ptsz)(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                                        CUstream hStream) {
    (void)ByteCount;
    return copy(dstDevice, (uint64_t)(uintptr_t)srcHost, hStream, 0);
}

CUresult API(cuMemcpyDtoHAsync_v2)(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
    (void)ByteCount;
    return copy((uint64_t)(uintptr_t)dstHost, srcDevice, hStream, 0);
}

CUresult API(cuMemcpyDtoHAsync_v2_ptsz)(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
    (void)ByteCount;
    return copy((uint64_t)(uintptr_t)dstHost, srcDevice, hStream, 0);
}

CUresult API(cuMemcpyDtoDAsync_v2)(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                   CUstream hStream) {
    (void)ByteCount;
    return copy(dstDevice, srcDevice, hStream, 0);
}

CUresult API(cuMemcpyDtoDAsync_v2_ptsz)(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                        CUstream hStream) {
    (void)ByteCount;
    return copy(dstDevice, srcDevice, hStream, 0);
}

CUresult API(cuMemsetD8_v2)(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
    (void)uc, (void)N;
    return copy(dstDevice, 1, NULL, 1);
}

CUresult API(cuMemsetD8_v2_ptds)(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
    (void)uc, (void)N;
    return copy(dstDevice, 1, NULL, 1);
}

CUresult API(cuMemsetD32_v2)(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
    (void)ui, (void)N;
    return copy(dstDevice, 1, NULL, 1);
}

CUresult API(cuMemsetD32_v2_ptds)(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
    (void)ui, (void)N;
    return copy(dstDevice, 1, NULL, 1);
}

CUresult API(cuMemsetD8Async)(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
    (void)uc, (void)N;
    return copy(dstDevice, 1, hStream, 0);
}

CUresult API(cuMemsetD8Async_ptsz)(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
    (void)uc, (void)N;
    return copy(dstDevice, 1, hStream, 0);
}

CUresult API(cuMemsetD32Async)(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
    (void)ui, (void)N;
    return copy(dstDevice, 1, hStream, 0);
}

CUresult API(cuMemsetD32Async_ptsz)(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream) {
    (void)ui, (void)N;
    return copy(dstDevice, 1, hStream, 0);
}

/* ----- memory -------------------------------------------------------------------------------- */

CUresult API(cuMemAlloc_v2)(CUdeviceptr *dptr, size_t bytesize) { return device_alloc(dptr, bytesize, BLOCK_DEVICE); }

CUresult API(cuMemAllocAsync)(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    (void)hStream;
    return device_alloc(dptr, bytesize, BLOCK_DEVICE);
}

CUresult API(cuMemAllocAsync_ptsz)(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    (void)hStream;
    return device_alloc(dptr, bytesize, BLOCK_DEVICE);
}

CUresult API(cuMemAllocManaged)(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    return device_alloc(dptr, bytesize, BLOCK_MANAGED);
}

CUresult API(cuMemAllocPitch_v2)(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                 unsigned int ElementSizeBytes) {
    REQUIRE_INIT();
    if (!pPitch || WidthInBytes == 0 || Height == 0 ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t pitch = round_up(WidthInBytes, FAKE_PITCH_ALIGN);
    if (Height > FAKE_DEVICE_MEMORY / pitch)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = device_alloc(dptr, pitch * Height, BLOCK_DEVICE);
    if (r == CUDA_SUCCESS)
        *pPitch = pitch;
    return r;
}

CUresult API(cuMemAllocHost_v2)(void **pp, size_t bytesize) {
    REQUIRE_INIT();
    if (!pp || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, bytesize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    int failed = table_insert(&host_blocks, (uint64_t)(uintptr_t)p, bytesize, BLOCK_HOST);
    pthread_mutex_unlock(&lock);
    if (failed) {
        munmap(p, bytesize);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult API(cuMemCreate)(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                          unsigned long long flags) {
    REQUIRE_INIT();
    if (!handle || !prop || flags != 0 || size == 0 || size % FAKE_GRANULE != 0 ||
        prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.id < 0 || prop->location.id >= FAKE_DEVICE_COUNT)
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = CUDA_SUCCESS;
    uint64_t h = 0;
    pthread_mutex_lock(&lock);
    if (device_bytes_in_use + size > FAKE_DEVICE_MEMORY) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        h = FAKE_HANDLE_BASE + next_handle * 0x40;
        if (table_insert(&handles, h, size, BLOCK_HANDLE) != 0) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            next_handle++;
            device_bytes_in_use += size;
        }
    }
    pthread_mutex_unlock(&lock);
    if (r == CUDA_SUCCESS)
        *handle = h;
    return r;
}

CUresult API(cuMemRelease)(CUmemGenericAllocationHandle handle) {
    REQUIRE_INIT();
    struct block b;
    pthread_mutex_lock(&lock);
    int found = table_remove(&handles, handle, &b) == 0;
    if (found)
        device_bytes_in_use -= b.size;
    pthread_mutex_unlock(&lock);
    return found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult API(cuMemFree_v2)(CUdeviceptr dptr) { return device_free(dptr); }

CUresult API(cuMemFreeAsync)(CUdeviceptr dptr, CUstream hStream) {
    (void)hStream;
    return device_free(dptr);
}

CUresult API(cuMemFreeAsync_ptsz)(CUdeviceptr dptr, CUstream hStream) {
    (void)hStream;
    return device_free(dptr);
}

CUresult API(cuMemFreeHost)(void *p) {
    REQUIRE_INIT();
    struct block b;
    pthread_mutex_lock(&lock);
    int found = table_remove(&host_blocks, (uint64_t)(uintptr_t)p, &b) == 0;
    pthread_mutex_unlock(&lock);
    if (!found)
        return CUDA_ERROR_INVALID_VALUE;
    munmap(p, b.size);
    return CUDA_SUCCESS;
}

/* ----- errors -------------------------------------------------------------------------------- */

static const struct {
    CUresult code;
    const char *name, *text;
} errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
};

CUresult API(cuGetErrorString)(CUresult error, const char **pStr) {
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == error) {
            *pStr = errors[i].text;
            return CUDA_SUCCESS;
        }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult API(cuGetErrorName)(CUresult error, const char **pStr) {
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == error) {
            *pStr = errors[i].name;
            return CUDA_SUCCESS;
        }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ----- cuGetProcAddress ---------------------------------------------------------------------- */

#ifdef FAKE_LIBCUDA_THUNK
/* The exported stubs (thunks.S); their addresses are what dlsym returns. */
#define X(name) extern void name(void);
FAKE_LIBCUDA_SYMBOLS(X)
#undef X
#else
/* Defined below the table. */
CUresult API(cuGetProcAddress)(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult API(cuGetProcAddress_v2)(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult *symbolStatus);
#endif

static const struct {
    const char *name;
    void *addr;
} exports[] = {
#define X(name) {#name, (void *)name},
    FAKE_LIBCUDA_SYMBOLS(X)
#undef X
};

static void *export_named(const char *name) {
    for (size_t i = 0; i < sizeof exports / sizeof exports[0]; i++)
        if (strcmp(exports[i].name, name) == 0)
            return exports[i].addr;
    return NULL;
}

/* `symbol` with `suffix` appended, looked up; NULL if absent or too long. */
static void *export_with_suffix(const char *symbol, const char *suffix) {
    char buf[128];
    size_t a = strlen(symbol), b = strlen(suffix);
    if (a + b >= sizeof buf)
        return NULL;
    memcpy(buf, symbol, a);
    memcpy(buf + a, suffix, b + 1);
    return export_named(buf);
}

static CUresult proc_address(const char *symbol, void **pfn, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus) {
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = NULL;
    /* The per-thread forms: `_ptsz` (asynchronous calls), `_ptds` (synchronous ones), after
     * `_v2` where the base name has one. */
    static const char *const per_thread[] = {"_ptsz", "_v2_ptsz", "_ptds", "_v2_ptds"};
    for (size_t i = 0; !p && (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && i < 4; i++)
        p = export_with_suffix(symbol, per_thread[i]);
    if (!p)
        p = export_with_suffix(symbol, "_v2");
    if (!p)
        p = export_named(symbol);
    *pfn = p;
    if (symbolStatus)
        *symbolStatus = p ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return p ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult API(cuGetProcAddress)(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    (void)cudaVersion;
    return proc_address(symbol, pfn, flags, NULL);
}

CUresult API(cuGetProcAddress_v2)(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult *symbolStatus) {
    (void)cudaVersion;
    return proc_address(symbol, pfn, flags, symbolStatus);
}
