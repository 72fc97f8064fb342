package x86_64

import (
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/archtest"
)

// The debugger is the architecture's Instructions and prologue scanner.
var (
	_ arch.Instructions = debugger{}
	_ interface {
		Standard() arch.Prologue
		PrologueScan() int
		ScanPrologue([]byte) arch.Prologue
	} = debugger{}
)

const textAddr = 0xffffffff81000000

// TestDisassemble checks instructions a kernel is made of, and those
// x86asm writes otherwise than objdump, against the text binutils 2.40's
// objdump gives them at textAddr.
func TestDisassemble(t *testing.T) {
	for _, c := range []struct{ code, want string }{
		{"55", "push %rbp"},
		{"48 89 e5", "mov %rsp,%rbp"},
		{"f3 0f 1e fa", "endbr64"},
		{"0f 1f 44 00 00", "nopl 0x0(%rax,%rax,1)"},
		{"66 66 2e 0f 1f 84 00 00 00 00 00", "data16 cs nopw 0x0(%rax,%rax,1)"},
		{"66 90", "xchg %ax,%ax"},
		{"e8 00 00 00 00", "call ffffffff81000005"},
		{"e9 00 00 00 00", "jmp ffffffff81000005"},
		{"eb fe", "jmp ffffffff81000000"},
		{"0f 84 00 01 00 00", "je ffffffff81000106"},
		{"41 ff d3", "call *%r11"},
		{"ff 14 25 00 10 00 00", "call *0x1000"},
		{"ff 15 10 00 00 00", "call *0x10(%rip) # ffffffff81000016"},
		{"ff 50 08", "call *0x8(%rax)"},
		{"ff 94 24 80 00 00 00", "call *0x80(%rsp)"},
		{"ff e0", "jmp *%rax"},
		{"48 8b 04 c5 c0 56 94 81", "mov -0x7e6ba940(,%rax,8),%rax"},
		{"4c 8d 24 dd 00 00 00 00", "lea 0x0(,%rbx,8),%r12"},
		{"65 48 8b 04 25 28 00 00 00", "mov %gs:0x28,%rax"},
		{"65 48 8b 05 f8 0a f8 7e", "mov %gs:0x7ef80af8(%rip),%rax # fffffffffff80b00"},
		{"48 8b 45 00", "mov 0x0(%rbp),%rax"},
		{"49 8b 04 24", "mov (%r12),%rax"},
		{"41 c6 44 24 ff 00", "movb $0x0,-0x1(%r12)"},
		{"48 83 e4 f0", "and $0xfffffffffffffff0,%rsp"},
		{"48 83 c4 80", "add $0xffffffffffffff80,%rsp"},
		{"48 81 ec 80 00 00 00", "sub $0x80,%rsp"},
		{"48 c7 c0 ff ff ff ff", "mov $0xffffffffffffffff,%rax"},
		{"48 b8 ff 0f 00 00 00 00 f0 ff", "movabs $0xfff0000000000fff,%rax"},
		{"66 a3 72 04 00 00 80 88 ff ff", "movabs %ax,0xffff888000000472"},
		{"f0 0f b1 0a", "lock cmpxchg %ecx,(%rdx)"},
		{"87 07", "xchg %eax,(%rdi)"},
		{"3e 0f ae 38", "ds clflush (%rax)"},
		{"f3 48 ab", "rep stos %rax,%es:(%rdi)"},
		{"f3 a4", "rep movsb %ds:(%rsi),%es:(%rdi)"},
		{"48 63 d2", "movslq %edx,%rdx"},
		{"48 98", "cltq"},
		{"c9", "leave"},
		{"9c", "pushf"},
		{"c3", "ret"},
		{"cc", "int3"},
		{"0f 0b", "ud2"},
		{"0f 05", "syscall"},
		{"0f 01 f8", "swapgs"},
		{"48 cf", "iretq"},
		{"0f 07", "sysretl"},
		{"48 0f 07", "sysretq"},
		{"0f 30", "wrmsr"},
		{"0f 20 d8", "mov %cr3,%rax"},
		{"0f 22 d8", "mov %rax,%cr3"},
		{"0f 01 e8", "serialize"},
		{"0f 01 c8", "monitor %rax,%ecx,%edx"},
		{"48 0f c7 f8", "rdseed %rax"},
		{"c4 e2 f3 f7 c8", "shrx %rcx,%rax,%rcx"},
	} {
		code := archtest.Code(t, c.code)
		got := debugger{}.Disassemble(code, textAddr, 1, nil)
		if len(got) != 1 || got[0].Text != c.want || !got[0].Known || got[0].Encoding != c.code || got[0].Addr != textAddr {
			t.Errorf("%s: %+v, want %q", c.code, got, c.want)
		}
	}
}

// TestDisassembleSequence decodes a function's start as a debugger shows
// it: branch targets named, a count and the code's end obeyed, bytes no
// instruction starts with shown as data.
func TestDisassembleSequence(t *testing.T) {
	sym := func(a uint64) (string, uint64, bool) {
		if a >= 0xffffffff81001000 && a < 0xffffffff81001100 {
			return "__fentry__", a - 0xffffffff81001000, true
		}
		return "", 0, false
	}
	// endbr64; call __fentry__; push %rbp; mov %rsp,%rbp; je +0x10 (to
	// __fentry__+0x10, for the test's sake); jmp to an unnamed address.
	code := archtest.Code(t, "f3 0f 1e fa e8 f7 0f 00 00 55 48 89 e5 0f 84 f7 0f 00 00 eb 00")
	const addr = 0xffffffff81000000
	got := debugger{}.Disassemble(code, addr, 100, sym)
	want := []arch.Instruction{
		{Addr: addr, Encoding: "f3 0f 1e fa", Text: "endbr64", Known: true},
		{Addr: addr + 4, Encoding: "e8 f7 0f 00 00", Text: "call ffffffff81001000", Target: "__fentry__", Known: true},
		{Addr: addr + 9, Encoding: "55", Text: "push %rbp", Known: true},
		{Addr: addr + 10, Encoding: "48 89 e5", Text: "mov %rsp,%rbp", Known: true},
		{Addr: addr + 13, Encoding: "0f 84 f7 0f 00 00", Text: "je ffffffff8100100a", Target: "__fentry__+0xa", Known: true},
		{Addr: addr + 19, Encoding: "eb 00", Text: "jmp ffffffff81000015", Known: true},
	}
	archtest.Instructions(t, got, want)
	if got := (debugger{}).Disassemble(code, addr, 3, sym); len(got) != 3 {
		t.Errorf("count 3: %d instructions", len(got))
	}
	// Cut inside the mov: the push is the last whole instruction.
	if got := (debugger{}).Disassemble(code[:12], addr, 100, sym); len(got) != 3 || got[2].Text != "push %rbp" {
		t.Errorf("code cut in an instruction: %+v", got)
	}
	// 0x06 (push %es) is no instruction in 64-bit mode.
	bad := debugger{}.Disassemble(archtest.Code(t, "06 c3"), addr, 10, nil)
	if len(bad) != 2 || bad[0] != (arch.Instruction{Addr: addr, Encoding: "06", Text: ".byte 0x6"}) || bad[1].Text != "ret" || bad[1].Addr != addr+1 {
		t.Errorf("unknown byte: %+v", bad)
	}
	if d := (debugger{}); d.MaxInstruction() != 15 {
		t.Errorf("MaxInstruction() = %d", d.MaxInstruction())
	}
}
