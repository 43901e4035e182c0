/*
 * The arm64 thunk variant's exported entry points, laid out like the real arm64 535 libcuda's
 * (libcuda1:arm64; ../shared/reference/platform-recipes.md, "arm64"): each exported symbol is a
 * stub
 *
 *     adrp  x9, fake_cuda_teardown                  # simulated by the kernel's uprobe decoder
 *     mov   w8, #0xba00
 *     movk  w8, #0x321c, lsl #16
 *     ldr   w9, [x9, :lo12:fake_cuda_teardown]
 *     cmp   w9, w8
 *     b.eq  1f
 *     adrp  x8, fake_cuda_slot_<name>
 *     ldr   x8, [x8, :lo12:fake_cuda_slot_<name>]
 *     mov   x16, x8
 *     br    x16
 * 1:  mov   w0, #4                                  # CUDA_ERROR_DEINITIALIZED
 *     ret
 *
 * and each slot is an 8-byte pointer in .data initialised to the hidden implementation
 * fake_impl_<name> (fake_libcuda.c), so the linked library carries one R_AARCH64_RELATIVE
 * relocation per slot, like the real library (no bti, no paciasp in the stubs, as there).
 */
#include "symbols.h"

    .macro FAKE_THUNK name
    .text
    .globl \name
    .type \name, %function
    .p2align 4
\name:
    adrp x9, fake_cuda_teardown
    mov w8, #0xba00
    movk w8, #0x321c, lsl #16
    ldr w9, [x9, :lo12:fake_cuda_teardown]
    cmp w9, w8
    b.eq 1f
    adrp x8, fake_cuda_slot_\name
    ldr x8, [x8, :lo12:fake_cuda_slot_\name]
    mov x16, x8
    br x16
1:
    mov w0, #4
    ret
    .size \name, . - \name

    .data
    .p2align 3
    .type fake_cuda_slot_\name, %object
    .size fake_cuda_slot_\name, 8
fake_cuda_slot_\name:
    .quad fake_impl_\name
    .endm

#define X(name) FAKE_THUNK name ;
FAKE_LIBCUDA_SYMBOLS(X)
#undef X

    .section .note.GNU-stack, "", %progbits
