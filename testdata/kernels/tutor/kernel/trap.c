// trap.c: traps (exceptions, interrupts, system calls) and the way into
// and out of the user program.
// Part of the tutor kernel, written for qemu-mcp's tests (see README.md).

#include "kernel/defs.h"
#include "kernel/riscv.h"

void kernelvec(void);               // vectors.S
void uservec(void);                 // vectors.S
void userret(struct trapframe *tf); // vectors.S
void ustart(void);                  // user/ulib.c
extern char ustacktop[];            // kernel.ld: the top of the user stack

// Timer ticks since boot, ten a second.
volatile unsigned long ticks;

// The kernel stack for traps from the user program; its trap frame sits
// at the top (uservec finds it through sscratch).
static char trapstack[KSTACK] __attribute__((aligned(16)));
#define TRAPFRAME ((struct trapframe *)(trapstack + KSTACK - sizeof(struct trapframe)))

void trapinithart(void)
{
	csr_write(stvec, kernelvec);
	csr_set(sstatus, SSTATUS_SUM); // S-mode may touch user pages (vm.c)
	if (cpuid() == 0) // hart 0 takes the ticks and the UART's interrupts
		csr_set(sie, SIE_SSIE | SIE_SEIE);
}

// clockintr counts a tick (on hart 0, whose M-mode timer raised it).
void clockintr(void)
{
	ticks++;
}

// devintr serves an interrupt; it returns 0 if scause is not one.
static int devintr(uint64 scause)
{
	if (scause == SCAUSE_SSI) {
		csr_clear(sip, SIP_SSIP);
		if (cpuid() == 0)
			clockintr();
		return 1;
	}
	if (scause == SCAUSE_SEI) {
		int irq = plic_claim();
		if (irq == UART0_IRQ)
			uartintr();
		else if (irq)
			printf("devintr: unexpected irq %d\n", irq);
		if (irq)
			plic_complete(irq);
		return 1;
	}
	return 0;
}

// A trap taken in S-mode, through kernelvec.
void kerneltrap(void)
{
	uint64 sepc = csr_read(sepc);
	uint64 sstatus = csr_read(sstatus);
	uint64 scause = csr_read(scause);

	if (!(sstatus & SSTATUS_SPP))
		panic("kerneltrap: not from S-mode");
	if (!devintr(scause)) {
		printf("scause=0x%lx sepc=0x%lx stval=0x%lx\n", scause, sepc, csr_read(stval));
		panic("kerneltrap");
	}
	// An interrupt handler may have trapped again and changed these.
	csr_write(sepc, sepc);
	csr_write(sstatus, sstatus);
}

// to_user gets the hart ready to return to the user program: traps
// come to uservec again, sret goes to U-mode with interrupts on.
static void to_user(void)
{
	intr_off();
	csr_write(stvec, uservec);
	csr_clear(sstatus, SSTATUS_SPP);
	csr_set(sstatus, SSTATUS_SPIE);
}

// A trap from the user program, through uservec; when this returns,
// uservec resumes the program from tf.
void usertrap(struct trapframe *tf)
{
	uint64 scause = csr_read(scause);

	csr_write(stvec, kernelvec);
	if (scause == SCAUSE_ECALL_U) {
		tf->epc += 4; // resume after the ecall
		syscall(tf);
	} else if (!devintr(scause)) {
		printf("usertrap: scause=0x%lx sepc=0x%lx stval=0x%lx\n", scause, tf->epc, csr_read(stval));
		panic("usertrap");
	}
	to_user();
}

// userinit starts the user program (the shell) at ustart() on its own
// stack, from an empty frame chain.
void userinit(void)
{
	struct trapframe *tf = TRAPFRAME;

	memset(tf, 0, sizeof *tf);
	tf->epc = (uint64)ustart;
	tf->sp = (uint64)ustacktop;
	tf->hartid = cpuid();
	to_user();
	userret(tf);
	panic("userret returned");
}
