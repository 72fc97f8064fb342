# entry.S: where every hart starts, in M-mode at 0x80000000 (QEMU's
# -bios none jumps here with a0 = the hart's id, a1 = the device tree's
# address; start() takes both).
# Part of the tutor kernel, written for qemu-mcp's tests (see README.md).

        .section .text.entry
        .globl _entry
_entry:
        csrr a0, mhartid
        li t0, 8                # NCPU
        bgeu a0, t0, park
        # sp = stacks + (hartid + 1) * KSTACK: the top of this hart's stack
        la sp, stacks
        li t0, 8192             # KSTACK
        addi t1, a0, 1
        mul t0, t0, t1
        add sp, sp, t0
        # An empty frame chain: a backtrace ends at the bottom frame.
        li ra, 0
        li s0, 0
        call start
        # start() set mepc = main and mstatus.MPP = S: mret enters main()
        # in S-mode on the same stack, again with an empty frame chain.
        li ra, 0
        li s0, 0
        mret
park:
        wfi
        j park
