// syscall.c: the system calls. The user program's ecall reaches
// syscall() through uservec and usertrap(); the number is in a7, the
// arguments in a0..a3, and the result goes back in a0.
// Part of the tutor kernel, written for qemu-mcp's tests (see README.md).

#include "kernel/defs.h"
#include "kernel/syscall.h"

// Each system call is a function of its own (never inlined), so that a
// breakpoint or a backtrace shows it by name.
#define SYSCALL __attribute__((noinline))

// User addresses arrive as numbers: the kernel reads and writes the
// user program's memory only through copyin and copyout (vm.c), which
// check them.

// read(0, buf, n): wait for console input, return up to n bytes of it.
SYSCALL long sys_read(long fd, uint64 buf, long n)
{
	if (fd != 0 || n < 0)
		return -1;
	return consoleread(buf, n);
}

// write(1 or 2, buf, n): write n bytes to the console.
SYSCALL long sys_write(long fd, uint64 buf, long n)
{
	char chunk[64];

	if ((fd != 1 && fd != 2) || n < 0)
		return -1;
	for (long done = 0; done < n; done += sizeof chunk) {
		long m = n - done < sizeof chunk ? n - done : sizeof chunk;
		if (copyin(chunk, buf + done, m) < 0)
			return -1;
		consolewrite(chunk, m);
	}
	return n;
}

// ls(i, e): fill in e for the i-th file of the disk; -1 past the last.
SYSCALL long sys_ls(long i, uint64 e)
{
	struct lsent k;

	if (fsstat(i, &k) < 0)
		return -1;
	return copyout(e, &k, sizeof k);
}

// cat(name, off, buf, n): copy up to n bytes of file name, from byte
// off, to buf; return how many (0 at the end), -1 if there is no such
// file.
SYSCALL long sys_cat(uint64 uname, long off, uint64 buf, long n)
{
	char name[LSNAME];
	int i;

	for (i = 0; i < LSNAME; i++) {
		if (copyin(&name[i], uname + i, 1) < 0)
			return -1;
		if (name[i] == '\0')
			break;
	}
	if (i == LSNAME || off < 0 || n < 0)
		return -1;
	return fsread(name, off, buf, n);
}

// ticks(): timer ticks since boot. The return line is indented with two
// spaces on purpose, the only line of this file like it: a qemu-mcp test
// finds it and plants a NULL store before it.
SYSCALL long sys_ticks(void)
{
  return ticks;
}

// halt(): power off through QEMU's sifive_test device.
SYSCALL long sys_halt(void)
{
	printf("halt: powering off\n");
	*(volatile uint32 *)TESTDEV = 0x5555;
	for (;;)
		;
}

void syscall(struct trapframe *tf)
{
	long r;

	switch (tf->a7) {
	case SYS_read:
		r = sys_read(tf->a0, tf->a1, tf->a2);
		break;
	case SYS_write:
		r = sys_write(tf->a0, tf->a1, tf->a2);
		break;
	case SYS_ls:
		r = sys_ls(tf->a0, tf->a1);
		break;
	case SYS_cat:
		r = sys_cat(tf->a0, tf->a1, tf->a2, tf->a3);
		break;
	case SYS_ticks:
		r = sys_ticks();
		break;
	case SYS_halt:
		r = sys_halt();
		break;
	default:
		printf("syscall: unknown system call %ld\n", tf->a7);
		r = -1;
	}
	tf->a0 = r;
}
