/*
 * The thunk variant's exported entry points, laid out like the real 535 libcuda's (see
 * /work/shared/reference/nvidia-abi.md §6.4): each exported symbol is a 32-byte-aligned stub
 *
 *     cmpl  $0x321cba00, fake_cuda_teardown(%rip)   # 81 3d disp32 imm32: rip-relative, so a
 *     je    1f                                      #   uprobe here is single-stepped
 *     jmp   *fake_cuda_slot_<name>(%rip)            # ff 25 disp32
 *     (nop padding)
 * 1:  movl  $4, %eax                                # CUDA_ERROR_DEINITIALIZED
 *     ret
 *
 * and each slot is an 8-byte pointer in .data initialised to the hidden implementation
 * fake_impl_<name> (fake_libcuda.c), so the linked library carries one R_X86_64_RELATIVE
 * relocation per slot whose addend is the implementation's offset in the file.
 */
#include "symbols.h"

    .macro FAKE_THUNK name
    .text
    .globl \name
    .type \name, @function
    .p2align 5
\name:
    cmpl $0x321cba00, fake_cuda_teardown(%rip)
    je 1f
    jmp *fake_cuda_slot_\name(%rip)
    .p2align 3
1:
    movl $4, %eax
    ret
    .size \name, . - \name

    .data
    .p2align 3
    .type fake_cuda_slot_\name, @object
    .size fake_cuda_slot_\name, 8
fake_cuda_slot_\name:
    .quad fake_impl_\name
    .endm

#define X(name) FAKE_THUNK name ;
FAKE_LIBCUDA_SYMBOLS(X)
#undef X

    .section .note.GNU-stack, "", @progbits
