/*
 * qemu-mcp tiny kernel for x86_64: the riscv64 tiny kernel's shell
 * (../tiny/kernel.S), for qemu-system-x86_64 booted with -kernel (q35, pc
 * or microvm). It runs the same line-oriented shell on the 16550 UART at
 * I/O port 0x3f8 (COM1, polled) and powers QEMU off through ACPI.
 *
 * tiny-x86_64.elf is an ELF64 (EM_X86_64) with a PVH entry note
 * (XEN_ELFNOTE_PHYS32_ENTRY): QEMU's -kernel loads such an ELF at its
 * physical addresses (link address 1 MiB) and its pvh.bin option ROM (run
 * by SeaBIOS, or qboot on microvm) enters pvh_start in 32-bit protected
 * mode, paging off, with ebx = the hvm_start_info (unused). The 32-bit
 * entry clears .bss, builds page tables that identity-map the first 4 GiB
 * with 2 MiB pages, switches to long mode and jumps to start64; from there
 * on everything runs in 64-bit mode. The image has no multiboot header: QEMU
 * refuses a multiboot ELF64, and looks for multiboot before PVH.
 *
 * Only the CPU that the firmware hands over to runs (the BSP); the
 * firmware keeps the APs halted. Interrupts stay disabled throughout. An
 * IDT catches exceptions, which are kernel bugs: each prints one line and
 * halts (the riscv64 kernel has no such line).
 *
 * The behaviour (strings, line editing, flood pattern) is the riscv64
 * kernel's contract, which tests match on; see README.md next to this file
 * for where x86_64 differs (no virtio devices, poweroff, exit N).
 *
 * The 32-bit entry uses absolute addresses (the kernel always runs at its
 * link address); the 64-bit code reaches its own symbols RIP-relatively.
 * Assembled with plain as (GNU, --64). Rebuild with scripts/build-tiny-kernel.
 */

	.equ	COM1,		0x3f8
	.equ	UART_RBR,	COM1 + 0	/* receive buffer (read) */
	.equ	UART_THR,	COM1 + 0	/* transmit holding (write) */
	.equ	UART_IER,	COM1 + 1	/* interrupt enable */
	.equ	UART_FCR,	COM1 + 2	/* FIFO control (write) */
	.equ	UART_LSR,	COM1 + 5	/* line status */
	.equ	FCR_ENABLE,	0x01		/* FIFOs on, 1-byte trigger */
	.equ	LSR_DR,		0x01		/* data ready */
	.equ	LSR_THRE,	0x20		/* THR empty */
	.equ	LSR_TEMT,	0x40		/* transmitter empty */

	/* isa-debug-exit: QEMU exits with (value << 1) | 1. Reads give 0
	 * (a port nothing answers reads as 0xff). 0xf4 is where everyone puts
	 * it (-device isa-debug-exit,iobase=0xf4,iosize=4), 0x501 its default. */
	.equ	HPET,		0xfed00000	/* q35's and pc's HPET */
	.equ	HPET_VENDOR,	0x8086		/* its ID's bits 31:16 in QEMU */
	.equ	HPET_CONF,	0x10		/* general configuration */
	.equ	DEBUG_EXIT_PORT1, 0xf4
	.equ	DEBUG_EXIT_PORT2, 0x501

	/* ACPI: the FADT's fields this kernel reads (ACPI 6.x, 5.2.9). */
	.equ	FADT_PM1A_CNT,	64		/* PM1a_CNT_BLK, 32-bit I/O port */
	.equ	FADT_FLAGS,	112
	.equ	FADT_HW_REDUCED, 20		/* flag bit: HW_REDUCED_ACPI */
	.equ	FADT_SLEEP_CTL,	244		/* SLEEP_CONTROL_REG, a GAS */
	.equ	SLP_EN,		0x2000		/* PM1_CNT.SLP_EN, SLP_TYP 0 */
	.equ	SLEEP_CTL_S5,	0x34		/* SLP_EN | SLP_TYP 5 << 2 */

	.equ	LINE_MAX,	255		/* max chars in an input line */
	.equ	TA_MAX,		256		/* typeahead buffer size */
	.equ	STACK_SIZE,	8192

	.equ	CH_CTRLC,	0x03
	.equ	CH_BS,		0x08
	.equ	CH_LF,		0x0a
	.equ	CH_CR,		0x0d
	.equ	CH_SPACE,	0x20
	.equ	CH_0,		0x30
	.equ	CH_9,		0x39
	.equ	CH_DEL,		0x7f

	.equ	SEL_CODE64,	0x08
	.equ	SEL_DATA,	0x10
	.equ	SEL_CODE32,	0x18

	.equ	MSR_EFER,	0xc0000080
	.equ	EFER_LME,	0x100
	.equ	CR0_PG,		0x80000000
	.equ	CR4_PAE,	0x20

/* ------------------------------------------------------------------------ */
/* The PVH entry note (Xen's public/elfnote.h): QEMU's -kernel reads it from
 * the PT_NOTE segment and enters the 32-bit address it holds. */
	.section .note.Xen, "a", @note
	.balign	4
	.long	4				/* namesz */
	.long	4				/* descsz */
	.long	18				/* XEN_ELFNOTE_PHYS32_ENTRY */
	.asciz	"Xen"
	.long	pvh_start

/* ------------------------------------------------------------------------ */
	.section .text.start, "ax", @progbits
	.code32
	.globl	pvh_start
pvh_start:
	cli
	cld
	/* Our own GDT first: the entry state promises flat segments, not
	 * that the GDT they came from is still there. */
	lgdt	gdt_desc
	ljmp	$SEL_CODE32, $1f
1:	movl	$SEL_DATA, %eax
	movl	%eax, %ds
	movl	%eax, %es
	movl	%eax, %ss
	movl	%eax, %fs
	movl	%eax, %gs
	movl	$stack_top, %esp

	/* .bss is not part of the image (and survives a system_reset): clear
	 * it; the page tables are built there. Bounds are 8-aligned. */
	movl	$__bss_start, %edi
	movl	$__bss_end, %ecx
	subl	%edi, %ecx
	shrl	$2, %ecx
	xorl	%eax, %eax
	rep stosl

	/* Page tables: PML4[0] -> PDPT, PDPT[0..3] -> four page directories
	 * of 2 MiB pages, identity-mapping 0..4 GiB. The top GiB (MMIO:
	 * ACPI GED, LAPIC, IOAPIC) is mapped uncached. */
	movl	$pdpt + 3, pml4			/* present, writable */
	movl	$pd + 3, %eax
	xorl	%edi, %edi
2:	movl	%eax, pdpt(, %edi, 8)
	addl	$4096, %eax
	incl	%edi
	cmpl	$4, %edi
	jne	2b
	movl	$0x83, %eax			/* present, writable, 2 MiB */
	xorl	%edi, %edi
3:	movl	%eax, %edx
	cmpl	$1536, %edi			/* from 3 GiB on: PCD | PWT */
	jb	4f
	orl	$0x18, %edx
4:	movl	%edx, pd(, %edi, 8)
	addl	$0x200000, %eax
	incl	%edi
	cmpl	$2048, %edi
	jne	3b

	/* Long mode: PAE, the PML4, EFER.LME, then paging on. */
	movl	%cr4, %eax
	orl	$CR4_PAE, %eax
	movl	%eax, %cr4
	movl	$pml4, %eax
	movl	%eax, %cr3
	movl	$MSR_EFER, %ecx
	rdmsr
	orl	$EFER_LME, %eax
	wrmsr
	movl	%cr0, %eax
	orl	$CR0_PG, %eax
	movl	%eax, %cr0
	ljmp	$SEL_CODE64, $start64

	.code64
start64:
	leaq	stack_top(%rip), %rsp
	xorl	%ebp, %ebp			/* end of the frame chain */

	/* The IDT: gate i -> exc_stubs + 16 * i, 64-bit interrupt gates. */
	leaq	idt(%rip), %rdi
	leaq	exc_stubs(%rip), %rax
	movl	$32, %ecx
1:	movq	%rax, %rdx
	movw	%dx, (%rdi)			/* offset 15:0 */
	movw	$SEL_CODE64, 2(%rdi)
	movw	$0x8e00, 4(%rdi)		/* present, DPL 0, interrupt gate */
	shrq	$16, %rdx
	movw	%dx, 6(%rdi)			/* offset 31:16 */
	shrq	$16, %rdx
	movl	%edx, 8(%rdi)			/* offset 63:32 */
	movl	$0, 12(%rdi)
	addq	$16, %rdi
	addq	$16, %rax
	decl	%ecx
	jnz	1b
	lidt	idt_desc(%rip)

	/* The UART: polled, so no interrupts, and the line settings stay
	 * as the firmware left them. Its 16-byte FIFOs go on: without them
	 * the receiver holds one byte, and a QEMU that replays a recording
	 * hands the UART a recorded chunk at once, keeping its last byte
	 * only. Turning the FIFOs on empties them, so a byte typed before
	 * the kernel started (the receiver holds at most one; QEMU keeps
	 * the rest until there is room) is moved to the typeahead buffer
	 * first. */
	movw	$UART_IER, %dx
	xorl	%eax, %eax
	outb	%al, %dx
	movw	$UART_LSR, %dx
	inb	%dx, %al
	testb	$LSR_DR, %al
	jz	1f
	movw	$UART_RBR, %dx
	inb	%dx, %al
	call	typeahead_push
1:	movw	$UART_FCR, %dx
	movb	$FCR_ENABLE, %al
	outb	%al, %dx

	/* The HPET's main counter runs, where the board has an HPET (q35
	 * and pc; microvm has none): qemu-mcp's capability probe reads it
	 * and arms its timer 0 through the debugger. No timer is armed and
	 * no interrupt enabled here. */
	movl	$HPET, %edi
	movl	(%rdi), %eax
	shrl	$16, %eax
	cmpl	$HPET_VENDOR, %eax
	jne	1f
	orl	$1, HPET_CONF(%rdi)		/* ENABLE_CNF */
1:

	/* The banner's number: the initial APIC ID (the BSP's, 0). */
	movl	$1, %eax
	cpuid
	shrl	$24, %ebx
	movl	%ebx, %ebx

	xorl	%r13d, %r13d			/* previous char was CR */
	leaq	line_buf(%rip), %r14

	leaq	str_banner1(%rip), %rsi
	call	puts
	movq	%rbx, %rax
	call	put_dec
	leaq	str_banner2(%rip), %rsi
	call	puts
	/* no virtio devices on x86_64: no probe lines */
	/* fall through into the shell */

/*
 * Shell main loop.
 * Global registers: r12 = line length, r13 = previous char was CR,
 * r14 = line buffer. rbx, rbp, r15 and r9, r10 are scratch for the command
 * handlers. The helper routines only use rax, rcx, rdx, rsi, rdi, r8, r11
 * (and the stack).
 */
prompt:
	leaq	str_prompt(%rip), %rsi
	call	puts
	xorl	%r12d, %r12d
read_loop:
	call	getc				/* al = received char */
	cmpb	$CH_CR, %al
	je	on_cr
	cmpb	$CH_LF, %al
	je	on_lf
	xorl	%r13d, %r13d
	cmpb	$CH_CTRLC, %al
	je	on_ctrlc
	cmpb	$CH_BS, %al
	je	on_bs
	cmpb	$CH_DEL, %al
	je	on_bs
	cmpb	$CH_SPACE, %al			/* ignore other control chars */
	jb	read_loop
	cmpb	$CH_DEL, %al			/* and non-ASCII bytes */
	jae	read_loop
	cmpq	$LINE_MAX, %r12			/* line full: drop, no echo */
	jae	read_loop
	movb	%al, (%r14, %r12)
	incq	%r12
	call	putc				/* echo */
	jmp	read_loop

on_bs:
	testq	%r12, %r12
	jz	read_loop
	decq	%r12
	leaq	str_bs(%rip), %rsi
	call	puts
	jmp	read_loop

on_ctrlc:
	leaq	str_ctrlc(%rip), %rsi
	call	puts
	jmp	prompt

on_lf:
	testq	%r13, %r13			/* bare LF ends the line */
	jz	on_eol
	xorl	%r13d, %r13d			/* LF of a CRLF: ignore */
	jmp	read_loop

on_cr:
	movl	$1, %r13d
on_eol:
	leaq	str_crlf(%rip), %rsi
	call	puts
	movb	$0, (%r14, %r12)		/* NUL-terminate the line */

	/* Parse: skip spaces, first word = [rbx, rbx+rbp), r15 = index after
	 * it, r9 = index of the argument (after one or more spaces). */
	xorl	%r15d, %r15d
1:	cmpq	%r12, %r15
	jae	prompt				/* empty / blank line */
	cmpb	$CH_SPACE, (%r14, %r15)
	jne	2f
	incq	%r15
	jmp	1b
2:	movq	%r15, %rbx
3:	cmpq	%r12, %r15
	jae	4f
	cmpb	$CH_SPACE, (%r14, %r15)
	je	4f
	incq	%r15
	jmp	3b
4:	movq	%r15, %rbp
	subq	%rbx, %rbp			/* word length */
	addq	%r14, %rbx			/* word pointer */
	movq	%r15, %r9
5:	cmpq	%r12, %r9
	jae	6f
	cmpb	$CH_SPACE, (%r14, %r9)
	jne	6f
	incq	%r9
	jmp	5b
6:
	/* Dispatch. */
	.macro	dispatch name, target
	movq	%rbx, %rsi
	movq	%rbp, %rcx
	leaq	\name(%rip), %rdi
	call	word_eq
	testl	%eax, %eax
	jnz	\target
	.endm
	dispatch name_help, cmd_help
	dispatch name_echo, cmd_echo
	dispatch name_panic, cmd_panic
	dispatch name_flood, cmd_flood
	dispatch name_poweroff, cmd_poweroff
	dispatch name_exit, cmd_exit
	dispatch name_input, cmd_input
	dispatch name_gfx, cmd_gfx

	/* unknown command: WORD */
	leaq	str_unknown(%rip), %rsi
	call	puts
	movq	%rbx, %rsi
	movq	%rbp, %rcx
	call	putn
	leaq	str_crlf(%rip), %rsi
	call	puts
	jmp	prompt

/* help */
cmd_help:
	leaq	str_help(%rip), %rsi
	call	puts
	jmp	prompt

/* echo TEXT: TEXT is everything after the single space following "echo" */
cmd_echo:
	cmpq	%r12, %r15
	jae	1f				/* plain "echo" */
	incq	%r15				/* skip the one separator space */
1:	leaq	(%r14, %r15), %rsi
	movq	%r12, %rcx
	subq	%r15, %rcx
	call	putn
	leaq	str_crlf(%rip), %rsi
	call	puts
	jmp	prompt

/* input: there are no virtio-input devices on x86_64 */
cmd_input:
	leaq	str_input(%rip), %rsi
	call	puts
	jmp	prompt

/* gfx: there is no virtio-gpu on x86_64 */
cmd_gfx:
	leaq	str_gfx(%rip), %rsi
	call	puts
	jmp	prompt

/* panic: print the panic line and stop forever */
cmd_panic:
	leaq	str_panic(%rip), %rsi
	call	puts
	jmp	halt

/* poweroff */
cmd_poweroff:
	leaq	str_poweroff(%rip), %rsi
	call	puts
	jmp	system_off

/*
 * exit N: N in 1..255, anything else means 1. QEMU's isa-debug-exit makes
 * QEMU exit with (value << 1) | 1, so only an odd N is exact; an even N
 * gives N + 1 (still a failure status), and the kernel says so. Without the
 * device the kernel says so and powers off instead: QEMU exits 0.
 */
cmd_exit:
	leaq	(%r14, %r9), %rsi
	call	parse_num
	testl	%ecx, %ecx
	jz	1f
	testq	%rax, %rax
	jz	1f
	cmpq	$255, %rax
	jbe	2f
1:	movl	$1, %eax
2:	movq	%rax, %rbx
	leaq	str_exiting(%rip), %rsi
	call	puts
	movq	%rbx, %rax
	call	put_dec
	leaq	str_crlf(%rip), %rsi
	call	puts
	movw	$DEBUG_EXIT_PORT1, %dx
	inb	%dx, %al
	testb	%al, %al
	jz	3f
	movw	$DEBUG_EXIT_PORT2, %dx
	inb	%dx, %al
	testb	%al, %al
	jnz	5f
3:	movzwl	%dx, %r15d			/* the device's port */
	testb	$1, %bl
	jnz	4f
	leaq	str_exit_odd(%rip), %rsi	/* even N: QEMU exits N + 1 */
	call	puts
	leaq	1(%rbx), %rax
	call	put_dec
	leaq	str_crlf(%rip), %rsi
	call	puts
4:	call	uart_flush
	movq	%r15, %rdx
	movl	%ebx, %eax
	shrl	$1, %eax
	outb	%al, %dx
	call	wait_off
	leaq	str_exit_failed(%rip), %rsi	/* QEMU did not exit */
	call	puts
	jmp	halt
5:	leaq	str_exit_nodev(%rip), %rsi
	call	puts
	jmp	system_off

/*
 * flood N: print exactly N bytes of the pattern, 64-byte lines:
 * "%08d " + "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQR" + "\n"
 * (the last line may be cut short). The UART is polled for Ctrl-C before
 * every line; other chars received meanwhile go to the typeahead buffer.
 */
cmd_flood:
	leaq	(%r14, %r9), %rsi
	call	parse_num
	testl	%ecx, %ecx
	jnz	1f
	leaq	str_flood_usage(%rip), %rsi
	call	puts
	jmp	prompt
1:	movq	%rax, %r15			/* bytes remaining */
	movq	%rax, %rbx			/* total, for "flood done N" */
	leaq	flood_line(%rip), %rbp

	/* build the first line: "00000000 " + alphabet + "\n" */
	movq	%rbp, %rdi
	movb	$CH_0, %al
	movl	$8, %ecx
	rep stosb
	movb	$CH_SPACE, (%rdi)
	incq	%rdi
	leaq	str_alpha(%rip), %rsi
	movl	$54, %ecx
	rep movsb
	movb	$CH_LF, (%rdi)

flood_loop:
	testq	%r15, %r15
	jz	flood_done
	/* between lines: Ctrl-C? */
	movw	$UART_LSR, %dx
	inb	%dx, %al
	testb	$LSR_DR, %al
	jz	4f
	movw	$UART_RBR, %dx
	inb	%dx, %al
	cmpb	$CH_CTRLC, %al
	je	flood_cancel
	call	typeahead_push
4:	/* emit min(64, remaining) bytes of the current line */
	movq	%r15, %r10
	cmpq	$64, %r10
	jbe	5f
	movl	$64, %r10d
5:	subq	%r10, %r15
	movq	%rbp, %rsi
6:	movw	$UART_LSR, %dx
	inb	%dx, %al
	testb	$LSR_THRE, %al
	jz	6b
	movw	$UART_THR, %dx
	lodsb
	outb	%al, %dx
	decq	%r10
	jnz	6b
	/* increment the 8-digit decimal line number (wraps at 10^8) */
	leaq	7(%rbp), %rdi
7:	movb	(%rdi), %al
	incb	%al
	cmpb	$CH_9, %al
	jbe	8f
	movb	$CH_0, (%rdi)
	cmpq	%rbp, %rdi
	je	flood_loop
	decq	%rdi
	jmp	7b
8:	movb	%al, (%rdi)
	jmp	flood_loop

flood_done:
	leaq	str_flood_done(%rip), %rsi	/* "\r\nflood done " */
	call	puts
	movq	%rbx, %rax
	call	put_dec
	leaq	str_crlf(%rip), %rsi
	call	puts
	jmp	prompt

flood_cancel:
	/* Ctrl-C also discards anything typed ahead during the flood */
	movl	$0, ta_len(%rip)
	movl	$0, ta_pos(%rip)
	leaq	str_flood_ctrlc(%rip), %rsi	/* "\r\n^C\r\n" */
	call	puts
	jmp	prompt

/*
 * ACPI power off (S5), found through the firmware's ACPI tables: the RSDP
 * in the BIOS area (0xe0000-0xfffff), the RSDT or XSDT, the FADT. On a
 * hardware-reduced platform (microvm) the FADT's SLEEP_CONTROL_REG gets
 * SLP_EN | SLP_TYP 5 (QEMU's GED: S5); otherwise (q35's ICH9, pc's PIIX4)
 * PM1a_CNT gets SLP_EN with SLP_TYP 0, QEMU's \_S5 value on both. QEMU
 * exits 0. It does so from its main loop, so the CPU runs on for a moment:
 * only if QEMU is still there about a second later does the kernel say that
 * nothing answered, and halt.
 */
system_off:
	call	uart_flush
	call	find_fadt
	testq	%rax, %rax
	jz	9f
	movq	%rax, %rsi
	cmpl	$FADT_SLEEP_CTL + 12, 4(%rsi)	/* table long enough? */
	jb	2f
	btl	$FADT_HW_REDUCED, FADT_FLAGS(%rsi)
	jnc	2f
	movq	FADT_SLEEP_CTL + 4(%rsi), %rdi	/* GAS address */
	testq	%rdi, %rdi
	jz	9f
	movb	$SLEEP_CTL_S5, %al
	cmpb	$1, FADT_SLEEP_CTL(%rsi)	/* GAS space: 0 memory, 1 I/O */
	je	1f
	movb	%al, (%rdi)
	jmp	8f
1:	movl	%edi, %edx
	outb	%al, %dx
	jmp	8f
2:	movl	FADT_PM1A_CNT(%rsi), %edx
	testl	%edx, %edx
	jz	9f
	movw	$SLP_EN, %ax
	outw	%ax, %dx
8:	call	wait_off
9:	leaq	str_off_failed(%rip), %rsi
	call	puts
	/* fall through */

/* stop forever: interrupts are off, so hlt never returns (an NMI would
 * only bring it back to the next hlt) */
halt:
	cli
1:	hlt
	jmp	1b

/* wait_off: spin about a second (2^31 TSC ticks), time for QEMU's main
 * loop to act on a shutdown request. Uses rax, rcx, rdx. */
wait_off:
	rdtsc
	shlq	$32, %rdx
	orq	%rax, %rdx
	movq	%rdx, %rcx
1:	pause
	rdtsc
	shlq	$32, %rdx
	orq	%rax, %rdx
	subq	%rcx, %rdx
	shrq	$31, %rdx
	jz	1b
	ret

/* find_fadt() -> rax = the FADT, or 0. Uses rax, rcx, rdx, rsi, rdi, r8,
 * r11. The identity map covers the tables (QEMU puts them below 4 GiB). */
find_fadt:
	movl	$0xe0000, %esi
	movabsq	$0x2052545020445352, %rax	/* "RSD PTR " */
1:	cmpq	%rax, (%rsi)
	je	2f
	addl	$16, %esi
	cmpl	$0x100000, %esi
	jb	1b
	xorl	%eax, %eax
	ret
2:	/* XSDT (8-byte entries) from revision 2 on, if set; else RSDT */
	movl	$4, %r8d
	movl	16(%rsi), %edi			/* RsdtAddress */
	cmpb	$2, 15(%rsi)
	jb	3f
	movq	24(%rsi), %rdx			/* XsdtAddress */
	testq	%rdx, %rdx
	jz	3f
	movq	%rdx, %rdi
	movl	$8, %r8d
3:	testq	%rdi, %rdi
	jz	6f
	movl	4(%rdi), %r11d			/* table length */
	addq	%rdi, %r11			/* end */
	addq	$36, %rdi			/* entries follow the header */
4:	leaq	(%rdi, %r8), %rdx
	cmpq	%r11, %rdx
	ja	6f
	movl	(%rdi), %esi			/* entry, 32-bit */
	cmpl	$8, %r8d
	jne	5f
	movq	(%rdi), %rsi			/* entry, 64-bit */
5:	cmpl	$0x50434146, (%rsi)		/* "FACP" */
	je	7f
	addq	%r8, %rdi
	jmp	4b
6:	xorl	%eax, %eax
	ret
7:	movq	%rsi, %rax
	ret

/* ------------------------------------------------------------------------ */
/* Exceptions: interrupts stay off, so only exceptions come here, and each
 * is a kernel bug: it prints the vector, the error code and the RIP, and
 * halts. Stub i (16 bytes each) pushes a 0 error code where the CPU pushes
 * none, then the vector. */
	.balign	16
exc_stubs:
	.irp	v, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
	.balign	16
	.if	(\v == 8) || ((\v >= 10) && (\v <= 14)) || (\v == 17) || (\v == 21) || (\v == 29) || (\v == 30)
	.else
	pushq	$0
	.endif
	pushq	$\v
	jmp	exc_common
	.endr

exc_common:
	popq	%rbx				/* vector */
	popq	%rbp				/* error code */
	popq	%r15				/* RIP */
	leaq	stack_top(%rip), %rsp		/* whatever rsp was */
	leaq	str_exc_vector(%rip), %rsi
	call	puts
	movq	%rbx, %rax
	call	put_dec
	leaq	str_exc_error(%rip), %rsi
	call	puts
	movq	%rbp, %rax
	call	put_hex
	leaq	str_exc_rip(%rip), %rsi
	call	puts
	movq	%r15, %rax
	call	put_hex
	leaq	str_crlf(%rip), %rsi
	call	puts
	jmp	halt

/* ------------------------------------------------------------------------ */
/* Helpers: use only rax, rcx, rdx, rsi, rdi, r8, r11 (and the stack). */

/* putc(al = char) */
putc:
	movl	%eax, %r8d
	movw	$UART_LSR, %dx
1:	inb	%dx, %al
	testb	$LSR_THRE, %al
	jz	1b
	movl	%r8d, %eax
	movw	$UART_THR, %dx
	outb	%al, %dx
	ret

/* puts(rsi = NUL-terminated string) */
puts:
1:	movb	(%rsi), %al
	testb	%al, %al
	jz	2f
	call	putc
	incq	%rsi
	jmp	1b
2:	ret

/* putn(rsi = pointer, rcx = length) */
putn:
1:	testq	%rcx, %rcx
	jz	2f
	movb	(%rsi), %al
	call	putc
	incq	%rsi
	decq	%rcx
	jmp	1b
2:	ret

/* put_dec(rax = unsigned 64-bit value): print in decimal */
put_dec:
	subq	$32, %rsp
	leaq	32(%rsp), %rsi			/* digits are built backwards */
	movl	$10, %ecx
1:	xorl	%edx, %edx
	divq	%rcx
	addb	$CH_0, %dl
	decq	%rsi
	movb	%dl, (%rsi)
	testq	%rax, %rax
	jnz	1b
	leaq	32(%rsp), %rcx
	subq	%rsi, %rcx
	call	putn
	addq	$32, %rsp
	ret

/* put_hex(rax): "0x" and 16 hex digits (exception reports only) */
put_hex:
	movq	%rax, %rdi
	movb	$CH_0, %al
	call	putc
	movb	$0x78, %al			/* 'x' */
	call	putc
	movl	$16, %ecx
1:	rolq	$4, %rdi
	movl	%edi, %eax
	andl	$0xf, %eax
	cmpb	$10, %al
	jb	2f
	addb	$(0x61 - 10 - CH_0), %al	/* 'a' - 10 */
2:	addb	$CH_0, %al
	call	putc				/* keeps rcx, rdi */
	decl	%ecx
	jnz	1b
	ret

/* uart_flush: wait (bounded) until the UART has sent everything, so that
 * a power off does not cut the last line short. */
uart_flush:
	movl	$(1 << 24), %ecx
	movw	$UART_LSR, %dx
1:	inb	%dx, %al
	testb	$LSR_TEMT, %al
	jnz	2f
	decl	%ecx
	jnz	1b
2:	ret

/* getc() -> al: next char, from the typeahead buffer first, else the UART
 * (blocking, polled). */
getc:
	movl	ta_pos(%rip), %ecx
	movl	ta_len(%rip), %edx
	cmpl	%edx, %ecx
	jae	2f
	leaq	ta_buf(%rip), %rsi
	movzbl	(%rsi, %rcx), %eax
	incl	%ecx
	cmpl	%edx, %ecx
	jne	1f
	movl	$0, ta_pos(%rip)		/* drained: reset */
	movl	$0, ta_len(%rip)
	ret
1:	movl	%ecx, ta_pos(%rip)
	ret
2:	movw	$UART_LSR, %dx
3:	inb	%dx, %al
	testb	$LSR_DR, %al
	jz	3b
	movw	$UART_RBR, %dx
	inb	%dx, %al
	movzbl	%al, %eax
	ret

/* typeahead_push(al = char): append, dropped when full */
typeahead_push:
	movl	ta_len(%rip), %ecx
	cmpl	$TA_MAX, %ecx
	jae	1f
	leaq	ta_buf(%rip), %rsi
	movb	%al, (%rsi, %rcx)
	incl	%ecx
	movl	%ecx, ta_len(%rip)
1:	ret

/* word_eq(rsi = word, rcx = word length, rdi = NUL-terminated name) ->
 * eax = 1 if equal, else 0 */
word_eq:
1:	movb	(%rdi), %dl
	testq	%rcx, %rcx
	jz	2f
	testb	%dl, %dl
	jz	3f
	cmpb	(%rsi), %dl
	jne	3f
	incq	%rsi
	incq	%rdi
	decq	%rcx
	jmp	1b
2:	xorl	%eax, %eax
	testb	%dl, %dl
	sete	%al
	ret
3:	xorl	%eax, %eax
	ret

/* parse_num(rsi = string ending at NUL or space) -> rax = value, ecx = 1
 * if it is 1..18 decimal digits, else rax = 0, ecx = 0 */
parse_num:
	xorl	%eax, %eax			/* value */
	xorl	%r8d, %r8d			/* digits */
1:	movzbl	(%rsi), %edx
	testl	%edx, %edx
	jz	2f
	cmpl	$CH_SPACE, %edx
	je	2f
	subl	$CH_0, %edx
	cmpl	$10, %edx
	jae	3f
	imulq	$10, %rax, %rax
	addq	%rdx, %rax
	incq	%r8
	incq	%rsi
	jmp	1b
2:	testq	%r8, %r8
	jz	3f
	cmpq	$18, %r8
	ja	3f
	movl	$1, %ecx
	ret
3:	xorl	%eax, %eax
	xorl	%ecx, %ecx
	ret

/* ------------------------------------------------------------------------ */
	.section .rodata, "a", @progbits
	.balign	8
gdt:
	.quad	0
	.quad	0x00af9a000000ffff		/* 0x08: 64-bit code */
	.quad	0x00cf92000000ffff		/* 0x10: flat data */
	.quad	0x00cf9a000000ffff		/* 0x18: flat 32-bit code */
gdt_end:
gdt_desc:
	.word	gdt_end - gdt - 1
	.long	gdt
idt_desc:
	.word	32 * 16 - 1
	.quad	idt

str_banner1:	.asciz	"qemu-mcp tiny kernel 1.0 (hart "
str_banner2:	.asciz	")\r\ntype 'help' for commands\r\n"
str_prompt:	.asciz	"tiny> "
str_crlf:	.asciz	"\r\n"
str_bs:		.asciz	"\b \b"
str_ctrlc:	.asciz	"^C\r\n"
str_unknown:	.asciz	"unknown command: "
str_panic:	.asciz	"Kernel panic - not syncing: requested by user\r\n"
str_poweroff:	.asciz	"Powering off\r\n"
str_exiting:	.asciz	"Exiting with status "
str_exit_odd:	.asciz	"exit: isa-debug-exit makes odd statuses only: QEMU exits "
str_exit_nodev:	.asciz	"exit: no isa-debug-exit (QEMU without -device isa-debug-exit,iobase=0xf4,iosize=4): powering off, QEMU exits 0\r\n"
str_exit_failed: .asciz	"exit: isa-debug-exit did not answer: halted\r\n"
str_off_failed:	.asciz	"poweroff: no ACPI power-off answered: halted\r\n"
str_input:	.asciz	"input: keyboard=no tablet=no\r\n"
str_gfx:	.asciz	"gfx: no virtio-gpu device\r\n"
str_flood_usage: .asciz	"usage: flood N\r\n"
str_flood_done:	.asciz	"\r\nflood done "
str_flood_ctrlc: .asciz	"\r\n^C\r\n"
str_exc_vector:	.asciz	"\r\nunexpected exception: vector "
str_exc_error:	.asciz	" error "
str_exc_rip:	.asciz	" RIP "
str_alpha:	.ascii	"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQR"
str_help:
	.ascii	"commands: help echo panic flood poweroff exit\r\n"
	.ascii	"  help       show this help\r\n"
	.ascii	"  echo TEXT  print TEXT\r\n"
	.ascii	"  panic      print a kernel panic message and halt\r\n"
	.ascii	"  flood N    print N bytes of a checkable pattern (Ctrl-C stops)\r\n"
	.ascii	"  poweroff   power off (QEMU exits with status 0)\r\n"
	.asciz	"  exit N     make QEMU exit with status N (1..255)\r\n"
name_help:	.asciz	"help"
name_echo:	.asciz	"echo"
name_panic:	.asciz	"panic"
name_flood:	.asciz	"flood"
name_poweroff:	.asciz	"poweroff"
name_exit:	.asciz	"exit"
name_input:	.asciz	"input"
name_gfx:	.asciz	"gfx"

	.section .bss, "aw", @nobits
	.balign	4096
pml4:		.space	4096
pdpt:		.space	4096
pd:		.space	4 * 4096
idt:		.space	32 * 16
	.balign	16
stack:		.space	STACK_SIZE
stack_top:
ta_len:		.space	4
ta_pos:		.space	4
ta_buf:		.space	TA_MAX
flood_line:	.space	64
line_buf:	.space	LINE_MAX + 1
