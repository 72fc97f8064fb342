// plic.c: the platform-level interrupt controller, which routes the
// UART's interrupt to hart 0 in S-mode.
// Part of the tutor kernel, written for qemu-mcp's tests (see README.md).

#include "kernel/defs.h"

#define PLIC_PRIORITY(irq) (PLIC + 4 * (irq))
#define PLIC_SENABLE_HART0 (PLIC + 0x2080)     // context 1: hart 0, S-mode
#define PLIC_STHRESHOLD_HART0 (PLIC + 0x201000) // its priority threshold
#define PLIC_SCLAIM_HART0 (PLIC + 0x201004)     // its claim/complete

#define Reg(a) (*(volatile uint32 *)(a))

void plicinit(void)
{
	Reg(PLIC_PRIORITY(UART0_IRQ)) = 1;
	Reg(PLIC_SENABLE_HART0) = 1 << UART0_IRQ;
	Reg(PLIC_STHRESHOLD_HART0) = 0;
}

// plic_claim returns the interrupt to serve (0: none).
int plic_claim(void)
{
	return Reg(PLIC_SCLAIM_HART0);
}

// plic_complete tells the PLIC the interrupt was served.
void plic_complete(int irq)
{
	Reg(PLIC_SCLAIM_HART0) = irq;
}
