// riscv.h: access to the RISC-V control and status registers (CSRs) and
// the few bits of them this kernel uses.
// Part of the tutor kernel, written for qemu-mcp's tests (see README.md).

#define csr_read(csr) ({ unsigned long __v; \
	asm volatile("csrr %0, " #csr : "=r"(__v)); __v; })
#define csr_write(csr, v) asm volatile("csrw " #csr ", %0" : : "r"((unsigned long)(v)))
#define csr_set(csr, bits) asm volatile("csrs " #csr ", %0" : : "r"((unsigned long)(bits)))
#define csr_clear(csr, bits) asm volatile("csrc " #csr ", %0" : : "r"((unsigned long)(bits)))

// mstatus: the mode mret returns to (MPP).
#define MSTATUS_MPP_MASK (3L << 11)
#define MSTATUS_MPP_S (1L << 11)

// mie: machine timer interrupt enable.
#define MIE_MTIE (1L << 7)

// sstatus
#define SSTATUS_SIE (1L << 1)  // interrupts enabled in S-mode
#define SSTATUS_SPIE (1L << 5) // SIE before the trap; sret restores it
#define SSTATUS_SPP (1L << 8)  // the mode the trap came from: 1 = S, 0 = U
#define SSTATUS_SUM (1L << 18) // S-mode may touch pages with the U bit

// sie / sip: supervisor software and external interrupts.
#define SIE_SSIE (1L << 1)
#define SIE_SEIE (1L << 9)
#define SIP_SSIP (1L << 1)

// scause values this kernel handles. Interrupts have the top bit set.
#define SCAUSE_INTR (1UL << 63)
#define SCAUSE_SSI (SCAUSE_INTR | 1) // supervisor software: a timer tick
#define SCAUSE_SEI (SCAUSE_INTR | 9) // supervisor external: the PLIC
#define SCAUSE_ECALL_U 8             // ecall from user mode

static inline void intr_on(void) { csr_set(sstatus, SSTATUS_SIE); }
static inline void intr_off(void) { csr_clear(sstatus, SSTATUS_SIE); }

// cpuid is this hart's number; start() put it in tp, which only the
// kernel uses (the user trap vector reloads it).
static inline int cpuid(void)
{
	unsigned long id;
	asm volatile("mv %0, tp" : "=r"(id));
	return id;
}

// Sv39 page-table entries.
#define PGSIZE 4096L
#define MEGAPAGE (512 * PGSIZE)
#define PTE_V (1L << 0)
#define PTE_R (1L << 1)
#define PTE_W (1L << 2)
#define PTE_X (1L << 3)
#define PTE_U (1L << 4)
#define PTE_A (1L << 6)
#define PTE_D (1L << 7)
#define SATP_SV39 (8L << 60)
