// syscall.h: system call numbers, shared by the kernel and user/ulib.c.
// A user program puts the number in a7, the arguments in a0..a3, and
// executes ecall; the result comes back in a0 (-1 on error).
// Part of the tutor kernel, written for qemu-mcp's tests (see README.md).

#define SYS_read 1  // read(fd 0, buf, n): console input, waits for a byte
#define SYS_write 2 // write(fd 1 or 2, buf, n): console output
#define SYS_ls 3    // ls(i, struct lsent *): the i-th file of the disk
#define SYS_cat 4   // cat(name, off, buf, n): bytes of a file from off
#define SYS_ticks 5 // ticks(): timer ticks since boot (10 a second)
#define SYS_halt 6  // halt(): power the machine off

#ifndef __ASSEMBLER__
#define LSNAME 24

// What ls() fills in.
struct lsent {
	char name[LSNAME];
	unsigned long size;
};
#endif
