/*
 * qemu-mcp tiny kernel for aarch64: the riscv64 tiny kernel's shell
 * (../tiny/kernel.S), for the QEMU "virt" machine booted with -kernel and
 * no firmware. It runs the same line-oriented shell on the PL011 UART
 * (0x09000000, polled) and powers QEMU off through PSCI SYSTEM_OFF.
 *
 * The file starts with a Linux arm64 Image header, so QEMU (and any Image
 * loader) treats tiny-aarch64.bin as a kernel Image: QEMU loads it at
 * RAM + 2 MiB (0x40200000, the link address) and enters it at EL2 when the
 * CPU has EL2 (-M virt,virtualization=on), else at EL1. tiny-aarch64.elf
 * is entered at the highest EL the CPU has (EL3 with -M virt,secure=on).
 * The code runs at whatever EL it is entered at, with the MMU and the
 * caches off; it only touches the registers of that EL, and the code is
 * position independent: every reference to its own symbols is PC-relative
 * (adrp + :lo12:, b, bl). Only device addresses are absolute.
 *
 * Entry: x0 = dtb (unused). Only CPU 0 (MPIDR affinity 0.0.0.0) runs the
 * shell; QEMU's virt board keeps the others powered off until a PSCI
 * CPU_ON, and one that runs anyway parks in a wfe loop.
 *
 * The behaviour (strings, line editing, flood pattern) is the riscv64
 * kernel's contract, which tests match on; see README.md next to this file
 * for where aarch64 differs (poweroff at EL3, exit N).
 *
 * The virtio drivers are the riscv64 kernel's own ../tiny/virtio.c,
 * compiled for aarch64 (-mgeneral-regs-only: FP/SIMD may trap at reset).
 * The C code follows AAPCS64, so x19..x28 survive it.
 *
 * Assembled with plain aarch64-linux-gnu-as (no C preprocessor needed, but
 * the file is also cpp-safe). Rebuild with scripts/build-tiny-kernel.
 */

	.equ	UART_BASE,	0x09000000	/* PL011 */
	.equ	UART_DR,	0x000		/* data (32-bit access) */
	.equ	UART_FR,	0x018		/* flags */
	.equ	UART_LCR_H,	0x02c
	.equ	UART_CR,	0x030
	.equ	FR_BUSY_BIT,	3		/* transmitting */
	.equ	FR_RXFE_BIT,	4		/* receive FIFO empty */
	.equ	FR_TXFF_BIT,	5		/* transmit FIFO full */
	.equ	FR_TXFE_BIT,	7		/* transmit FIFO empty */
	.equ	LCR_H_8N1_FIFO,	0x70		/* WLEN 8 bits, FEN */
	.equ	CR_ON,		0x301		/* UARTEN, TXE, RXE */
	.equ	UART_QUIET,	0x10000		/* empty polls that end the boot's drain */

	.equ	PSCI_SYSTEM_OFF, 0x84000008
	.equ	SEMI_SYS_EXIT,	0x18		/* semihosting SYS_EXIT */
	.equ	ADP_APP_EXIT,	0x20026		/* ADP_Stopped_ApplicationExit */

	.equ	EC_HVC64,	0x16
	.equ	EC_SMC64,	0x17

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

/* lla reg, sym: the address of sym, PC-relative (adrp + low 12 bits), so
 * it is right wherever the image runs, as long as it runs 4 KiB-aligned
 * relative to its link address (any Image loader does: 2 MiB). */
	.macro	lla reg, sym
	adrp	\reg, \sym
	add	\reg, \reg, :lo12:\sym
	.endm

/* ------------------------------------------------------------------------ */
	.section .text.head, "ax", %progbits
	.globl	_head
/* Linux arm64 Image header (Documentation/arch/arm64/booting.rst). */
_head:
	b	_start				/* code0 */
	.long	0				/* code1 */
	.quad	0				/* text_offset: 2 MiB-aligned base + 0 */
	.quad	__bss_end - _head		/* image_size, .bss included */
	.quad	0x8				/* flags: LE, any page size, anywhere */
	.quad	0, 0, 0				/* res2..res4 */
	.ascii	"ARM\x64"			/* magic */
	.long	0				/* res5 (no PE header) */

	.globl	_start
_start:
	/* Only CPU 0 runs the shell. */
	mrs	x9, mpidr_el1
	mov	x10, #0xffffff			/* Aff2..Aff0 */
	movk	x10, #0xff, lsl #32		/* Aff3 */
	and	x9, x9, x10
	cbnz	x9, park

	/* Exceptions are taken to the EL we run at: point its VBAR at our
	 * vectors (they skip an instruction that is expected to trap). */
	lla	x9, vectors
	mrs	x10, CurrentEL
	lsr	x10, x10, #2
	cmp	x10, #2
	b.eq	2f
	b.hi	3f
	msr	vbar_el1, x9
	b	4f
2:	msr	vbar_el2, x9
	b	4f
3:	msr	vbar_el3, x9
4:	isb

	/* .bss is not part of the image (and survives a system_reset):
	 * clear it, the C code expects zeroed statics. Bounds are 8-aligned. */
	lla	x9, __bss_start
	lla	x10, __bss_end
1:	cmp	x9, x10
	b.hs	2f
	str	xzr, [x9], #8
	b	1b
2:
	lla	x9, stack_top
	mov	sp, x9
	mov	x29, #0				/* end of the frame chain */
	mov	x30, #0

	/* The UART: enabled, receiver and transmitter on, 8N1 with FIFOs,
	 * as firmware would leave it. The FIFOs matter under QEMU's
	 * record/replay: a recording QEMU hands the UART every byte that
	 * arrived at once, whatever room it said it had, and with the FIFOs
	 * off QEMU 11.1 keeps only one of them (a holding register): bytes
	 * typed together were lost. Turning the FIFOs on empties the receive
	 * FIFO, so what was typed before the kernel started is first taken
	 * into the typeahead buffer, until the receiver stayed empty for
	 * UART_QUIET polls (QEMU hands over the next byte only after each
	 * DR read). After the switch QEMU may hand over nothing more until
	 * DR is read, so DR is read once more while the FIFO is empty. */
	mov	x9, #UART_BASE
	mov	w10, #CR_ON
	str	w10, [x9, #UART_CR]
	mov	x12, #UART_QUIET
1:	ldr	w10, [x9, #UART_FR]
	tbnz	w10, #FR_RXFE_BIT, 2f
	ldr	w0, [x9, #UART_DR]
	and	w0, w0, #0xff
	bl	typeahead_push			/* uses x9..x11 */
	mov	x9, #UART_BASE
	mov	x12, #UART_QUIET
	b	1b
2:	subs	x12, x12, #1
	b.ne	1b
	mov	w10, #LCR_H_8N1_FIFO
	str	w10, [x9, #UART_LCR_H]
	ldr	w10, [x9, #UART_FR]
	tbz	w10, #FR_RXFE_BIT, 3f
	ldr	w10, [x9, #UART_DR]
3:

	/* The banner's number: the CPU's Aff0 (always 0, see above). */
	mrs	x19, mpidr_el1
	and	x19, x19, #0xff

	mov	x21, #0				/* previous char was CR */
	lla	x22, line_buf

	lla	x0, str_banner1
	bl	puts
	mov	x0, x19
	bl	put_dec
	lla	x0, str_banner2
	bl	puts
	/* virtio probe: one line per virtio-input / virtio-gpu device found */
	bl	tk_probe
	/* fall through into the shell */

/*
 * Shell main loop.
 * Global registers: x20 = line length, x21 = previous char was CR,
 * x22 = line buffer. x23..x28 are scratch for the command handlers.
 * The helper routines are leaves that only use x0..x15 (put_dec also the
 * stack; getc also calls tk_input_idle in virtio.c, which preserves
 * x19..x28).
 */
prompt:
	lla	x0, str_prompt
	bl	puts
	mov	x20, #0
read_loop:
	bl	getc				/* w0 = received char */
	cmp	w0, #CH_CR
	b.eq	on_cr
	cmp	w0, #CH_LF
	b.eq	on_lf
	mov	x21, #0
	cmp	w0, #CH_CTRLC
	b.eq	on_ctrlc
	cmp	w0, #CH_BS
	b.eq	on_bs
	cmp	w0, #CH_DEL
	b.eq	on_bs
	cmp	w0, #CH_SPACE			/* ignore other control chars */
	b.lo	read_loop
	cmp	w0, #CH_DEL			/* and non-ASCII bytes */
	b.hs	read_loop
	cmp	x20, #LINE_MAX			/* line full: drop, no echo */
	b.hs	read_loop
	strb	w0, [x22, x20]
	add	x20, x20, #1
	bl	putc				/* echo */
	b	read_loop

on_bs:
	cbz	x20, read_loop
	sub	x20, x20, #1
	lla	x0, str_bs
	bl	puts
	b	read_loop

on_ctrlc:
	lla	x0, str_ctrlc
	bl	puts
	b	prompt

on_lf:
	cbz	x21, on_eol			/* bare LF ends the line */
	mov	x21, #0				/* LF of a CRLF: ignore */
	b	read_loop

on_cr:
	mov	x21, #1
on_eol:
	lla	x0, str_crlf
	bl	puts
	strb	wzr, [x22, x20]			/* NUL-terminate the line */

	/* Parse: skip spaces, first word = [x24, x24+x25), x23 = index after
	 * it, x26 = index of the argument (after one or more spaces). */
	mov	x23, #0
1:	cmp	x23, x20
	b.hs	prompt				/* empty / blank line */
	ldrb	w10, [x22, x23]
	cmp	w10, #CH_SPACE
	b.ne	2f
	add	x23, x23, #1
	b	1b
2:	mov	x24, x23
3:	cmp	x23, x20
	b.hs	4f
	ldrb	w10, [x22, x23]
	cmp	w10, #CH_SPACE
	b.eq	4f
	add	x23, x23, #1
	b	3b
4:	sub	x25, x23, x24			/* word length */
	add	x24, x22, x24			/* word pointer */
	mov	x26, x23
5:	cmp	x26, x20
	b.hs	6f
	ldrb	w10, [x22, x26]
	cmp	w10, #CH_SPACE
	b.ne	6f
	add	x26, x26, #1
	b	5b
6:
	/* Dispatch. */
	.macro	dispatch name, target
	mov	x0, x24
	mov	x1, x25
	lla	x2, \name
	bl	word_eq
	cbnz	x0, \target
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
	lla	x0, str_unknown
	bl	puts
	mov	x0, x24
	mov	x1, x25
	bl	putn
	lla	x0, str_crlf
	bl	puts
	b	prompt

/* help */
cmd_help:
	lla	x0, str_help
	bl	puts
	b	prompt

/* echo TEXT: TEXT is everything after the single space following "echo" */
cmd_echo:
	cmp	x23, x20
	b.hs	1f				/* plain "echo" */
	add	x23, x23, #1			/* skip the one separator space */
1:	add	x0, x22, x23
	sub	x1, x20, x23
	bl	putn
	lla	x0, str_crlf
	bl	puts
	b	prompt

/* input: which virtio-input devices are present (virtio.c) */
cmd_input:
	bl	tk_cmd_input
	b	prompt

/* gfx: draw the test pattern on the virtio-gpu scanout (virtio.c) */
cmd_gfx:
	bl	tk_cmd_gfx
	b	prompt

/* panic: print the panic line and stop forever */
cmd_panic:
	lla	x0, str_panic
	bl	puts
	b	halt

/* poweroff */
cmd_poweroff:
	lla	x0, str_poweroff
	bl	puts
	b	system_off

/*
 * exit N: N in 1..255, anything else means 1. The virt board has no
 * device that makes QEMU exit with a status; semihosting SYS_EXIT does,
 * when QEMU runs with -semihosting. Without it the hlt traps (undefined),
 * and the kernel says so and powers off instead: QEMU exits 0.
 */
cmd_exit:
	add	x0, x22, x26
	bl	parse_num
	cbz	x1, 1f
	cbz	x0, 1f
	cmp	x0, #255
	b.ls	2f
1:	mov	x0, #1
2:	mov	x23, x0
	lla	x0, str_exiting
	bl	puts
	mov	x0, x23
	bl	put_dec
	lla	x0, str_crlf
	bl	puts
	bl	uart_flush
	lla	x1, semi_block			/* A64 SYS_EXIT: a parameter block */
	movz	x9, #(ADP_APP_EXIT & 0xffff)
	movk	x9, #(ADP_APP_EXIT >> 16), lsl #16
	str	x9, [x1]
	str	x23, [x1, #8]
	mov	x0, #SEMI_SYS_EXIT
	bl	trap_arm
	hlt	#0xf000				/* semihosting call */
	bl	trap_disarm
	lla	x0, str_exit_nosemi
	bl	puts
	b	system_off

/*
 * flood N: print exactly N bytes of the pattern, 64-byte lines:
 * "%08d " + "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQR" + "\n"
 * (the last line may be cut short). The UART is polled for Ctrl-C before
 * every line; other chars received meanwhile go to the typeahead buffer.
 */
cmd_flood:
	add	x0, x22, x26
	bl	parse_num
	cbnz	x1, 1f
	lla	x0, str_flood_usage
	bl	puts
	b	prompt
1:	mov	x23, x0				/* bytes remaining */
	mov	x24, x0				/* total, for "flood done N" */
	lla	x25, flood_line
	mov	x26, #UART_BASE

	/* build the first line: "00000000 " + alphabet + "\n" */
	mov	x10, x25
	mov	w9, #CH_0
	mov	x11, #8
2:	strb	w9, [x10], #1
	subs	x11, x11, #1
	b.ne	2b
	mov	w9, #CH_SPACE
	strb	w9, [x10], #1
	lla	x12, str_alpha
	mov	x11, #54
3:	ldrb	w9, [x12], #1
	strb	w9, [x10], #1
	subs	x11, x11, #1
	b.ne	3b
	mov	w9, #CH_LF
	strb	w9, [x10]

flood_loop:
	cbz	x23, flood_done
	/* between lines: Ctrl-C? */
	ldr	w9, [x26, #UART_FR]
	tbnz	w9, #FR_RXFE_BIT, 4f
	ldr	w0, [x26, #UART_DR]
	and	w0, w0, #0xff
	cmp	w0, #CH_CTRLC
	b.eq	flood_cancel
	bl	typeahead_push
4:	/* emit min(64, remaining) bytes of the current line */
	mov	x27, x23
	cmp	x27, #64
	b.ls	5f
	mov	x27, #64
5:	sub	x23, x23, x27
	mov	x10, x25
6:	ldr	w9, [x26, #UART_FR]
	tbnz	w9, #FR_TXFF_BIT, 6b
	ldrb	w11, [x10], #1
	str	w11, [x26, #UART_DR]
	subs	x27, x27, #1
	b.ne	6b
	/* increment the 8-digit decimal line number (wraps at 10^8) */
	add	x10, x25, #7
7:	ldrb	w9, [x10]
	add	w9, w9, #1
	cmp	w9, #CH_9
	b.ls	8f
	mov	w9, #CH_0
	strb	w9, [x10]
	cmp	x10, x25
	b.eq	flood_loop
	sub	x10, x10, #1
	b	7b
8:	strb	w9, [x10]
	b	flood_loop

flood_done:
	lla	x0, str_flood_done		/* "\r\nflood done " */
	bl	puts
	mov	x0, x24
	bl	put_dec
	lla	x0, str_crlf
	bl	puts
	b	prompt

flood_cancel:
	/* Ctrl-C also discards anything typed ahead during the flood */
	lla	x9, ta_len
	str	wzr, [x9]
	lla	x9, ta_pos
	str	wzr, [x9]
	lla	x0, str_flood_ctrlc		/* "\r\n^C\r\n" */
	bl	puts
	b	prompt

/*
 * PSCI SYSTEM_OFF: QEMU exits 0. QEMU's virt board implements PSCI itself
 * for a -kernel boot; its conduit is smc when the CPU has EL2
 * (virtualization=on), else hvc, and a PSCI call is honoured at any EL.
 * QEMU offers no PSCI to a kernel it enters at EL3 (tiny-aarch64.elf with
 * secure=on). If the call comes back (PSCI absent, or reached the other
 * way), the other conduit is tried; then the kernel says so and halts.
 */
system_off:
	bl	uart_flush
	mrs	x9, id_aa64pfr0_el1
	ubfx	x9, x9, #8, #4			/* EL2 field */
	cbz	x9, 1f
	bl	psci_off_smc
	bl	psci_off_hvc
	b	2f
1:	bl	psci_off_hvc
	bl	psci_off_smc
2:	lla	x0, str_off_failed
	bl	puts
	b	halt

psci_off_hvc:
	mov	x15, x30
	bl	trap_arm
	movz	x0, #(PSCI_SYSTEM_OFF & 0xffff)
	movk	x0, #(PSCI_SYSTEM_OFF >> 16), lsl #16
	hvc	#0
	bl	trap_disarm
	ret	x15

psci_off_smc:
	mov	x15, x30
	bl	trap_arm
	movz	x0, #(PSCI_SYSTEM_OFF & 0xffff)
	movk	x0, #(PSCI_SYSTEM_OFF >> 16), lsl #16
	smc	#0
	bl	trap_disarm
	ret	x15

/* stop forever: interrupts are never enabled, so this just idles */
halt:
	wfi
	b	halt

/* CPUs other than 0 end up here */
park:
	wfe
	b	park

/* ------------------------------------------------------------------------ */
/* Exceptions. Interrupts stay masked, so only synchronous exceptions come
 * here. One that trap_arm announced (hlt without semihosting, hvc or smc
 * with nobody to take it) is skipped: the code goes on after the
 * instruction. Any other one is a bug: it is reported and the CPU halts.
 * The handler uses only x16 and x17. */

/* trap_arm / trap_disarm: announce (or stop announcing) that the next
 * instruction may trap. Leaves: use only x16, x17. */
trap_arm:
	lla	x16, trap_armed
	mov	w17, #1
	str	w17, [x16]
	ret
trap_disarm:
	lla	x16, trap_armed
	str	wzr, [x16]
	ret

	.balign	2048
vectors:
	.rept	16
	b	exc_entry
	.balign	128
	.endr

/* skip_trapped esr, elr: step elr over the trapped instruction, unless
 * it already points past it (hvc and smc taken as such: EC 0x16, 0x17). */
	.macro	skip_trapped esr, elr
	lsr	\esr, \esr, #26
	cmp	\esr, #EC_HVC64
	b.eq	9f
	cmp	\esr, #EC_SMC64
	b.eq	9f
	add	\elr, \elr, #4
9:
	.endm

exc_entry:
	lla	x16, trap_armed
	ldr	w17, [x16]
	cbz	w17, exc_fatal
	str	wzr, [x16]
	mrs	x16, CurrentEL
	cmp	x16, #(2 << 2)
	b.eq	2f
	b.hi	3f
	mrs	x16, esr_el1
	mrs	x17, elr_el1
	skip_trapped	x16, x17
	msr	elr_el1, x17
	eret
2:	mrs	x16, esr_el2
	mrs	x17, elr_el2
	skip_trapped	x16, x17
	msr	elr_el2, x17
	eret
3:	mrs	x16, esr_el3
	mrs	x17, elr_el3
	skip_trapped	x16, x17
	msr	elr_el3, x17
	eret

exc_fatal:
	mrs	x16, CurrentEL
	cmp	x16, #(2 << 2)
	b.eq	2f
	b.hi	3f
	mrs	x19, esr_el1
	mrs	x20, elr_el1
	b	4f
2:	mrs	x19, esr_el2
	mrs	x20, elr_el2
	b	4f
3:	mrs	x19, esr_el3
	mrs	x20, elr_el3
4:	lla	x9, stack_top			/* whatever sp was */
	mov	sp, x9
	lla	x0, str_exc_esr
	bl	puts
	mov	x0, x19
	bl	put_hex
	lla	x0, str_exc_elr
	bl	puts
	mov	x0, x20
	bl	put_hex
	lla	x0, str_crlf
	bl	puts
	b	halt

/* ------------------------------------------------------------------------ */
/* Leaf helpers: use only x0..x15 (and the stack in put_dec, put_hex). */

/* putc(w0 = char) */
putc:
	mov	x9, #UART_BASE
1:	ldr	w10, [x9, #UART_FR]
	tbnz	w10, #FR_TXFF_BIT, 1b
	str	w0, [x9, #UART_DR]
	ret

/* puts(x0 = NUL-terminated string) */
puts:
	mov	x9, #UART_BASE
1:	ldrb	w11, [x0], #1
	cbz	w11, 3f
2:	ldr	w10, [x9, #UART_FR]
	tbnz	w10, #FR_TXFF_BIT, 2b
	str	w11, [x9, #UART_DR]
	b	1b
3:	ret

/* putn(x0 = pointer, x1 = length) */
putn:
	mov	x9, #UART_BASE
1:	cbz	x1, 3f
	ldrb	w11, [x0], #1
2:	ldr	w10, [x9, #UART_FR]
	tbnz	w10, #FR_TXFF_BIT, 2b
	str	w11, [x9, #UART_DR]
	sub	x1, x1, #1
	b	1b
3:	ret

/* put_dec(x0 = unsigned 64-bit value): print in decimal */
put_dec:
	sub	sp, sp, #32
	add	x10, sp, #32			/* digits are built backwards */
	mov	x11, #10
1:	udiv	x12, x0, x11
	msub	x13, x12, x11, x0		/* x0 % 10 */
	mov	x0, x12
	add	w13, w13, #CH_0
	strb	w13, [x10, #-1]!
	cbnz	x0, 1b
	mov	x9, #UART_BASE
	add	x14, sp, #32
2:	ldr	w12, [x9, #UART_FR]
	tbnz	w12, #FR_TXFF_BIT, 2b
	ldrb	w13, [x10], #1
	str	w13, [x9, #UART_DR]
	cmp	x10, x14
	b.ne	2b
	add	sp, sp, #32
	ret

/* put_hex(x0): "0x" and 16 hex digits (exception reports only) */
put_hex:
	mov	x9, #UART_BASE
	mov	w11, #CH_0
1:	ldr	w10, [x9, #UART_FR]
	tbnz	w10, #FR_TXFF_BIT, 1b
	str	w11, [x9, #UART_DR]
	mov	w11, #0x78			/* 'x' */
2:	ldr	w10, [x9, #UART_FR]
	tbnz	w10, #FR_TXFF_BIT, 2b
	str	w11, [x9, #UART_DR]
	mov	x12, #60
3:	lsr	x11, x0, x12
	and	x11, x11, #0xf
	cmp	x11, #10
	add	x13, x11, #CH_0
	add	x11, x11, #(0x61 - 10)		/* 'a' - 10 */
	csel	x11, x13, x11, lo
4:	ldr	w10, [x9, #UART_FR]
	tbnz	w10, #FR_TXFF_BIT, 4b
	str	w11, [x9, #UART_DR]
	subs	x12, x12, #4
	b.hs	3b
	ret

/* uart_flush: wait (bounded) until the UART has sent everything, so that
 * a power off does not cut the last line short. */
uart_flush:
	mov	x9, #UART_BASE
	mov	x11, #(1 << 24)
1:	ldr	w10, [x9, #UART_FR]
	tbnz	w10, #FR_BUSY_BIT, 2f
	tbnz	w10, #FR_TXFE_BIT, 3f
2:	subs	x11, x11, #1
	b.ne	1b
3:	ret

/* getc() -> w0: next char, from the typeahead buffer first, else the UART
 * (blocking, polled). Only the shell's read loop calls it: while the UART
 * is idle it lets tk_input_idle(x22 = line, x20 = length) print pending
 * virtio-input events (and reprint the prompt and the partial line). */
getc:
	lla	x9, ta_pos
	ldr	w10, [x9]
	lla	x11, ta_len
	ldr	w12, [x11]
	cmp	w10, w12
	b.hs	2f
	lla	x13, ta_buf
	ldrb	w0, [x13, w10, uxtw]
	add	w10, w10, #1
	cmp	w10, w12
	b.ne	1f
	str	wzr, [x9]			/* drained: reset */
	str	wzr, [x11]
	ret
1:	str	w10, [x9]
	ret
2:	mov	x9, #UART_BASE
	ldr	w10, [x9, #UART_FR]
	tbz	w10, #FR_RXFE_BIT, 3f
	stp	x29, x30, [sp, #-16]!
	mov	x29, sp
	mov	x0, x22
	mov	x1, x20
	bl	tk_input_idle
	ldp	x29, x30, [sp], #16
	b	2b
3:	ldr	w0, [x9, #UART_DR]
	and	w0, w0, #0xff
	ret

/* typeahead_push(w0 = char): append, dropped when full */
typeahead_push:
	lla	x9, ta_len
	ldr	w10, [x9]
	cmp	w10, #TA_MAX
	b.hs	1f
	lla	x11, ta_buf
	strb	w0, [x11, w10, uxtw]
	add	w10, w10, #1
	str	w10, [x9]
1:	ret

/* word_eq(x0 = word, x1 = word length, x2 = NUL-terminated name) -> x0 = 1
 * if equal, else 0 */
word_eq:
1:	ldrb	w9, [x2]
	cbz	x1, 2f
	cbz	w9, 3f
	ldrb	w10, [x0]
	cmp	w9, w10
	b.ne	3f
	add	x0, x0, #1
	sub	x1, x1, #1
	add	x2, x2, #1
	b	1b
2:	cmp	w9, #0
	cset	x0, eq
	ret
3:	mov	x0, #0
	ret

/* parse_num(x0 = string ending at NUL or space) -> x0 = value, x1 = 1 if
 * it is 1..18 decimal digits, else x0 = 0, x1 = 0 */
parse_num:
	mov	x9, #0				/* value */
	mov	x10, #0				/* digits */
	mov	x12, #10
1:	ldrb	w11, [x0]
	cbz	w11, 2f
	cmp	w11, #CH_SPACE
	b.eq	2f
	sub	w11, w11, #CH_0
	cmp	w11, #10
	b.hs	3f
	madd	x9, x9, x12, x11
	add	x10, x10, #1
	add	x0, x0, #1
	b	1b
2:	cbz	x10, 3f
	cmp	x10, #18
	b.hi	3f
	mov	x0, x9
	mov	x1, #1
	ret
3:	mov	x0, #0
	mov	x1, #0
	ret

/* ------------------------------------------------------------------------ */
	.section .rodata, "a", %progbits
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
str_exit_nosemi: .asciz	"exit: no semihosting (QEMU without -semihosting): powering off, QEMU exits 0\r\n"
str_off_failed:	.asciz	"poweroff: no PSCI answered: halted\r\n"
str_flood_usage: .asciz	"usage: flood N\r\n"
str_flood_done:	.asciz	"\r\nflood done "
str_flood_ctrlc: .asciz	"\r\n^C\r\n"
str_exc_esr:	.asciz	"\r\nunexpected exception: ESR "
str_exc_elr:	.asciz	" ELR "
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

	.section .bss, "aw", %nobits
	.balign	16
stack:		.space	STACK_SIZE
stack_top:
semi_block:	.space	16
trap_armed:	.space	4
ta_len:		.space	4
ta_pos:		.space	4
ta_buf:		.space	TA_MAX
flood_line:	.space	64
line_buf:	.space	LINE_MAX + 1
