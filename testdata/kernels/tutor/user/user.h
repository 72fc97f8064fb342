// user.h: what the user program has: the system calls (user/usys.S
// makes them) and a few helpers. No C library: the user program is
// linked into the kernel's image (see kernel/kernel.ld) and calls
// nothing outside user/.
// Part of the tutor kernel, written for qemu-mcp's tests (see README.md).

#include "kernel/syscall.h"

// System calls (kernel/syscall.h says what each does).
long read(int fd, char *buf, long n);
long write(int fd, const char *buf, long n);
long ls(int i, struct lsent *e);
long cat(const char *name, long off, char *buf, long n);
long getticks(void);
void halt(void) __attribute__((noreturn));

// Helpers.
int strlen(const char *s);
int strcmp(const char *a, const char *b);
void print(const char *s);
void printlong(long n);

// The shell (user/sh.c), which ustart() runs.
void sh(void) __attribute__((noreturn));
