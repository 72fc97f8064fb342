// console.c: the 16550 UART, console input, printf and panic, and the
// memory functions the compiler may call.
// Part of the tutor kernel, written for qemu-mcp's tests (see README.md).

#include <stdarg.h>

#include "kernel/defs.h"
#include "kernel/riscv.h"

// UART registers (one byte each).
#define RHR 0 // receive holding (read)
#define THR 0 // transmit holding (write)
#define IER 1 // interrupt enable; with LCR_DLAB: divisor high byte
#define FCR 2 // FIFO control
#define LCR 3 // line control
#define LSR 5 // line status
#define LCR_8N1 0x03
#define LCR_DLAB 0x80
#define LSR_RX_READY 0x01
#define LSR_TX_IDLE 0x20

#define Reg(r) ((volatile uint8 *)(UART0 + (r)))

void uartinit(void)
{
	*Reg(IER) = 0;
	*Reg(LCR) = LCR_DLAB; // set the baud rate divisor: 38400
	*Reg(0) = 3;
	*Reg(1) = 0;
	*Reg(LCR) = LCR_8N1;
	// The FIFOs stay off: turning them on empties them, and a byte
	// typed before now would be lost.
	*Reg(FCR) = 0;
	*Reg(IER) = 0x01; // interrupt when a byte arrives
}

// Output is polled: wait until the transmitter takes another byte.
static void uartputc(int c)
{
	while ((*Reg(LSR) & LSR_TX_IDLE) == 0)
		;
	*Reg(THR) = c;
}

// The console turns "\n" into "\r\n" for the terminal.
static void consputc(int c)
{
	if (c == '\n')
		uartputc('\r');
	uartputc(c);
}

// Input: uartintr() (from the PLIC's interrupt, on hart 0) moves the
// received bytes into this ring; consoleread() takes them out.
#define INBUF 128
static struct {
	char buf[INBUF];
	volatile uint32 r, w; // read and write counts
} in;

void uartintr(void)
{
	while (*Reg(LSR) & LSR_RX_READY) {
		int c = *Reg(RHR);
		if (in.w - in.r < INBUF) // drop what does not fit
			in.buf[in.w++ % INBUF] = c;
	}
}

// consoleread waits for input and copies up to n bytes of it to the
// user program's udst. It runs with interrupts off (in a system call):
// wfi stops the hart until an interrupt enabled in sie is pending, even
// with sstatus.SIE off, so none can slip in between the test and the
// wfi. The short window with SIE on lets the trap handler take it: a
// typed byte, or a tick. (Interrupts come only here, and kernelvec's
// frame record leads a backtrace on into this function.)
long consoleread(uint64 udst, long n)
{
	long i;

	while (in.r == in.w) {
		asm volatile("wfi");
		intr_on();
		intr_off();
	}
	for (i = 0; i < n && in.r != in.w; i++) {
		char c = in.buf[in.r++ % INBUF];
		if (copyout(udst + i, &c, 1) < 0)
			return -1;
	}
	return i;
}

// printf, and console output, holds this lock so that the lines of the
// harts do not mix. panic() does not wait for it.
static volatile int printlock;
static volatile int panicking;

static void lock(void)
{
	if (panicking)
		return;
	while (__sync_lock_test_and_set(&printlock, 1))
		;
}

static void unlock(void)
{
	if (!panicking)
		__sync_lock_release(&printlock);
}

void consolewrite(const char *src, long n)
{
	lock();
	for (long i = 0; i < n; i++)
		consputc(src[i]);
	unlock();
}

static void printnum(uint64 x, int base, int neg)
{
	char buf[24];
	int i = 0;

	do
		buf[i++] = "0123456789abcdef"[x % base];
	while ((x /= base) != 0);
	if (neg)
		buf[i++] = '-';
	while (i > 0)
		consputc(buf[--i]);
}

// printf knows %d, %u, %x (each with an l for long), %p, %s, %c and %%.
void printf(const char *fmt, ...)
{
	va_list ap;
	const char *s;

	lock();
	va_start(ap, fmt);
	for (; *fmt; fmt++) {
		if (*fmt != '%') {
			consputc(*fmt);
			continue;
		}
		int islong = 0;
		if (*++fmt == 'l') {
			islong = 1;
			fmt++;
		}
		long d;
		switch (*fmt) {
		case 'd':
			d = islong ? va_arg(ap, long) : va_arg(ap, int);
			printnum(d < 0 ? -(uint64)d : d, 10, d < 0);
			break;
		case 'u':
			printnum(islong ? va_arg(ap, uint64) : va_arg(ap, uint32), 10, 0);
			break;
		case 'x':
			printnum(islong ? va_arg(ap, uint64) : va_arg(ap, uint32), 16, 0);
			break;
		case 'p':
			consputc('0');
			consputc('x');
			printnum((uint64)va_arg(ap, void *), 16, 0);
			break;
		case 's':
			for (s = va_arg(ap, const char *); s && *s; s++)
				consputc(*s);
			break;
		case 'c':
			consputc(va_arg(ap, int));
			break;
		case '\0':
			fmt--;
			break;
		default:
			consputc('%');
			consputc(*fmt);
		}
	}
	va_end(ap);
	unlock();
}

// panic reports a fatal error and stops this hart: it spins with
// interrupts off for good. The other harts go on idling.
void panic(const char *s)
{
	intr_off();
	panicking = 1;
	printf("panic: %s\n", s);
	for (;;)
		;
}

void *memset(void *dst, int c, unsigned long n)
{
	char *d = dst;

	while (n-- > 0)
		*d++ = c;
	return dst;
}

void *memmove(void *dst, const void *src, unsigned long n)
{
	const char *s = src;
	char *d = dst;

	if (s < d && s + n > d) { // overlapping, copy from the end
		while (n-- > 0)
			d[n] = s[n];
	} else {
		while (n-- > 0)
			*d++ = *s++;
	}
	return dst;
}

void *memcpy(void *dst, const void *src, unsigned long n)
{
	return memmove(dst, src, n);
}
