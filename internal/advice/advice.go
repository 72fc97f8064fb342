// Package advice lets an error say what its caller can do about it, in
// words of no interface: an Action, with what the action needs. The layer
// that speaks to the caller says it in its own words (the MCP layer names
// its tools and their arguments); the error's own text stays as it is.
package advice

import "reflect"

// Action is what a caller can do about an error, named by what it does.
type Action string

// The actions the server's errors advise.
const (
	BootFirst           Action = "boot first"                  // no guest of that name yet (Name: the guest, if others exist)
	ShutdownOrRestart   Action = "shut down or restart"        // the guest runs already
	TooMany             Action = "stop one"                    // N: the limit
	BootAgainOutputKept Action = "boot again, output kept"     // QEMU exited
	WaitForBoot         Action = "wait for the boot"           // still booting
	BootAfterStop       Action = "boot once stopped"           // stopping
	BootAgain           Action = "boot again"                  // its boot did not start QEMU
	BootToStart         Action = "boot to start it"            // stopped
	StoppedOutputKept   Action = "stopped, output kept"        // a call ended by a stop
	Stopped             Action = "stopped"                     // a call ended by a stop, for another reason
	StartCapture        Action = "start a capture"             // none yet
	BootWithTAP         Action = "boot with a TAP"             // no TAP to capture on
	StopCapture         Action = "stop the capture"            // one runs
	BootLost            Action = "boot the lost guest"         // a restore lost it
	BootWithDisplay     Action = "boot with a display"         // no display
	ProjectArgument     Action = "the project argument"        // Keep: the error after "project root"
	RelativeToProject   Action = "relative to the project"     // Keep: the error, Name: the project
	AttachReadOnly      Action = "attach read-only"            // a file outside the project, writable
	ExtraArgument       Action = "the extra options argument"  // Keep: the error after its kind
	InExtraArguments    Action = "in the extra options"        // an option the server manages
	StopOwnGuest        Action = "stop your guest"             // Keep: who holds the lock
	AskOwner            Action = "ask the owner"               // Keep, Name: the user, N: the process
	StopHolder          Action = "stop the holder"             // Keep, N: the process
	ListSnapshots       Action = "list snapshots"              // no snapshot of that name
	GiveMachine         Action = "give the machine"            // several machines have one
	BootSnapshotMachine Action = "boot the snapshot's machine" // another machine than given
	BootFromSnapshot    Action = "boot from the snapshot"      // Name: the snapshot
	ReadOnlyOrQcow2     Action = "read-only or qcow2"          // a drive that cannot hold a snapshot
	DeleteSnapshots     Action = "delete snapshots"            // too little space
	SetBreakpoint       Action = "set a breakpoint"
	SetWatchpoint       Action = "set a watchpoint"
	RemoveWatchpoint    Action = "remove a watchpoint"       // too many
	ReadVirtual         Action = "read the virtual address"  // no physical reads
	RecordThenReplay    Action = "record, then replay"       // going back needs a recording
	StepBack            Action = "step back"                 // at the end of a recording
	MoveReplay          Action = "move the replay"           // a replay refuses changes
	PassKernel          Action = "pass a kernel"             // no built-in one
	PassSymbols         Action = "pass symbols"              // no built-in ones
	QueriesOnly         Action = "queries only"              // Name: the guest, Other: its recording
	TypeSlowly          Action = "type slowly"               // a recording guest did not echo
	ListRecordings      Action = "list recordings"           // no recording of that name
	ShutdownFirst       Action = "shut it down first"        // in use
	ReplayOwnMachine    Action = "replay on its own machine" // Keep: the error
	KeysOrConsole       Action = "keys or the console"       // a character with no key
	PersistentTAP       Action = "a persistent TAP"          // Name: the user it would be made for
)

// Advice is an Action and what it needs.
type Advice struct {
	Action Action
	// Name and Other are what the action is about: a guest, a snapshot,
	// a recording, a path, a user.
	Name, Other string
	// N is a number it needs: a limit, a process.
	N int
	// Keep is the error's own words where the advice rewrites its text
	// (say, names an argument where the error names a thing).
	Keep string
}

// Adviser is an error that knows what its caller can do next. An Advice
// with no Action gives none.
type Adviser interface {
	error
	Advice() Advice
}

// Found is an Adviser in an error's tree, and its advice.
type Found struct {
	Err    Adviser
	Advice Advice
}

// In lists the Advisers in err's tree, err first, then what it wraps
// (Unwrap() error and Unwrap() []error, depth first), each once, leaving
// out those that give no advice.
func In(err error) []Found {
	var out []Found
	seen := map[error]bool{}
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		if comparable(e) {
			if seen[e] {
				return
			}
			seen[e] = true
		}
		if a, ok := e.(Adviser); ok {
			if adv := a.Advice(); adv.Action != "" {
				out = append(out, Found{a, adv})
			}
		}
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		case interface{ Unwrap() []error }:
			for _, w := range u.Unwrap() {
				walk(w)
			}
		}
	}
	walk(err)
	return out
}

// comparable says whether e may be a map key: an error of an
// uncomparable type (a struct value holding a slice) would panic.
func comparable(e error) bool { return reflect.ValueOf(e).Comparable() }

// Error is a sentinel error that advises: errors.Is finds it by identity.
type Error struct {
	msg    string
	advice Advice
}

// New returns a sentinel error with text msg and advice a.
func New(msg string, a Advice) *Error { return &Error{msg: msg, advice: a} }

func (e *Error) Error() string  { return e.msg }
func (e *Error) Advice() Advice { return e.advice }

var _ Adviser = (*Error)(nil)
