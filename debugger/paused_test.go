package debugger

import (
	"context"
	"testing"
	"time"
)

// Paused stops a running guest through the session for f and resumes it
// after; a pause that meets a breakpoint hit (the guest stopped on its
// own as the interrupt came) leaves the guest stopped there and the hit
// for the next call to report, instead of resuming past it unseen.
func TestPaused(t *testing.T) {
	g := newFakeGuest(t, 1, "start_kernel", "sys_newuname")
	g.running = true
	s := g.session()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ran := 0
	f := func() error { ran++; return nil }
	// Not connected: f runs as it is, and the caller pauses the guest.
	if err := s.Paused(ctx, f); err != nil || ran != 1 || g.resumes != 0 {
		t.Fatalf("unconnected: err %v, ran %d, resumes %d", err, ran, g.resumes)
	}
	if _, err := s.Break(ctx, "sys_newuname", false, false); err != nil {
		t.Fatal(err)
	}
	// resumes counts the guest's resumes so far; a resume has no reply,
	// so the stub counts it a moment after the call that sent it.
	resumes := func() int {
		time.Sleep(50 * time.Millisecond)
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.resumes
	}
	before := resumes()
	if err := s.Paused(ctx, f); err != nil || ran != 2 || resumes() != before+1 {
		t.Fatalf("a pause: err %v, ran %d, resumes %d then %d", err, ran, before, resumes())
	}
	if _, ok := s.Holding(ctx); ok {
		t.Fatal("the guest is held stopped after a pause")
	}

	g.harts[0].regs["pc"] = g.at("sys_newuname")
	g.mu.Lock()
	g.hitFirst = "T05thread:01;swbreak:;"
	g.mu.Unlock()
	before = resumes()
	if err := s.Paused(ctx, f); err != nil || ran != 3 {
		t.Fatalf("a pause that meets a hit: err %v, ran %d", err, ran)
	}
	if resumes() != before {
		t.Error("the guest was resumed past the breakpoint it hit")
	}
	st, ok := s.Holding(ctx)
	if !ok || st.Reason != "breakpoint" || st.Function != "sys_newuname" {
		t.Errorf("the hit after the pause: %+v, held %v", st, ok)
	}
}
