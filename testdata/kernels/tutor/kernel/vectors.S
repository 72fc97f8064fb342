# vectors.S: the trap vectors.
#   timervec  M-mode: the machine timer (hart 0 only)
#   kernelvec S-mode: a trap taken while the kernel runs
#   uservec   S-mode: a trap taken while the user program runs
#   userret   back to the user program from a trap frame
# Part of the tutor kernel, written for qemu-mcp's tests (see README.md).

        .section .text

# The machine timer interrupt cannot be delegated to S-mode. timervec
# schedules the next one and raises a supervisor software interrupt,
# which the S-mode handler (trap.c) counts as a tick. mscratch points to
# start.c's timer_scratch: three save slots, &mtimecmp, the interval.
        .globl timervec
        .align 4
timervec:
        csrrw a0, mscratch, a0
        sd a1, 0(a0)
        sd a2, 8(a0)
        sd a3, 16(a0)
        ld a1, 24(a0)           # &mtimecmp
        ld a2, 32(a0)           # interval
        ld a3, 0(a1)
        add a3, a3, a2
        sd a3, 0(a1)            # mtimecmp += interval
        li a1, 2
        csrs mip, a1            # SSIP
        ld a3, 16(a0)
        ld a2, 8(a0)
        ld a1, 0(a0)
        csrrw a0, mscratch, a0
        mret

# A trap in S-mode (an interrupt while the kernel waits in wfi, or a
# kernel bug): save the registers a C function may change on the current
# stack, call kerneltrap(), restore them and return to sepc. The top two
# slots form a frame record (sepc as the return address, the interrupted
# s0 as the caller's frame pointer), so a backtrace from kerneltrap goes
# on into the interrupted function.
        .globl kernelvec
        .align 4
kernelvec:
        addi sp, sp, -144
        sd ra, 0(sp)
        sd t0, 8(sp)
        sd t1, 16(sp)
        sd t2, 24(sp)
        sd a0, 32(sp)
        sd a1, 40(sp)
        sd a2, 48(sp)
        sd a3, 56(sp)
        sd a4, 64(sp)
        sd a5, 72(sp)
        sd a6, 80(sp)
        sd a7, 88(sp)
        sd t3, 96(sp)
        sd t4, 104(sp)
        sd t5, 112(sp)
        sd t6, 120(sp)
        csrr ra, sepc
        sd ra, 136(sp)
        sd s0, 128(sp)
        addi s0, sp, 144

        call kerneltrap

        ld s0, 128(sp)
        ld ra, 0(sp)
        ld t0, 8(sp)
        ld t1, 16(sp)
        ld t2, 24(sp)
        ld a0, 32(sp)
        ld a1, 40(sp)
        ld a2, 48(sp)
        ld a3, 56(sp)
        ld a4, 64(sp)
        ld a5, 72(sp)
        ld a6, 80(sp)
        ld a7, 88(sp)
        ld t3, 96(sp)
        ld t4, 104(sp)
        ld t5, 112(sp)
        ld t6, 120(sp)
        addi sp, sp, 144
        sret

# A trap from U-mode. While the user program runs, sscratch holds the
# address of its trap frame (struct trapframe in defs.h), which sits at
# the top of the kernel's trap stack: swapping sp with sscratch switches
# to the kernel stack. Save every user register there, call
# usertrap(tf), and fall through to userret.
        .globl uservec
        .align 4
uservec:
        csrrw sp, sscratch, sp  # sp = trap frame, sscratch = user sp
        .irp n,1,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
        sd x\n, (\n-1)*8(sp)
        .endr
        csrr t0, sscratch
        sd t0, 8(sp)            # the user sp
        csrr ra, sepc
        sd ra, 248(sp)          # tf->epc
        ld tp, 256(sp)          # tf->hartid: the kernel's tp
        # Two frame records below the trap frame (tf), so that a
        # backtrace from usertrap goes on into the user program:
        #   fp = tf-16: [tf-24] the user pc (sepc), [tf-32] the next fp, tf
        #   fp = tf:    [tf-8] the user's ra,       [tf-16] the user's s0
        # The frame pointers climb: the user's stack lies above the
        # kernel's. This is exact for a trap at a system call stub
        # (user/usys.S), which has no frame: its caller's return address
        # is still in ra. The last "sd ra" and "sd s0" here are those of
        # the first record, as for a debugger that reads this as a
        # function's prologue.
        addi sp, sp, -32
        ld t0, 32+0(sp)         # tf->ra
        sd t0, 24(sp)
        ld t0, 32+56(sp)        # tf->s0
        sd t0, 16(sp)
        sd ra, 8(sp)            # sepc
        addi s0, sp, 32
        sd s0, 0(sp)
        addi s0, sp, 16         # the frame pointer for usertrap
        addi a0, sp, 32         # the trap frame
        call usertrap
        addi a0, sp, 32

# userret(tf): load the user registers from trap frame tf and sret to
# tf->epc. sstatus (SPP = user, SPIE) and stvec are set by the caller.
        .globl userret
userret:
        mv sp, a0
        ld t0, 248(sp)
        csrw sepc, t0
        ld t0, 8(sp)
        csrw sscratch, t0       # the user sp, for the swap below
        .irp n,1,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
        ld x\n, (\n-1)*8(sp)
        .endr
        csrrw sp, sscratch, sp  # sp = user sp, sscratch = trap frame
        sret
