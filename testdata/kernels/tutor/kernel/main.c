// main.c: the S-mode start of every hart.
// Part of the tutor kernel, written for qemu-mcp's tests (see README.md).

#include "kernel/defs.h"
#include "kernel/riscv.h"

// Each hart's stack (entry.S points sp at the top of its slice).
char stacks[NCPU * KSTACK] __attribute__((aligned(16)));

extern volatile int harts; // start.c
extern int nharts;         // start.c

// The hart whose turn it is to turn paging on and say it started: the
// harts go in order 0, 1, 2, ..., so the console shows their lines in
// that order, before the shell's first prompt.
static volatile int turn;

void main(void)
{
	int hart = cpuid();

	if (hart == 0) {
		uartinit();
		printf("tutor kernel 1.0 booting\n");
		kvminit();
		kvminithart();
		trapinithart();
		plicinit();
		virtio_disk_init();
		fsinit();
	}
	while (turn != hart)
		;
	__sync_synchronize();
	if (hart != 0) {
		kvminithart();
		trapinithart();
	}
	printf("hart %d starting\n", hart);
	__sync_synchronize();
	turn = hart + 1;

	if (hart != 0) {
		// Nothing to do: no interrupt is enabled on this hart, so it
		// sleeps in wfi.
		for (;;)
			asm volatile("wfi");
	}
	// Every hart the machine has, not only those that reached start()
	// by now: QEMU may run a hart's first instruction late (its thread
	// waits for a loaded host), and its line still comes before the
	// prompt. Without a device tree, the harts that came.
	while (turn != (nharts > 0 ? nharts : harts))
		;
	userinit();
}
