package advice

import (
	"errors"
	"fmt"
	"testing"
)

type quiet struct{}

func (quiet) Error() string  { return "quiet" }
func (quiet) Advice() Advice { return Advice{} }

// In finds every error in the tree that advises, outermost first, through
// wrapping and joining, each once, and leaves out advice with no action;
// an advising sentinel is still found by errors.Is.
func TestIn(t *testing.T) {
	a := New("a", Advice{Action: BootFirst})
	b := New("b", Advice{Action: PassKernel, Name: "k"})
	err := fmt.Errorf("outer: %w", errors.Join(fmt.Errorf("x: %w", a), b, quiet{}, fmt.Errorf("again: %w", a)))
	got := In(err)
	if len(got) != 2 || got[0].Err != a || got[1].Err != b || got[1].Advice.Name != "k" {
		t.Fatalf("In: %+v", got)
	}
	if !errors.Is(err, a) || errors.Is(err, New("a", Advice{Action: BootFirst})) {
		t.Errorf("errors.Is by identity: %v", errors.Is(err, a))
	}
	if In(nil) != nil || In(errors.New("plain")) != nil {
		t.Errorf("advice in errors that give none")
	}
}

type sliceErr struct{ parts []string }

func (sliceErr) Error() string  { return "parts" }
func (sliceErr) Advice() Advice { return Advice{Action: PassKernel} }

// An error of a type that cannot be a map key is walked all the same.
func TestInUncomparable(t *testing.T) {
	err := fmt.Errorf("x: %w", sliceErr{parts: []string{"a"}})
	if got := In(err); len(got) != 1 || got[0].Advice.Action != PassKernel {
		t.Fatalf("In: %+v", got)
	}
}
