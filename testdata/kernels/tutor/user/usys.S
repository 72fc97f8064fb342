# usys.S: the system call stubs. Each puts its number in a7 (the
# arguments are already in a0..a3) and traps with ecall; the result comes
# back in a0. A stub has no frame of its own: when the kernel is entered,
# ra still holds the return address into the stub's caller, which uservec
# (kernel/vectors.S) saves in a frame record.
# Part of the tutor kernel, written for qemu-mcp's tests (see README.md).

#include "kernel/syscall.h"

        .section .text

.macro stub name, num
        .globl \name
\name:
        li a7, \num
        ecall
        ret
.endm

        stub read, SYS_read
        stub write, SYS_write
        stub ls, SYS_ls
        stub cat, SYS_cat
        stub getticks, SYS_ticks

        .globl halt
halt:
        li a7, SYS_halt
        ecall
1:      j 1b                    # it does not come back
