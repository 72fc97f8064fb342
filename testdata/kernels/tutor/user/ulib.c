// ulib.c: the user program's start and its helpers (the system call
// stubs are in usys.S).
// Part of the tutor kernel, written for qemu-mcp's tests (see README.md).

#include "user/user.h"

// The kernel enters the user program here (trap.c's userinit), with sp
// at the top of the user stack and an empty frame chain.
void ustart(void)
{
	sh();
}

int strlen(const char *s)
{
	int n = 0;

	while (s[n])
		n++;
	return n;
}

int strcmp(const char *a, const char *b)
{
	while (*a && *a == *b)
		a++, b++;
	return (unsigned char)*a - (unsigned char)*b;
}

void print(const char *s)
{
	write(1, s, strlen(s));
}

void printlong(long n)
{
	char buf[24];
	int i = sizeof buf;
	unsigned long u = n < 0 ? -(unsigned long)n : n;

	do
		buf[--i] = '0' + u % 10;
	while ((u /= 10) != 0);
	if (n < 0)
		buf[--i] = '-';
	write(1, buf + i, sizeof buf - i);
}
