// start.c: machine-mode set-up, run by every hart before main().
// Part of the tutor kernel, written for qemu-mcp's tests (see README.md).

#include "kernel/defs.h"
#include "kernel/riscv.h"

void main(void);
void timervec(void);

#define TICK_INTERVAL 1000000 // CLINT cycles: 100 ms at 10 MHz

// timervec's (vectors.S) scratch area: three save slots, the address of
// mtimecmp, the interval.
static uint64 timer_scratch[5];

volatile int harts; // how many harts reached start()

// The machine timer, on hart 0 only: interrupt TICK_INTERVAL from now,
// handled by timervec in M-mode.
static void timerinit(void)
{
	volatile uint64 *mtimecmp = (uint64 *)CLINT_MTIMECMP(0);

	*mtimecmp = *(volatile uint64 *)CLINT_MTIME + TICK_INTERVAL;
	timer_scratch[3] = (uint64)mtimecmp;
	timer_scratch[4] = TICK_INTERVAL;
	csr_write(mscratch, timer_scratch);
	csr_write(mtvec, timervec);
	// M-mode interrupts are always on while the hart runs in S or U
	// mode; mstatus.MIE only matters in M-mode, and stays off here.
	csr_set(mie, MIE_MTIE);
}

// start runs in M-mode on the hart's own stack (entry.S). It prepares
// the mret into main() in S-mode, which entry.S does when this returns.
void start(void)
{
	uint64 hart = csr_read(mhartid);
	uint64 ms = csr_read(mstatus);

	csr_write(mstatus, (ms & ~MSTATUS_MPP_MASK) | MSTATUS_MPP_S);
	csr_write(mepc, main);
	csr_write(satp, 0); // no paging until main() turns it on

	// Every exception and interrupt that can be is handled in S-mode.
	csr_write(medeleg, 0xffff);
	csr_write(mideleg, 0xffff);

	// Without a PMP entry S-mode may touch no memory at all: one
	// top-of-range entry (pmpcfg A=TOR, R, W, X) opens all of it.
	csr_write(pmpaddr0, 0x3fffffffffffffUL);
	csr_write(pmpcfg0, 0xf);

	if (hart == 0)
		timerinit();

	asm volatile("mv tp, %0" : : "r"(hart)); // cpuid()
	__sync_fetch_and_add(&harts, 1);
}
