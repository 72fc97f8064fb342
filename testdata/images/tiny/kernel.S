/*
 * qemu-mcp tiny kernel: a minimal bare-metal riscv64 test kernel for the
 * QEMU "virt" machine. It runs a tiny line-oriented shell on the ns16550
 * UART and can power off QEMU or make it exit with a chosen status through
 * the sifive_test device.
 *
 * Works both when started by OpenSBI in S-mode (-bios default, loaded at
 * 0x80200000) and directly in M-mode (-bios none, loaded at 0x80000000):
 * the code is position independent, every reference to its own symbols is
 * PC-relative (lla, jal, branches). Only device addresses are absolute.
 *
 * Entry: a0 = hart id, a1 = dtb (unused). The first hart to win an atomic
 * lottery runs the shell; every other hart parks in a wfi loop.
 *
 * The behaviour (strings, line editing, flood pattern) is a contract that
 * tests match on; see README.md next to this file.
 *
 * The virtio drivers (virtio-input events, virtio-gpu framebuffer) are in
 * virtio.c, freestanding C compiled -mcmodel=medany (PC-relative too); this
 * file calls tk_probe, tk_input_idle, tk_cmd_input and tk_cmd_gfx. The C
 * code follows the standard calling convention, so s0..s11 survive it.
 *
 * Assembled with plain riscv64-unknown-elf-as (no C preprocessor needed,
 * but the file is also cpp-safe). Rebuild with scripts/build-tiny-kernel.
 */

	.option	norelax

	.equ	UART_BASE,	0x10000000
	.equ	UART_RBR,	0		/* receive buffer (read) */
	.equ	UART_THR,	0		/* transmit holding (write) */
	.equ	UART_IIR,	2		/* interrupt ident (read) */
	.equ	UART_LSR,	5		/* line status */
	.equ	IIR_FIFO,	0xc0		/* both set: FIFOs enabled */
	.equ	UART_FIFO_SIZE,	16
	.equ	LSR_DR,		0x01		/* data ready */
	.equ	LSR_THRE,	0x20		/* THR empty */

	.equ	TEST_BASE,	0x100000	/* sifive_test */
	.equ	TEST_PASS,	0x5555		/* power off, QEMU exits 0 */
	.equ	TEST_FAIL,	0x3333		/* (code << 16) | FAIL: exit code */

	.equ	LINE_MAX,	255		/* max chars in an input line */
	.equ	TA_MAX,		256		/* typeahead buffer size */
	.equ	STACK_SIZE,	8192

	.equ	CH_CTRLC,	0x03
	.equ	CH_BS,		0x08
	.equ	CH_LF,		0x0a
	.equ	CH_CR,		0x0d
	.equ	CH_DEL,		0x7f

/* ------------------------------------------------------------------------ */
	.section .text.start, "ax", @progbits
	.globl	_start
_start:
	/* Hart lottery: the first hart to swap a 1 into boot_lottery wins. */
	lla	t0, boot_lottery
	li	t1, 1
	amoswap.w.aqrl t1, t1, (t0)
	bnez	t1, park

	/* .bss is not part of the image (and survives a system_reset):
	 * clear it, the C code expects zeroed statics. Bounds are 8-aligned. */
	lla	t0, __bss_start
	lla	t1, __bss_end
1:	bgeu	t0, t1, 2f
	sd	zero, 0(t0)
	addi	t0, t0, 8
	j	1b
2:
	lla	sp, stack_top
	mv	s0, a0				/* hart id */

	lla	t0, ta_len
	sw	zero, 0(t0)
	lla	t0, ta_pos
	sw	zero, 0(t0)

	li	s2, 0				/* previous char was CR */
	lla	s3, line_buf

	lla	a0, str_banner1
	jal	puts
	mv	a0, s0
	jal	put_dec
	lla	a0, str_banner2
	jal	puts
	/* virtio probe: one line per virtio-input / virtio-gpu device found */
	call	tk_probe
	/* fall through into the shell */

/*
 * Shell main loop.
 * Global registers: s1 = line length, s2 = previous char was CR,
 * s3 = line buffer. s4..s9 are scratch for the command handlers.
 * The helper routines are leaves that only use a*, t* and the stack (getc
 * also calls tk_input_idle in virtio.c, which preserves s*).
 */
prompt:
	lla	a0, str_prompt
	jal	puts
	li	s1, 0
read_loop:
	jal	getc				/* a0 = received char */
	li	t0, CH_CR
	beq	a0, t0, on_cr
	li	t0, CH_LF
	beq	a0, t0, on_lf
	li	s2, 0
	li	t0, CH_CTRLC
	beq	a0, t0, on_ctrlc
	li	t0, CH_BS
	beq	a0, t0, on_bs
	li	t0, CH_DEL
	beq	a0, t0, on_bs
	li	t0, 0x20			/* ignore other control chars */
	bltu	a0, t0, read_loop
	li	t0, 0x7f			/* and non-ASCII bytes */
	bgeu	a0, t0, read_loop
	li	t0, LINE_MAX			/* line full: drop, no echo */
	bgeu	s1, t0, read_loop
	add	t1, s3, s1
	sb	a0, 0(t1)
	addi	s1, s1, 1
	jal	putc				/* echo */
	j	read_loop

on_bs:
	beqz	s1, read_loop
	addi	s1, s1, -1
	lla	a0, str_bs
	jal	puts
	j	read_loop

on_ctrlc:
	lla	a0, str_ctrlc
	jal	puts
	j	prompt

on_lf:
	beqz	s2, on_eol			/* bare LF ends the line */
	li	s2, 0				/* LF of a CRLF: ignore */
	j	read_loop

on_cr:
	li	s2, 1
on_eol:
	lla	a0, str_crlf
	jal	puts
	add	t1, s3, s1
	sb	zero, 0(t1)			/* NUL-terminate the line */

	/* Parse: skip spaces, first word = [s5, s5+s6), s4 = index after it,
	 * s7 = index of the argument (after one or more spaces). */
	li	s4, 0
	li	t3, ' '
1:	bgeu	s4, s1, prompt			/* empty / blank line */
	add	t1, s3, s4
	lbu	t2, 0(t1)
	bne	t2, t3, 2f
	addi	s4, s4, 1
	j	1b
2:	mv	s5, s4
3:	bgeu	s4, s1, 4f
	add	t1, s3, s4
	lbu	t2, 0(t1)
	beq	t2, t3, 4f
	addi	s4, s4, 1
	j	3b
4:	sub	s6, s4, s5			/* word length */
	add	s5, s3, s5			/* word pointer */
	mv	s7, s4
5:	bgeu	s7, s1, 6f
	add	t1, s3, s7
	lbu	t2, 0(t1)
	bne	t2, t3, 6f
	addi	s7, s7, 1
	j	5b
6:
	/* Dispatch. */
	mv	a0, s5
	mv	a1, s6
	lla	a2, name_help
	jal	word_eq
	bnez	a0, cmd_help

	mv	a0, s5
	mv	a1, s6
	lla	a2, name_echo
	jal	word_eq
	bnez	a0, cmd_echo

	mv	a0, s5
	mv	a1, s6
	lla	a2, name_panic
	jal	word_eq
	bnez	a0, cmd_panic

	mv	a0, s5
	mv	a1, s6
	lla	a2, name_flood
	jal	word_eq
	bnez	a0, cmd_flood

	mv	a0, s5
	mv	a1, s6
	lla	a2, name_poweroff
	jal	word_eq
	bnez	a0, cmd_poweroff

	mv	a0, s5
	mv	a1, s6
	lla	a2, name_exit
	jal	word_eq
	bnez	a0, cmd_exit

	mv	a0, s5
	mv	a1, s6
	lla	a2, name_input
	jal	word_eq
	bnez	a0, cmd_input

	mv	a0, s5
	mv	a1, s6
	lla	a2, name_gfx
	jal	word_eq
	bnez	a0, cmd_gfx

	/* unknown command: WORD */
	lla	a0, str_unknown
	jal	puts
	mv	a0, s5
	mv	a1, s6
	jal	putn
	lla	a0, str_crlf
	jal	puts
	j	prompt

/* help */
cmd_help:
	lla	a0, str_help
	jal	puts
	j	prompt

/* echo TEXT: TEXT is everything after the single space following "echo" */
cmd_echo:
	bgeu	s4, s1, 1f			/* plain "echo" */
	addi	s4, s4, 1			/* skip the one separator space */
1:	add	a0, s3, s4
	sub	a1, s1, s4
	jal	putn
	lla	a0, str_crlf
	jal	puts
	j	prompt

/* input: which virtio-input devices are present (virtio.c) */
cmd_input:
	call	tk_cmd_input
	j	prompt

/* gfx: draw the test pattern on the virtio-gpu scanout (virtio.c) */
cmd_gfx:
	call	tk_cmd_gfx
	j	prompt

/* panic: print the panic line and stop forever */
cmd_panic:
	lla	a0, str_panic
	jal	puts
	j	halt

/* poweroff */
cmd_poweroff:
	lla	a0, str_poweroff
	jal	puts
	li	t0, TEST_BASE
	li	t1, TEST_PASS
	sw	t1, 0(t0)
	j	halt

/* exit N: N in 1..255, anything else means 1 */
cmd_exit:
	add	a0, s3, s7
	jal	parse_num
	beqz	a1, 1f
	beqz	a0, 1f
	li	t0, 255
	bleu	a0, t0, 2f
1:	li	a0, 1
2:	mv	s4, a0
	lla	a0, str_exiting
	jal	puts
	mv	a0, s4
	jal	put_dec
	lla	a0, str_crlf
	jal	puts
	slli	t1, s4, 16
	li	t2, TEST_FAIL
	or	t1, t1, t2
	li	t0, TEST_BASE
	sw	t1, 0(t0)
	j	halt

/*
 * flood N: print exactly N bytes of the pattern, 64-byte lines:
 * "%08d " + "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQR" + "\n"
 * (the last line may be cut short). The UART is polled for Ctrl-C before
 * every line; other chars received meanwhile go to the typeahead buffer.
 */
cmd_flood:
	add	a0, s3, s7
	jal	parse_num
	bnez	a1, 1f
	lla	a0, str_flood_usage
	jal	puts
	j	prompt
1:	mv	s4, a0				/* bytes remaining */
	mv	s5, a0				/* total, for "flood done N" */
	lla	s6, flood_line
	li	s7, UART_BASE

	/* build the first line: "00000000 " + alphabet + "\n" */
	mv	t2, s6
	li	t0, '0'
	li	t1, 8
2:	sb	t0, 0(t2)
	addi	t2, t2, 1
	addi	t1, t1, -1
	bnez	t1, 2b
	li	t0, ' '
	sb	t0, 0(t2)
	addi	t2, t2, 1
	lla	t3, str_alpha
	li	t1, 54
3:	lbu	t0, 0(t3)
	sb	t0, 0(t2)
	addi	t3, t3, 1
	addi	t2, t2, 1
	addi	t1, t1, -1
	bnez	t1, 3b
	li	t0, CH_LF
	sb	t0, 0(t2)

	/* THR empty means the whole transmitter is free: with the FIFO enabled
	 * (IIR bits 7:6 = 11, as OpenSBI sets it up) that is room for 16
	 * bytes, otherwise (FIFO off, e.g. -bios none) for one. */
	li	s9, 1
	lbu	t0, UART_IIR(s7)
	andi	t0, t0, IIR_FIFO
	li	t1, IIR_FIFO
	bne	t0, t1, flood_loop
	li	s9, UART_FIFO_SIZE

flood_loop:
	beqz	s4, flood_done
	/* between lines: Ctrl-C? */
	lbu	t0, UART_LSR(s7)
	andi	t0, t0, LSR_DR
	beqz	t0, 4f
	lbu	a0, UART_RBR(s7)
	li	t0, CH_CTRLC
	beq	a0, t0, flood_cancel
	jal	typeahead_push
4:	/* emit min(64, remaining) bytes of the current line, up to s9
	 * bytes per THR-empty poll */
	mv	s8, s4
	li	t0, 64
	bleu	s8, t0, 5f
	li	s8, 64
5:	sub	s4, s4, s8
	mv	t2, s6
6:	lbu	t0, UART_LSR(s7)
	andi	t0, t0, LSR_THRE
	beqz	t0, 6b
	mv	t3, s9
9:	lbu	t1, 0(t2)
	sb	t1, UART_THR(s7)
	addi	t2, t2, 1
	addi	s8, s8, -1
	beqz	s8, 10f
	addi	t3, t3, -1
	bnez	t3, 9b
	j	6b
10:	/* increment the 8-digit decimal line number (wraps at 10^8) */
	addi	t2, s6, 7
	li	t3, '9'
7:	lbu	t0, 0(t2)
	addi	t0, t0, 1
	bleu	t0, t3, 8f
	li	t0, '0'
	sb	t0, 0(t2)
	beq	t2, s6, flood_loop
	addi	t2, t2, -1
	j	7b
8:	sb	t0, 0(t2)
	j	flood_loop

flood_done:
	lla	a0, str_flood_done		/* "\r\nflood done " */
	jal	puts
	mv	a0, s5
	jal	put_dec
	lla	a0, str_crlf
	jal	puts
	j	prompt

flood_cancel:
	/* Ctrl-C also discards anything typed ahead during the flood */
	lla	t0, ta_len
	sw	zero, 0(t0)
	lla	t0, ta_pos
	sw	zero, 0(t0)
	lla	a0, str_flood_ctrlc		/* "\r\n^C\r\n" */
	jal	puts
	j	prompt

/* stop forever: interrupts are never enabled, so this just idles */
halt:
	wfi
	j	halt

/* losing harts end up here */
park:
	wfi
	j	park

/* ------------------------------------------------------------------------ */
/* Leaf helpers: use only a*, t* (and the stack in put_dec). */

/* putc(a0 = char) */
putc:
	li	t0, UART_BASE
1:	lbu	t1, UART_LSR(t0)
	andi	t1, t1, LSR_THRE
	beqz	t1, 1b
	sb	a0, UART_THR(t0)
	ret

/* puts(a0 = NUL-terminated string) */
puts:
	li	t0, UART_BASE
1:	lbu	t2, 0(a0)
	beqz	t2, 3f
2:	lbu	t1, UART_LSR(t0)
	andi	t1, t1, LSR_THRE
	beqz	t1, 2b
	sb	t2, UART_THR(t0)
	addi	a0, a0, 1
	j	1b
3:	ret

/* putn(a0 = pointer, a1 = length) */
putn:
	li	t0, UART_BASE
1:	beqz	a1, 3f
	lbu	t2, 0(a0)
2:	lbu	t1, UART_LSR(t0)
	andi	t1, t1, LSR_THRE
	beqz	t1, 2b
	sb	t2, UART_THR(t0)
	addi	a0, a0, 1
	addi	a1, a1, -1
	j	1b
3:	ret

/* put_dec(a0 = unsigned 64-bit value): print in decimal */
put_dec:
	addi	sp, sp, -32
	addi	t2, sp, 32			/* digits are built backwards */
	li	t1, 10
1:	remu	t0, a0, t1
	divu	a0, a0, t1
	addi	t0, t0, '0'
	addi	t2, t2, -1
	sb	t0, 0(t2)
	bnez	a0, 1b
	li	t3, UART_BASE
	addi	t4, sp, 32
2:	lbu	t0, UART_LSR(t3)
	andi	t0, t0, LSR_THRE
	beqz	t0, 2b
	lbu	t1, 0(t2)
	sb	t1, UART_THR(t3)
	addi	t2, t2, 1
	bne	t2, t4, 2b
	addi	sp, sp, 32
	ret

/* getc() -> a0: next char, from the typeahead buffer first, else the UART
 * (blocking, polled). Only the shell's read loop calls it: while the UART
 * is idle it lets tk_input_idle(s3 = line, s1 = length) print pending
 * virtio-input events (and reprint the prompt and the partial line). */
getc:
	lla	t0, ta_pos
	lw	t1, 0(t0)
	lla	t2, ta_len
	lw	t3, 0(t2)
	bgeu	t1, t3, 2f
	lla	t4, ta_buf
	add	t4, t4, t1
	lbu	a0, 0(t4)
	addi	t1, t1, 1
	bne	t1, t3, 1f
	sw	zero, 0(t0)			/* drained: reset */
	sw	zero, 0(t2)
	ret
1:	sw	t1, 0(t0)
	ret
2:	li	t0, UART_BASE
	lbu	t1, UART_LSR(t0)
	andi	t1, t1, LSR_DR
	bnez	t1, 3f
	addi	sp, sp, -16
	sd	ra, 0(sp)
	mv	a0, s3
	mv	a1, s1
	call	tk_input_idle
	ld	ra, 0(sp)
	addi	sp, sp, 16
	j	2b
3:	lbu	a0, UART_RBR(t0)
	ret

/* typeahead_push(a0 = char): append, dropped when full */
typeahead_push:
	lla	t0, ta_len
	lw	t1, 0(t0)
	li	t2, TA_MAX
	bgeu	t1, t2, 1f
	lla	t3, ta_buf
	add	t3, t3, t1
	sb	a0, 0(t3)
	addi	t1, t1, 1
	sw	t1, 0(t0)
1:	ret

/* word_eq(a0 = word, a1 = word length, a2 = NUL-terminated name) -> a0 = 1
 * if equal, else 0 */
word_eq:
1:	lbu	t0, 0(a2)
	beqz	a1, 2f
	beqz	t0, 3f
	lbu	t1, 0(a0)
	bne	t0, t1, 3f
	addi	a0, a0, 1
	addi	a1, a1, -1
	addi	a2, a2, 1
	j	1b
2:	seqz	a0, t0
	ret
3:	li	a0, 0
	ret

/* parse_num(a0 = string ending at NUL or space) -> a0 = value, a1 = 1 if
 * it is 1..18 decimal digits, else a0 = 0, a1 = 0 */
parse_num:
	li	t0, 0
	li	t1, 0
	li	t4, 10
	li	t3, ' '
1:	lbu	t2, 0(a0)
	beqz	t2, 2f
	beq	t2, t3, 2f
	addi	t2, t2, -'0'
	bgeu	t2, t4, 3f
	mul	t0, t0, t4
	add	t0, t0, t2
	addi	t1, t1, 1
	addi	a0, a0, 1
	j	1b
2:	beqz	t1, 3f
	li	t2, 18
	bgtu	t1, t2, 3f
	mv	a0, t0
	li	a1, 1
	ret
3:	li	a0, 0
	li	a1, 0
	ret

/* ------------------------------------------------------------------------ */
	.section .rodata, "a", @progbits
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
str_flood_usage: .asciz	"usage: flood N\r\n"
str_flood_done:	.asciz	"\r\nflood done "
str_flood_ctrlc: .asciz	"\r\n^C\r\n"
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

/* In .data (part of the image), so it starts at 0 without clearing .bss. */
	.section .data, "aw", @progbits
	.balign	4
boot_lottery:	.word	0

	.section .bss, "aw", @nobits
	.balign	16
stack:		.space	STACK_SIZE
stack_top:
ta_len:		.space	4
ta_pos:		.space	4
ta_buf:		.space	TA_MAX
flood_line:	.space	64
line_buf:	.space	LINE_MAX + 1
