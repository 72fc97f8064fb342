// vm.c: the kernel's page table. One Sv39 table, built by hart 0 and
// used by every hart, maps physical memory and the devices at their own
// addresses (virtual = physical). The user program (user/) lives in the
// same address space, in pages that carry the U bit; the kernel's pages
// do not, so the user program cannot touch them. Page 0 is not mapped:
// a NULL pointer faults.
// Part of the tutor kernel, written for qemu-mcp's tests (see README.md).

#include "kernel/defs.h"
#include "kernel/riscv.h"

// Bounds of the parts of the image, from kernel/kernel.ld.
extern char etext[];   // end of the kernel's code; read-only data follows
extern char erodata[]; // end of that; the kernel's data and stacks follow
extern char utext[];   // the user program's code
extern char udata[];   // the user program's data and stack
extern char eudata[];  // end of the user program

// Page-table pages come from this pool (it is in .bss, so zeroed).
#define NPTPAGES 8
static uint64 ptpages[NPTPAGES][512] __attribute__((aligned(PGSIZE)));
static int nptpages;

static uint64 *kpagetable;

static uint64 *ptalloc(void)
{
	if (nptpages == NPTPAGES)
		panic("ptalloc: out of page-table pages");
	return ptpages[nptpages++];
}

// An Sv39 virtual address has three 9-bit page numbers, one per level
// (2 is the root), above the 12-bit offset in the page.
#define VPN(va, level) (((va) >> (12 + 9 * (level))) & 0x1ff)
#define PA2PTE(pa) (((uint64)(pa) >> 12) << 10)
#define PTE2PA(pte) (((pte) >> 10) << 12)

// walk returns the entry that maps va at level (0: a 4 KiB page, 1: a
// 2 MiB megapage), adding the tables on the way that are missing.
static uint64 *walk(uint64 va, int level)
{
	uint64 *pt = kpagetable;

	for (int l = 2; l > level; l--) {
		uint64 *pte = &pt[VPN(va, l)];
		if (!(*pte & PTE_V))
			*pte = PA2PTE(ptalloc()) | PTE_V;
		else if (*pte & (PTE_R | PTE_W | PTE_X))
			panic("walk: inside a megapage");
		pt = (uint64 *)PTE2PA(*pte);
	}
	return &pt[VPN(va, level)];
}

// map maps [start, end) to itself with permissions perm, in megapages
// where the range allows. The accessed and dirty bits are set up front:
// the hardware need not set them (it may fault instead).
static void map(uint64 start, uint64 end, uint64 perm)
{
	uint64 a = start;

	while (a < end) {
		int level = (a % MEGAPAGE == 0 && end - a >= MEGAPAGE) ? 1 : 0;
		uint64 *pte = walk(a, level);
		if (*pte & PTE_V)
			panic("map: already mapped");
		*pte = PA2PTE(a) | perm | PTE_A | PTE_D | PTE_V;
		a += level ? MEGAPAGE : PGSIZE;
	}
}

void kvminit(void)
{
	kpagetable = ptalloc();
	map(TESTDEV, TESTDEV + PGSIZE, PTE_R | PTE_W);
	map(PLIC, PLIC + PLIC_SIZE, PTE_R | PTE_W);
	map(UART0, UART0 + PGSIZE, PTE_R | PTE_W);
	map(VIRTIO0, VIRTIO0 + PGSIZE, PTE_R | PTE_W);
	map(RAMBASE, (uint64)etext, PTE_R | PTE_X);
	map((uint64)etext, (uint64)erodata, PTE_R);
	map((uint64)erodata, (uint64)utext, PTE_R | PTE_W);
	map((uint64)utext, (uint64)udata, PTE_R | PTE_X | PTE_U);
	map((uint64)udata, (uint64)eudata, PTE_R | PTE_W | PTE_U);
	map((uint64)eudata, RAMTOP, PTE_R | PTE_W); // the rest of RAM
}

// kvminithart turns paging on for this hart.
void kvminithart(void)
{
	asm volatile("sfence.vma zero, zero");
	csr_write(satp, SATP_SV39 | ((uint64)kpagetable >> 12));
	asm volatile("sfence.vma zero, zero");
}

// userrange reports whether [addr, addr+n) lies in the user program's
// memory, where a system call may read for it, or write if write is set
// (the user's code is read-only).
static int userrange(uint64 addr, uint64 n, int write)
{
	uint64 lo = write ? (uint64)udata : (uint64)utext;

	return addr >= lo && addr <= (uint64)eudata && n <= (uint64)eudata - addr;
}

// copyout copies n bytes from the kernel's src to the user program's
// dst; -1 if that is not the user's writable memory. The kernel touches
// the user's pages only here and in copyin. (S-mode may, since
// trapinithart sets sstatus.SUM: it stays set so that a debugger, whose
// reads QEMU translates as the hart would, sees the user's memory too.)
int copyout(uint64 dst, const void *src, uint64 n)
{
	if (!userrange(dst, n, 1))
		return -1;
	memmove((void *)dst, src, n);
	return 0;
}

// copyin copies n bytes from the user program's src to the kernel's dst;
// -1 if that is not the user's memory.
int copyin(void *dst, uint64 src, uint64 n)
{
	if (!userrange(src, n, 0))
		return -1;
	memmove(dst, (void *)src, n);
	return 0;
}
