// defs.h: types, QEMU virt's memory map, and the kernel's functions.
// Part of the tutor kernel, written for qemu-mcp's tests (see README.md).

typedef unsigned char uint8;
typedef unsigned short uint16;
typedef unsigned int uint32;
typedef unsigned long uint64;

#define NCPU 8      // harts beyond this park in entry.S
#define KSTACK 8192 // each hart's stack

// Physical addresses of QEMU's virt machine. The kernel maps them at the
// same virtual addresses (see vm.c).
#define TESTDEV 0x00100000L // sifive_test: write 0x5555 to power off
#define CLINT 0x02000000L   // core-local interruptor: the machine timer
#define CLINT_MTIMECMP(hart) (CLINT + 0x4000 + 8 * (hart))
#define CLINT_MTIME (CLINT + 0xbff8) // counts at 10 MHz
#define PLIC 0x0c000000L             // platform-level interrupt controller
#define PLIC_SIZE 0x400000L
#define UART0 0x10000000L // 16550 UART
#define UART0_IRQ 10
#define VIRTIO0 0x10001000L // the first virtio-mmio slot
#define RAMBASE 0x80000000L
#define RAMTOP (RAMBASE + 128 * 1024 * 1024L) // -m 128M

// The user registers, saved by uservec (vectors.S) when the user program
// traps into the kernel. The offsets are vectors.S's: x1..x31 at
// (n-1)*8, then epc at 248 and the kernel's hart id at 256.
struct trapframe {
	uint64 ra, sp, gp, tp, t0, t1, t2, s0, s1;
	uint64 a0, a1, a2, a3, a4, a5, a6, a7;
	uint64 s2, s3, s4, s5, s6, s7, s8, s9, s10, s11;
	uint64 t3, t4, t5, t6;
	uint64 epc;    // the user pc to return to
	uint64 hartid; // tp for the kernel
	uint64 pad;    // keeps the size a multiple of 16 (it tops a stack)
};

// console.c
void uartinit(void);
void uartintr(void);
long consoleread(uint64 udst, long n);
void consolewrite(const char *src, long n);
void printf(const char *fmt, ...);
void panic(const char *s) __attribute__((noreturn));
void *memset(void *dst, int c, unsigned long n);
void *memmove(void *dst, const void *src, unsigned long n);
void *memcpy(void *dst, const void *src, unsigned long n);

// vm.c
void kvminit(void);
void kvminithart(void);
int copyout(uint64 dst, const void *src, uint64 n);
int copyin(void *dst, uint64 src, uint64 n);

// plic.c
void plicinit(void);
int plic_claim(void);
void plic_complete(int irq);

// trap.c
extern volatile unsigned long ticks;
void trapinithart(void);
void clockintr(void);
void userinit(void) __attribute__((noreturn));

// syscall.c
void syscall(struct trapframe *tf);

// virtio_disk.c
void virtio_disk_init(void);
void virtio_disk_read(uint64 sector, void *buf);

// fs.c
struct lsent;
void fsinit(void);
int fsstat(int i, struct lsent *e);
long fsread(const char *name, uint64 off, uint64 udst, uint64 n);
