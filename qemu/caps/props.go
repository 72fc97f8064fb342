package caps

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/qemu-mcp/qemu-mcp/boundary"
	"github.com/qemu-mcp/qemu-mcp/qemu"
)

// The property probe learns from a QEMU binary what package boundary needs
// to let device properties that name no host resource pass: the type of
// each property of the device classes a check names, and the values of
// the enumerations of its QMP schema. It asks QEMU for the classes it is
// asked about only, not for every class: listing them (qom-list-types)
// loads every module QEMU has, and a QEMU whose module directory holds
// modules of another build (QEMU 11.1 beside Debian 12's 7.2 finds 7.2's
// GL modules) aborts doing so; asking for one class loads its module only.
// Answers are kept per binary (path, size, modification time) in memory
// and in a cache file beside the capabilities', so a class is asked about
// once per binary.

// propsVersion changes whenever the property probe records something else.
const propsVersion = 1

// maxNotClasses bounds the names remembered as no device class.
const maxNotClasses = 256

// propsRetry is how long a failed probe is not tried again for the same
// classes.
const propsRetry = 30 * time.Second

// PropsConfig configures a PropProber.
type PropsConfig struct {
	// Binary is the QEMU whose properties are learnt; empty means
	// qemu.DefaultBinary from PATH.
	Binary string
	// CacheDir keeps what was learnt across runs (a file per binary
	// beside the capabilities' cache); empty means only in memory.
	CacheDir string
	// Timeout bounds one probe (one QEMU, started and asked); 0 means
	// 10 s.
	Timeout time.Duration
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// PropProber gives boundary the property types of one QEMU binary (it is
// a boundary.PropertySource). Safe for concurrent use.
type PropProber struct {
	cfg PropsConfig
	log *slog.Logger

	sem   chan struct{} // one probe at a time; guards the fields below
	key   Key
	table *propTable // published tables are never changed
	// failed are the classes (and "" for a probe that failed as a
	// whole) that could not be learnt lately, with why.
	failed map[string]failure

	// started counts the QEMUs started (tests).
	started atomic.Int64

	// others are the probers of other binaries (For), sharing cfg.
	othersMu sync.Mutex
	others   map[string]*PropProber
}

// For is the prober of binary, another QEMU (another architecture's),
// configured as p; p for p's own binary. The same binary gets the same
// prober, so what it learnt is asked once.
func (p *PropProber) For(binary string) *PropProber {
	if binary == "" || binary == p.cfg.Binary || p.cfg.Binary == "" && binary == qemu.DefaultBinary {
		return p
	}
	p.othersMu.Lock()
	defer p.othersMu.Unlock()
	if o, ok := p.others[binary]; ok {
		return o
	}
	cfg := p.cfg
	cfg.Binary = binary
	o := NewPropProber(cfg)
	if p.others == nil {
		p.others = map[string]*PropProber{}
	}
	p.others[binary] = o
	return o
}

type failure struct {
	err   error
	until time.Time
}

// NewPropProber returns a PropProber for cfg.Binary. It starts nothing:
// QEMU is asked when a class is first needed.
func NewPropProber(cfg PropsConfig) *PropProber {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	log := cmp.Or(cfg.Logger, slog.Default())
	return &PropProber{cfg: cfg, log: log, sem: make(chan struct{}, 1), failed: map[string]failure{}}
}

// propTable is what is known of one binary's properties, as cached.
type propTable struct {
	Binary       string    `json:"binary"`
	Size         int64     `json:"size"`
	ModTime      time.Time `json:"mtime"`
	ProbeVersion int       `json:"probe_version"`
	Version      string    `json:"version,omitempty"`
	Probed       time.Time `json:"probed_at"`
	// Millis is how long the last probe took.
	Millis int64 `json:"ms"`
	// Enums are the values of all the enumerations of the QMP schema.
	Enums []string `json:"enums"`
	// Classes are the device classes asked about, NotClasses the names
	// asked about that are none.
	Classes    map[string]*classProps `json:"classes"`
	NotClasses []string               `json:"not_classes,omitempty"`

	enums map[string]bool
	not   map[string]bool
}

type classProps struct {
	Abstract bool                `json:"abstract,omitempty"`
	Props    map[string]propType `json:"props"`
}

type propType struct {
	Type string `json:"type"`
	Desc string `json:"desc,omitempty"`
}

// Class, Type and EnumValue make a table a boundary.PropertyTypes.
func (t *propTable) Class(name string) bool { return t.Classes[name] != nil }

func (t *propTable) Type(class, prop string) (typ, desc string, ok bool) {
	c := t.Classes[class]
	if c == nil {
		return "", "", false
	}
	p, ok := c.Props[prop]
	return p.Type, p.Desc, ok
}

func (t *propTable) EnumValue(v string) bool { return t.enums[v] }

func (t *propTable) matches(k Key) bool {
	return t.Binary == k.Path && t.Size == k.Size && t.ModTime.Equal(k.ModTime) && t.ProbeVersion == propsVersion
}

func (t *propTable) knows(class string) bool { return t.Classes[class] != nil || t.not[class] }

// index builds the lookup sets from the lists.
func (t *propTable) index() *propTable {
	t.enums = make(map[string]bool, len(t.Enums))
	for _, v := range t.Enums {
		t.enums[v] = true
	}
	t.not = make(map[string]bool, len(t.NotClasses))
	for _, v := range t.NotClasses {
		t.not[v] = true
	}
	if t.Classes == nil {
		t.Classes = map[string]*classProps{}
	}
	return t
}

// merge returns a new table with what t and o know (o's answers win).
func (t *propTable) merge(o *propTable) *propTable {
	n := *t
	n.Classes = make(map[string]*classProps, len(t.Classes)+len(o.Classes))
	for k, v := range t.Classes {
		n.Classes[k] = v
	}
	for k, v := range o.Classes {
		n.Classes[k] = v
	}
	if o.Enums != nil {
		n.Enums, n.Version = o.Enums, o.Version
	}
	not := map[string]bool{}
	for _, v := range append(slices.Clone(t.NotClasses), o.NotClasses...) {
		if n.Classes[v] == nil && len(not) < maxNotClasses {
			not[v] = true
		}
	}
	n.NotClasses = make([]string, 0, len(not))
	for v := range not {
		n.NotClasses = append(n.NotClasses, v)
	}
	sort.Strings(n.NotClasses)
	if !o.Probed.IsZero() {
		n.Probed, n.Millis = o.Probed, o.Millis
	}
	return n.index()
}

// binary is the path of the QEMU binary.
func (p *PropProber) binary() (string, error) {
	bin := p.cfg.Binary
	if bin == "" {
		bin = qemu.DefaultBinary
	}
	if !strings.Contains(bin, "/") {
		return exec.LookPath(bin)
	}
	return bin, nil
}

func (p *PropProber) cacheFile(k Key) string { return cachePath(p.cfg.CacheDir, k, ".props.json") }

func (p *PropProber) readCache(k Key) *propTable {
	t := readJSON[propTable](p.cfg.CacheDir, p.cacheFile(k))
	if t == nil || !t.matches(k) || t.Enums == nil {
		return nil
	}
	return t.index()
}

// PropertyTypes returns the property types of the binary, knowing at least
// classes (each a device class of it or not), asking QEMU about the ones
// not known yet. It fails if QEMU could not be asked, or could not answer
// for one of classes.
func (p *PropProber) PropertyTypes(ctx context.Context, classes ...string) (boundary.PropertyTypes, error) {
	bin, err := p.binary()
	if err != nil {
		return nil, fmt.Errorf("QEMU binary: %w", err)
	}
	k, err := KeyOf(bin)
	if err != nil {
		return nil, fmt.Errorf("QEMU binary: %w", err)
	}
	select {
	case p.sem <- struct{}{}:
		defer func() { <-p.sem }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if p.key != k {
		p.key, p.table, p.failed = k, nil, map[string]failure{}
	}
	if p.table == nil {
		p.table = p.readCache(k)
	}
	missing := p.missing(classes)
	if p.table != nil && len(missing) == 0 {
		return p.table, nil
	}
	if err := p.recentFailure(missing); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	if p.cfg.CacheDir != "" {
		// Servers started together ask once; the other's answers are
		// read after the lock.
		unlock, err := lockFile(ctx, p.cacheFile(k)+".lock")
		if err != nil {
			return nil, fmt.Errorf("lock the property cache: %w", err)
		}
		defer unlock()
		if c := p.readCache(k); c != nil {
			if p.table == nil {
				p.table = c
			} else {
				p.table = p.table.merge(c)
			}
		}
		if missing = p.missing(classes); p.table != nil && len(missing) == 0 {
			return p.table, nil
		}
	}
	learnt, failed, err := p.ask(ctx, k, missing, p.table == nil)
	now := time.Now()
	if err != nil {
		p.failed[""] = failure{err, now.Add(propsRetry)}
		p.log.Warn("cannot learn QEMU's device property types", "binary", k.Path, "err", err)
		return nil, err
	}
	delete(p.failed, "")
	if p.table == nil {
		p.table = learnt
	} else {
		p.table = p.table.merge(learnt)
	}
	p.log.Info("learnt QEMU's device property types", "binary", k.Path, "classes", missing, "ms", learnt.Millis)
	if p.cfg.CacheDir != "" {
		if err := writeJSONAtomic(p.cacheFile(k), p.table); err != nil {
			p.log.Warn("cannot cache QEMU's device property types", "err", err)
		}
	}
	if len(failed) > 0 {
		var errs []error
		for _, c := range slices.Sorted(maps.Keys(failed)) {
			p.failed[c] = failure{failed[c], now.Add(propsRetry)}
			errs = append(errs, failed[c])
		}
		return nil, errors.Join(errs...)
	}
	return p.table, nil
}

// missing are the classes p.table does not know.
func (p *PropProber) missing(classes []string) []string {
	var out []string
	for _, c := range classes {
		if (p.table == nil || !p.table.knows(c)) && !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}

// recentFailure is why classes could not be learnt a moment ago.
func (p *PropProber) recentFailure(classes []string) error {
	now := time.Now()
	if f, ok := p.failed[""]; ok && now.Before(f.until) {
		return f.err
	}
	for _, c := range classes {
		if f, ok := p.failed[c]; ok && now.Before(f.until) {
			return f.err
		}
	}
	return nil
}

// qmpReply is one message QEMU's monitor sends.
type qmpReply struct {
	QMP *struct {
		Version struct {
			QEMU struct {
				Major, Minor, Micro int
			} `json:"qemu"`
			Package string `json:"package"`
		} `json:"version"`
	} `json:"QMP"`
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	Event string `json:"event"`
}

// errDied is QEMU ending under a question.
var errDied = errors.New("QEMU exited")

// session is one QEMU asked over QMP on its stdin and stdout: nothing on
// disk, no socket another user could reach.
type session struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	dec    *json.Decoder
	stderr *qemu.Tail
	done   chan struct{}
	stop   func() bool
	greet  qmpReply
}

// start starts QEMU with no machine, paused, its monitor on stdio.
func (p *PropProber) start(ctx context.Context, bin string) (*session, error) {
	cmd := exec.Command(bin, "-machine", "none", "-nodefaults", "-display", "none", "-S", "-qmp", "stdio")
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	s := &session{cmd: cmd, in: in, dec: json.NewDecoder(out), stderr: qemu.NewTail(2048), done: make(chan struct{})}
	cmd.Stderr = s.stderr
	if err := qemu.StartProcess(cmd); err != nil {
		return nil, err
	}
	p.started.Add(1)
	// A deadline kills QEMU, which ends whatever read waits for it.
	s.stop = context.AfterFunc(ctx, func() { cmd.Process.Kill() })
	if err := s.read(&s.greet); err != nil || s.greet.QMP == nil {
		s.close()
		return nil, fmt.Errorf("%s did not greet on QMP: %w", bin, s.why(ctx, err))
	}
	if _, err := s.ask(ctx, "qmp_capabilities", nil); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *session) read(m *qmpReply) error {
	for {
		*m = qmpReply{}
		if err := s.dec.Decode(m); err != nil {
			return err
		}
		if m.Event == "" {
			return nil
		}
	}
}

// ask runs a command; a *qmpError is QEMU's refusal, errDied its end.
func (s *session) ask(ctx context.Context, command string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	if _, err := s.in.Write(append(b, '\n')); err != nil {
		return nil, s.why(ctx, err)
	}
	var m qmpReply
	if err := s.read(&m); err != nil {
		return nil, s.why(ctx, err)
	}
	if m.Error != nil {
		return nil, &qmpError{m.Error.Class, m.Error.Desc}
	}
	return m.Return, nil
}

type qmpError struct{ class, desc string }

func (e *qmpError) Error() string { return e.class + ": " + e.desc }

// why explains a broken session: the deadline, or QEMU's end and last words.
func (s *session) why(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("no answer within the probe's time: %w", ctx.Err())
	}
	s.close()
	if w := strings.TrimSpace(s.stderr.String()); w != "" {
		return fmt.Errorf("%w (%v): %s", errDied, s.cmd.ProcessState, lastLine(w))
	}
	return fmt.Errorf("%w (%v): %v", errDied, s.cmd.ProcessState, err)
}

func lastLine(s string) string {
	lines := strings.Split(s, "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// close ends QEMU (politely if it still answers) and waits for it.
func (s *session) close() {
	select {
	case <-s.done:
		return
	default:
	}
	s.in.Write([]byte(`{"execute":"quit"}` + "\n"))
	s.in.Close()
	exited := make(chan struct{})
	go func() {
		s.cmd.Wait()
		close(exited)
	}()
	select {
	case <-exited:
	case <-time.After(time.Second):
		s.cmd.Process.Kill()
		<-exited
	}
	s.stop()
	close(s.done)
}

// ask starts QEMU and asks it about classes (and for its enumerations,
// with schema): a table of what it answered, and the classes it could not
// answer for. QEMU dying under one class is that class's failure; the
// others are asked of a new QEMU (three at most).
func (p *PropProber) ask(ctx context.Context, k Key, classes []string, schema bool) (*propTable, map[string]error, error) {
	begin := time.Now()
	t := &propTable{Binary: k.Path, Size: k.Size, ModTime: k.ModTime, ProbeVersion: propsVersion, Classes: map[string]*classProps{}}
	failed := map[string]error{}
	var s *session
	defer func() {
		if s != nil {
			s.close()
		}
	}()
	deaths := 0
	todo := slices.Clone(classes)
	for schema || len(todo) > 0 {
		if s == nil {
			var err error
			if s, err = p.start(ctx, k.Path); err != nil {
				return nil, nil, err
			}
		}
		var err error
		c := ""
		if schema {
			err = s.schema(ctx, t)
		} else {
			c = todo[0]
			err = s.class(ctx, t, c)
		}
		if err == nil {
			if schema {
				schema = false
			} else {
				todo = todo[1:]
			}
			continue
		}
		if !schema {
			failed[c] = fmt.Errorf("asking QEMU about %s: %w", c, err)
			todo = todo[1:]
		}
		died := errors.Is(err, errDied)
		switch {
		case ctx.Err() != nil:
		case died && deaths < 2:
			// That class (or the schema) killed it: a new QEMU for
			// the others.
			deaths++
			s.close()
			s = nil
			continue
		case !died && !schema:
			continue // QEMU answers, not about that class
		}
		if schema {
			return nil, nil, fmt.Errorf("asking QEMU for its enumerations: %w", err)
		}
		for _, c := range todo {
			failed[c] = fmt.Errorf("asking QEMU about %s: %w", c, err)
		}
		break
	}
	if s != nil {
		g := s.greet.QMP.Version
		t.Version = strings.TrimSpace(fmt.Sprintf("%d.%d.%d %s", g.QEMU.Major, g.QEMU.Minor, g.QEMU.Micro, g.Package))
		s.close()
		s = nil
	}
	t.Probed = time.Now().UTC()
	t.Millis = time.Since(begin).Milliseconds()
	return t.index(), failed, nil
}

// schema asks for the QMP schema and keeps the values of its enumerations
// (their names are hidden, so all values go into one set).
func (s *session) schema(ctx context.Context, t *propTable) error {
	raw, err := s.ask(ctx, "query-qmp-schema", nil)
	if err != nil {
		return err
	}
	var entries []struct {
		MetaType string   `json:"meta-type"`
		Values   []string `json:"values"`
		Members  []struct {
			Name string `json:"name"`
		} `json:"members"`
	}
	if err := json.Unmarshal(raw, &entries); err != nil {
		return fmt.Errorf("query-qmp-schema: %w", err)
	}
	set := map[string]bool{}
	for _, e := range entries {
		if e.MetaType != "enum" {
			continue
		}
		for _, v := range e.Values {
			set[v] = true
		}
		for _, m := range e.Members {
			set[m.Name] = true
		}
	}
	t.Enums = slices.Sorted(maps.Keys(set))
	return nil
}

// qomInternal are the properties every device has that are no settings.
var qomInternal = map[string]bool{"type": true, "realized": true, "hotplugged": true, "hotpluggable": true, "parent_bus": true}

// class asks about one class: device-list-properties answers for a
// concrete device class; for an abstract one (virtio-pci), or a class
// that is no device, it refuses, and qom-list-properties lists the class's
// own properties, a device class's among them "realized".
func (s *session) class(ctx context.Context, t *propTable, name string) error {
	type prop struct {
		Name        string `json:"name"`
		Type        string `json:"type"`
		Description string `json:"description"`
	}
	var props []prop
	abstract := false
	raw, err := s.ask(ctx, "device-list-properties", map[string]any{"typename": name})
	var qe *qmpError
	switch {
	case err == nil:
	case errors.As(err, &qe) && qe.class == "DeviceNotFound":
		t.NotClasses = append(t.NotClasses, name)
		return nil
	case errors.As(err, &qe):
		if raw, err = s.ask(ctx, "qom-list-properties", map[string]any{"typename": name}); err != nil {
			if errors.As(err, &qe) {
				t.NotClasses = append(t.NotClasses, name)
				return nil
			}
			return err
		}
		abstract = true
	default:
		return err
	}
	if err := json.Unmarshal(raw, &props); err != nil {
		return fmt.Errorf("properties of %s: %w", name, err)
	}
	c := &classProps{Abstract: abstract, Props: map[string]propType{}}
	device := !abstract
	for _, p := range props {
		if p.Name == "realized" {
			device = true
		}
		if !qomInternal[p.Name] {
			c.Props[p.Name] = propType{Type: p.Type, Desc: p.Description}
		}
	}
	if !device {
		t.NotClasses = append(t.NotClasses, name)
		return nil
	}
	t.Classes[name] = c
	return nil
}
