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

// nharts is how many harts the machine has (at most NCPU), from the
// device tree; 0 if there was none to read. Hart 0 sets it in start().
int nharts;

static uint32 be32(const uint8 *p)
{
	return (uint32)p[0] << 24 | (uint32)p[1] << 16 | (uint32)p[2] << 8 | p[3];
}

// cpus counts the nodes /cpus/cpu@N of the flattened device tree at fdt,
// which QEMU passes every hart in a1: 0 if fdt is not one.
static int cpus(const uint8 *fdt)
{
	if (fdt == 0 || be32(fdt) != 0xd00dfeed)
		return 0;
	const uint8 *p = fdt + be32(fdt + 8); // the structure block
	int depth = 0, incpus = 0, n = 0;
	for (;;) {
		uint32 token = be32(p);
		p += 4;
		if (token == 1) { // a node begins: its name, NUL-ended, padded to 4
			const char *name = (const char *)p;
			int len = 0;
			while (name[len])
				len++;
			depth++;
			if (depth == 2)
				incpus = len == 4 && name[0] == 'c' && name[1] == 'p' && name[2] == 'u' && name[3] == 's';
			else if (depth == 3 && incpus && len > 4 && name[0] == 'c' && name[1] == 'p' && name[2] == 'u' && name[3] == '@')
				n++;
			p += (len + 4) & ~3;
		} else if (token == 2) { // the node ends
			depth--;
		} else if (token == 3) { // a property: its length, name, value
			p += 8 + ((be32(p) + 3) & ~3);
		} else if (token != 4) { // the end (9), or not a device tree
			return n;
		}
	}
}

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
// entry.S passes it the hart's id and the device tree's address.
void start(uint64 hart, const uint8 *fdt)
{
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

	if (hart == 0) {
		int n = cpus(fdt);
		nharts = n < NCPU ? n : NCPU;
		timerinit();
	}

	asm volatile("mv tp, %0" : : "r"(hart)); // cpuid()
	__sync_fetch_and_add(&harts, 1);
}
