package x86_64

import (
	"testing"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/internal/testkit/archtest"
)

func TestCall(t *testing.T) {
	for _, c := range []struct {
		code string
		n    int
		call bool
	}{
		{"e8 00 00 00 00", 5, true},
		{"ff d0", 2, true},             // call *%rax
		{"41 ff d3", 3, true},          // call *%r11
		{"ff 50 08", 3, true},          // call *0x8(%rax)
		{"ff 15 10 00 00 00", 6, true}, // call *0x10(%rip)
		{"41 ff 94 24 80 00 00 00", 8, true},
		{"ff 14 c5 00 10 00 00", 7, true}, // call *0x1000(,%rax,8)
		{"e9 00 00 00 00", 5, false},      // jmp
		{"ff e0", 2, false},               // jmp *%rax
		{"ff 18", 2, false},               // lcall *(%rax): pushes cs too
		{"c3", 1, false},
		{"55", 1, false},
		{"06", 0, false}, // no instruction
		{"e8 00", 0, false},
	} {
		n, call := debugger{}.Call(archtest.Code(t, c.code))
		if n != c.n || call != c.call {
			t.Errorf("Call(%s) = %d, %v, want %d, %v", c.code, n, call, c.n, c.call)
		}
	}
}

func TestCallBefore(t *testing.T) {
	// Fifteen bytes ending in each call, after the end of other code.
	pad := "48 89 e5 48 89 e5 48 89 e5 48 89 e5 48 89 e5 "
	tail := func(s string) []byte {
		b := archtest.Code(t, pad+s)
		return b[len(b)-15:]
	}
	for _, c := range []struct {
		code string
		call bool
	}{
		{"e8 12 34 56 78", true},
		{"ff d0", true},
		{"41 ff d3", true},
		{"ff 50 08", true},
		{"ff 15 10 00 00 00", true},
		{"41 ff 94 24 80 00 00 00", true},
		{"ff 14 c5 00 10 00 00", true},
		{"48 89 e5", false},
		{"e9 12 34 56 78", false},       // jmp
		{"ff e0", false},                // jmp *%rax
		{"e8 12 34 56 78 90", false},    // a call, then a nop
		{"48 8b 45 f8", false},          // mov -0x8(%rbp),%rax
		{"48 83 c4 08 5b 5d c3", false}, // an epilogue
	} {
		if got := (debugger{}).CallBefore(tail(c.code)); got != c.call {
			t.Errorf("CallBefore(...%s) = %v, want %v", c.code, got, c.call)
		}
	}
	if (debugger{}).CallBefore(nil) {
		t.Error("CallBefore(nil) = true")
	}
	// Fewer bytes than MaxInstruction, at the start of memory.
	if !(debugger{}).CallBefore(archtest.Code(t, "ff d0")) {
		t.Error("CallBefore(ff d0) = false")
	}
}

func TestAccess(t *testing.T) {
	for _, c := range []struct {
		code string
		want arch.MemAccess
		ok   bool
	}{
		{"48 8b 10", arch.MemAccess{Len: 3, Size: 8, Base: "rax"}, true},                                         // mov (%rax),%rdx
		{"8b 53 08", arch.MemAccess{Len: 3, Size: 4, Base: "rbx", Offset: 8}, true},                              // mov 0x8(%rbx),%edx
		{"89 43 08", arch.MemAccess{Len: 3, Size: 4, Base: "rbx", Offset: 8, Store: true}, true},                 // mov %eax,0x8(%rbx)
		{"01 07", arch.MemAccess{Len: 2, Size: 4, Base: "rdi", Store: true}, true},                               // add %eax,(%rdi)
		{"48 c7 45 f8 00 00 00 00", arch.MemAccess{Len: 8, Size: 8, Base: "rbp", Offset: -8, Store: true}, true}, // movq $0x0,-0x8(%rbp)
		{"f0 0f b1 0a", arch.MemAccess{Len: 4, Size: 4, Base: "rdx", Store: true}, true},                         // lock cmpxchg %ecx,(%rdx)
		{"87 07", arch.MemAccess{Len: 2, Size: 4, Base: "rdi", Store: true}, true},                               // xchg %eax,(%rdi)
		{"48 87 07", arch.MemAccess{Len: 3, Size: 8, Base: "rdi", Store: true}, true},                            // xchg %rax,(%rdi)
		{"f0 48 0f c1 07", arch.MemAccess{Len: 5, Size: 8, Base: "rdi", Store: true}, true},                      // lock xadd %rax,(%rdi)
		{"41 0f b6 44 24 0c", arch.MemAccess{Len: 6, Size: 1, Base: "r12", Offset: 12}, true},                    // movzbl 0xc(%r12),%eax
		{"41 c6 44 24 ff 00", arch.MemAccess{Len: 6, Size: 1, Base: "r12", Offset: -1, Store: true}, true},       // movb $0x0,-0x1(%r12)
		{"48 39 85 70 ff ff ff", arch.MemAccess{Len: 7, Size: 8, Base: "rbp", Offset: -0x90}, true},              // cmp %rax,-0x90(%rbp)
		{"f6 83 14 fe ff ff 04", arch.MemAccess{Len: 7, Size: 1, Base: "rbx", Offset: -0x1ec}, true},             // testb $0x4,-0x1ec(%rbx)
		{"ff 50 08", arch.MemAccess{Len: 3, Size: 8, Base: "rax", Offset: 8}, true},                              // call *0x8(%rax)
		{"ff 40 34", arch.MemAccess{Len: 3, Size: 4, Base: "rax", Offset: 0x34, Store: true}, true},              // incl 0x34(%rax)
		{"0f 11 07", arch.MemAccess{Len: 3, Size: 16, Base: "rdi", Store: true}, true},                           // movups %xmm0,(%rdi)
		{"48 8b 04 c5 c0 56 94 81", arch.MemAccess{}, false},                                                     // an index
		{"48 8b 14 01", arch.MemAccess{}, false},                                                                 // mov (%rcx,%rax,1),%rdx
		{"48 8b 05 26 4f ac 00", arch.MemAccess{}, false},                                                        // RIP-relative
		{"65 48 8b 04 25 28 00 00 00", arch.MemAccess{}, false},                                                  // %gs:0x28
		{"65 48 8b 03", arch.MemAccess{}, false},                                                                 // mov %gs:(%rbx),%rax
		{"48 8d 43 08", arch.MemAccess{}, false},                                                                 // lea
		{"0f 1f 44 00 00", arch.MemAccess{}, false},                                                              // nop
		{"48 89 e5", arch.MemAccess{}, false},                                                                    // registers only
		{"55", arch.MemAccess{}, false},                                                                          // push: no operand
		{"f3 48 ab", arch.MemAccess{}, false},                                                                    // rep stos
		{"67 8b 00", arch.MemAccess{}, false},                                                                    // mov (%eax),%eax
	} {
		got, ok := debugger{}.Access(archtest.Code(t, c.code))
		if ok != c.ok || got != c.want {
			t.Errorf("Access(%s) = %+v, %v, want %+v, %v", c.code, got, ok, c.want, c.ok)
		}
	}
}
