// Command qemu-mcp-bench measures qemu-mcp through its real MCP stdio path against
// the raw ceilings (QEMU alone, the bare FIFOs) in the same run, and prints
// a table with the ratios. Run it with scripts/bench.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/qemu-mcp/qemu-mcp/arch"
	"github.com/qemu-mcp/qemu-mcp/arch/archs"
	"github.com/qemu-mcp/qemu-mcp/internal/proc"
	"golang.org/x/sys/unix"
)

var (
	binary    = flag.String("bin", "bin/qemu-mcp", "qemu-mcp binary to measure")
	kernel    = flag.String("kernel", "testdata/images/tiny.bin", "the tiny kernel (for the raw runs)")
	echoes    = flag.Int("echoes", 200, "echo round trips per side")
	floodSize = flag.Int("flood", 4<<20, "bytes flooded for the throughput figure")
	soak      = flag.Duration("soak", time.Minute, "how long the guest floods while memory is sampled (0 skips)")
	boots     = flag.Int("boots", 10, "boots per side")
	floodRuns = flag.Int("flood-runs", 3, "flood runs per side, alternating")
	instances = flag.Int("instances", 8, "guests booted at once in one server (0 skips)")
	sizesOnly = flag.Bool("sizes", false, "print only the table of result sizes")
	starts    = flag.Int("starts", 20, "server starts per side for the start-up figure")
	startOnly = flag.Bool("start-only", false, "measure only the start-up against the reference server")
	execOnly  = flag.Bool("exec-only", false, "measure only guest_exec and 9p shares on the Linux guest")
	echoOnly  = flag.Bool("echo-only", false, "measure only the echo, the raw echo and the call floor (repeat it on a busy machine)")
	serverLog = flag.String("server-log", "warn", "the servers' -log-level (their log goes to stderr)")
	floodOnly = flag.Bool("flood-only", false, "measure only the flood against the raw readers")
	snapOnly  = flag.Bool("snapshot-only", false, "measure only the Linux guest's cold boot, restores and boots from a snapshot")
)

const banner = "qemu-mcp tiny kernel 1.0"

type row struct {
	name, ours, raw, ratio, target string
}

func main() {
	flag.Parse()
	if err := setGuestArch(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(2)
	}
	// The raw readers are fastest on one scheduler P (no second thread
	// woken to spin each time a read readies the reading goroutine:
	// 0.547 ms against 0.580 for the best of them on two, in one run
	// here), so the ceilings are measured so. The servers measured get
	// the environment as it is and choose for themselves.
	if _, set := os.LookupEnv("GOMAXPROCS"); !set {
		runtime.GOMAXPROCS(1)
	}
	ctx := context.Background()
	fail := func(what string, err error) {
		fmt.Fprintf(os.Stderr, "bench: %s: %v\n", what, err)
		os.Exit(1)
	}
	// only prints the table of one -X-only measurement, or fails with its error.
	only := func(rows []row, err error) {
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
			os.Exit(1)
		}
		printTable(rows)
	}
	if archOnly {
		only(archRows(ctx, fail))
		return
	}
	if *execOnly {
		only(execRows(ctx, *execRuns, *shareRuns))
		return
	}
	if *snapOnly {
		if err := learnServerOptions(ctx); err != nil {
			fail("the server's QEMU options", err)
		}
		only(snapshotRows(ctx, *snapRuns))
		return
	}
	if *ttOnly {
		only(timeTravelRows(ctx, *ttRuns))
		return
	}
	if *startOnly {
		ours, ref, list, refList, _, err := measureStart(ctx, *starts)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("start: qemu-mcp %s, reference %s, %s; to tools/list %s, %s, %s\n", ms(ours), ms(ref), ratio(ours, ref), ms(list), ms(refList), ratio(list, refList))
		return
	}
	sizes, err := resultSizes(ctx)
	if err != nil {
		fail("result sizes", err)
	}
	if *sizesOnly {
		printSizes(sizes)
		return
	}
	defer printSizes(sizes)
	var rows []row

	start, refStart, list, refList, rss, err := measureStart(ctx, *starts)
	if err != nil {
		fail("server start", err)
	}
	rows = append(rows, row{fmt.Sprintf("server start to initialize answered, median of %d (raw: a minimal go-sdk stdio server with one tool, started alternately)", *starts),
		ms(start), ms(refStart), ratio(start, refStart), "<= 1.5x the reference"})
	rows = append(rows, row{fmt.Sprintf("server start to tools/list answered (%d tools; the reference's 1), median of %d", listedTools, *starts),
		ms(list), ms(refList), ratio(list, refList), ""})
	rows = append(rows, row{"idle resident memory after initialize", mib(rss), "-", "-", "<= 20 MiB"})

	if err := learnServerOptions(ctx); err != nil {
		fail("the server's QEMU options", err)
	}
	if *floodOnly {
		printTable(floodRows(ctx, fail))
		return
	}
	erows, echoAlone := echoRows(ctx, fail)
	rows = append(rows, erows...)
	if *echoOnly {
		printTable(rows)
		return
	}

	rawBoot, err := rawBoot(*boots)
	if err != nil {
		fail("raw boot", err)
	}
	ourBoot, err := mcpBoot(ctx, *boots)
	if err != nil {
		fail("mcp boot", err)
	}
	rows = append(rows, row{fmt.Sprintf("boot to banner, median of %d", *boots), ms(median(ourBoot)), ms(median(rawBoot)),
		"+" + ms(median(ourBoot)-median(rawBoot)), "<= +30 ms"})
	rows = append(rows, floodRows(ctx, fail)...)

	if *instances > 0 {
		together, oneByOne, err := mcpInstances(ctx, *instances)
		if err != nil {
			fail("instances", err)
		}
		rawTogether, err := rawInstances(*instances)
		if err != nil {
			fail("raw instances", err)
		}
		time.Sleep(11 * time.Second) // the raw QEMUs are gone
		rows = append(rows, row{fmt.Sprintf("%d instances booted at once in one server, until all are at their prompt (raw: %d QEMUs alone at once)", *instances, *instances),
			ms(together), ms(rawTogether), ratio(together, rawTogether), ""})
		rows = append(rows, row{fmt.Sprintf("the same %d boots one after another, sum (raw: %d at once through qemu-mcp)", *instances, *instances),
			ms(oneByOne), ms(together), ratio(oneByOne, together), ""})
		busy, flooded, err := mcpEchoBesideFloods(ctx, *instances, *echoes)
		if err != nil {
			fail("echo beside floods", err)
		}
		rows = append(rows, row{fmt.Sprintf("echo round trip of one instance while %d others flood (%s flooded), median (raw: the same echo alone)", *instances-1, mib(flooded)),
			ms(median(busy)), ms(echoAlone), ratio(median(busy), echoAlone), ""})
	}

	if *soak > 0 {
		peak, idle, n, err := soakMemory(ctx, *soak)
		if err != nil {
			fail("soak", err)
		}
		rows = append(rows, row{fmt.Sprintf("peak RSS while the guest floods for %v (%s of output)", *soak, mib(n)), mib(peak), "idle " + mib(idle), "-", "bounded"})
	}
	if *debugRuns > 0 {
		drows, err := debugRows(ctx, *debugRuns)
		if err != nil {
			fail("debugger", err)
		}
		rows = append(rows, drows...)
	}
	if *execRuns > 0 {
		erows, err := execRows(ctx, *execRuns, *shareRuns)
		if err != nil {
			fail("guest_exec and shares", err)
		}
		rows = append(rows, erows...)
	}
	if *snapRuns > 0 {
		srows, err := snapshotRows(ctx, *snapRuns)
		if err != nil {
			fail("snapshots", err)
		}
		rows = append(rows, srows...)
	}
	printTable(rows)
}

// size is one tool result: JSON.stringify(structuredContent), what Claude
// Code shows the model, and the text content, what Gemini CLI shows it.
type size struct {
	call  string
	chars int
	text  int
}

// resultSizes calls each tool on what makes its result largest here,
// through the real binary over stdio.
func resultSizes(ctx context.Context) ([]size, error) {
	s, err := startServer(ctx)
	if err != nil {
		return nil, err
	}
	defer s.close()
	var out []size
	measure := func(name string, args map[string]any) error {
		res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			return err
		}
		if res.IsError {
			return fmt.Errorf("%s: tool error", name)
		}
		b, _ := json.Marshal(res.StructuredContent)
		var a bytes.Buffer
		enc := json.NewEncoder(&a)
		enc.SetEscapeHTML(false)
		if args == nil {
			args = map[string]any{}
		}
		enc.Encode(args)
		var text int
		for _, c := range res.Content {
			if t, ok := c.(*mcp.TextContent); ok {
				text += len(t.Text)
			}
		}
		out = append(out, size{name + " " + strings.TrimSpace(a.String()), len(b), text})
		return nil
	}
	lt, err := s.cs.ListTools(ctx, nil)
	if err != nil {
		return nil, err
	}
	b, _ := json.Marshal(lt.Tools)
	out = append(out, size{fmt.Sprintf("tools/list (%d tools, every turn)", len(lt.Tools)), len(b), 0})
	for _, c := range []struct {
		name string
		args map[string]any
	}{
		{"qemu_boot", map[string]any{"wait_for": `tiny> $`}},
		{"serial_send", map[string]any{"data": "flood 200000", "wait_for": `tiny> $`}},
		{"serial_send", map[string]any{"data": "flood 4000000", "wait_for": `tiny> $`, "timeout": 60}},
		{"serial_read", map[string]any{"since": 0}},
		{"serial_read", map[string]any{"since": 0, "max_bytes": 32768}},
		{"qemu_status", nil},
		{"qemu_list", nil},
		{"server_info", nil},
		{"qmp_command", map[string]any{"command": "query-status"}},
		{"qmp_command", map[string]any{"command": "query-qmp-schema"}},
		{"qemu_boot", map[string]any{"gdb": true, "restart": true, "wait_for": `tiny> $`}},
		{"debug_break", map[string]any{"location": "puts"}},
		{"serial_send", map[string]any{"data": "help"}},
		{"debug_continue", nil},
		{"debug_registers", nil},
		{"debug_backtrace", nil},
		{"debug_disassemble", map[string]any{"count": 256}},
		{"debug_memory", map[string]any{"location": "_start", "length": 65536}},
		{"debug_step", map[string]any{"over": true}},
		{"qemu_shutdown", nil},
	} {
		if err := measure(c.name, c.args); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// printSizes prints the result sizes beside Claude Code's limit of 25,000
// tokens; console text and JSON run at about 3 to 4 characters a token, so
// 3 is the cautious estimate.
func printSizes(sizes []size) {
	fmt.Printf("\n| result | characters of JSON.stringify(structuredContent) | tokens, at most about | share of Claude Code's 25,000 | characters of the text content |\n|---|---|---|---|---|\n")
	for _, z := range sizes {
		tok := z.chars / 3
		text := "-"
		if z.text > 0 {
			text = fmt.Sprint(z.text)
		}
		fmt.Printf("| `%s` | %d | %d | %.0f%% | %s |\n", z.call, z.chars, tok, 100*float64(tok)/25000, text)
	}
}

func printTable(rows []row) {
	host, _ := os.Hostname()
	cpu := "unknown cpu"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		if m := regexp.MustCompile(`model name\s*:\s*(.*)`).FindSubmatch(b); m != nil {
			cpu = string(m[1])
		}
	}
	bin := *qemuBin
	if *ttOnly {
		// The figures are the time-travel guest's, on its QEMU.
		bin = ttQEMU()
	}
	qv, _ := exec.Command(bin, "--version").Output()
	fmt.Printf("machine: %s, %s, %d cpus, %s\n\n", host, cpu, numCPU(), strings.SplitN(string(qv), "\n", 2)[0])
	fmt.Println("| measure | qemu-mcp | raw ceiling | ratio | target |")
	fmt.Println("|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Printf("| %s | %s | %s | %s | %s |\n", r.name, r.ours, r.raw, r.ratio, r.target)
	}
}

func numCPU() int {
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) == nil {
		return set.Count()
	}
	return 0
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d.Microseconds())/1000) }
func mib(n int64) string        { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
func rate(bps float64) string   { return fmt.Sprintf("%.3f MB/s", bps/1e6) }
func ratio(a, b time.Duration) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", float64(a)/float64(b))
}

func median(d []time.Duration) time.Duration { return pct(d, 50) }

func medianF(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[(len(s)-1)/2]
}

func pct(d []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[(len(s)-1)*p/100]
}

// --- the server over stdio ---

type server struct {
	cmd *exec.Cmd
	cs  *mcp.ClientSession
	dir string
}

// linuxGuestDir returns the directory of the riscv64 Linux guest
// scripts/build-linux caches, or "" after saying on stderr that the
// figures named by skipped are left out because there is none.
func linuxGuestDir(skipped string) string { return archGuestDir(archs.Default(), skipped) }

// archGuestDir is linuxGuestDir for architecture a's guest.
func archGuestDir(a arch.Arch, skipped string) string {
	out, err := exec.Command("scripts/build-linux", "--arch", a.Name(), "--print-dir").Output()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: no %s Linux guest (run scripts/build-linux --arch %s): %s skipped\n", a.Name(), a.Name(), skipped)
		return ""
	}
	return strings.TrimSpace(string(out))
}

// linuxServer starts a server allowed the Linux guest's directory, and
// returns it with the directory; no server (and no error) if there is no
// Linux guest, after saying that the figures named by skipped are left out.
func linuxServer(ctx context.Context, skipped string) (*server, string, error) {
	dir := archGuestDir(guestArch, skipped)
	if dir == "" {
		return nil, "", nil
	}
	s, err := startServer(ctx, "-allow-path", dir)
	return s, dir, err
}

func startServer(ctx context.Context, args ...string) (*server, error) {
	dir, err := os.MkdirTemp("", "qmb")
	if err != nil {
		return nil, err
	}
	q := *qemuBin
	if guestArch.Name() != archs.Default().Name() {
		q = guestArch.Name() + "=" + q
	}
	cmd := exec.Command(*binary, append([]string{"-log-level", *serverLog, "-qemu", q}, args...)...)
	cmd.Env = append(os.Environ(), "QEMU_MCP_RUNTIME_DIR="+dir, "QEMU_MCP_LOCK_FILE="+dir+"/bench.lock", "QEMU_MCP_STATE_DIR="+dir+"/state")
	cmd.Stderr = os.Stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &server{cmd: cmd, cs: cs, dir: dir}, nil
}

// bootedServer starts a server and boots the tiny kernel to its prompt.
func bootedServer(ctx context.Context) (*server, error) {
	s, err := startServer(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.boot(ctx, `tiny> $`); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *server) close() {
	s.cs.Close()
	os.RemoveAll(s.dir)
}

func (s *server) call(ctx context.Context, name string, args map[string]any, out any) error {
	res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		return err
	}
	if res.IsError {
		var b strings.Builder
		for _, c := range res.Content {
			if t, ok := c.(*mcp.TextContent); ok {
				b.WriteString(t.Text)
			}
		}
		return fmt.Errorf("%s: %s", name, b.String())
	}
	if out != nil {
		b, _ := json.Marshal(res.StructuredContent)
		return json.Unmarshal(b, out)
	}
	return nil
}

func (s *server) boot(ctx context.Context, waitFor string) error {
	return s.bootInstance(ctx, "default", waitFor)
}

func (s *server) bootInstance(ctx context.Context, name, waitFor string) error {
	var b struct {
		Matched bool `json:"matched"`
	}
	if err := s.call(ctx, "qemu_boot", withArch(map[string]any{"instance": name, "wait_for": waitFor, "timeout": 60, "restart": true}), &b); err != nil {
		return err
	}
	if !b.Matched {
		return fmt.Errorf("boot: %q not seen", waitFor)
	}
	return nil
}

// listedTools is how many tools the server listed in measureStart.
var listedTools int

// measureStart times qemu-mcp and the reference server from exec to
// initialize answered, alternately, so that the machine's drifts hit both;
// and on to tools/list answered (list, listRef).
func measureStart(ctx context.Context, n int) (ours, ref, list, listRef time.Duration, rss int64, err error) {
	var ds, rs, ls, lrs []time.Duration
	for i := 0; i < n+2; i++ {
		t := time.Now()
		s, err := startServer(ctx)
		if err != nil {
			return 0, 0, 0, 0, 0, err
		}
		d := time.Since(t)
		res, err := s.cs.ListTools(ctx, nil)
		if err != nil {
			return 0, 0, 0, 0, 0, err
		}
		l := time.Since(t)
		listedTools = len(res.Tools)
		if i == 0 {
			time.Sleep(200 * time.Millisecond)
			rss = vmRSS(s.cmd.Process.Pid)
		}
		s.close()
		t = time.Now()
		r, err := startRef(ctx)
		if err != nil {
			return 0, 0, 0, 0, 0, err
		}
		dr := time.Since(t)
		if _, err := r.cs.ListTools(ctx, nil); err != nil {
			return 0, 0, 0, 0, 0, err
		}
		lr := time.Since(t)
		r.close()
		if i >= 2 { // the first runs warm the page cache
			ds, rs, ls, lrs = append(ds, d), append(rs, dr), append(ls, l), append(lrs, lr)
		}
	}
	return median(ds), median(rs), median(ls), median(lrs), rss, nil
}

var refBinary = flag.String("ref", "bin/refserver", "the reference server (cmd/qemu-mcp-bench/refserver)")

// startRef starts the reference server.
func startRef(ctx context.Context) (*server, error) {
	cmd := exec.Command(*refBinary)
	cmd.Stderr = os.Stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		return nil, err
	}
	return &server{cmd: cmd, cs: cs}, nil
}

func vmRSS(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return n << 10
}

// procCost is a process's CPU time (user and system) and context
// switches (voluntary and not, all threads).
type procCost struct {
	cpu      time.Duration
	switches float64
}

func costOf(pid int) procCost {
	var c procCost
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
		// Fields after the command's closing parenthesis; utime and
		// stime are the 14th and 15th of the line, in clock ticks.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
		if len(f) > 12 {
			ut, _ := strconv.ParseInt(f[11], 10, 64)
			st, _ := strconv.ParseInt(f[12], 10, 64)
			c.cpu = time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ is 100
		}
	}
	tasks, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + t.Name() + "/status")
		if err != nil {
			continue
		}
		for _, m := range regexp.MustCompile(`(?m)^(?:non)?voluntary_ctxt_switches:\s+(\d+)`).FindAllSubmatch(b, -1) {
			n, _ := strconv.ParseFloat(string(m[1]), 64)
			c.switches += n
		}
	}
	return c
}

// echoesFrom times n echo round trips on one instance's console, the
// tokens numbered from seq.
func (s *server) echoesFrom(ctx context.Context, instance string, seq, n int) ([]time.Duration, error) {
	ds := make([]time.Duration, 0, n)
	for i := seq; i < seq+n; i++ {
		tok := "e" + strconv.Itoa(i)
		var w struct {
			Matched bool `json:"matched"`
		}
		t := time.Now()
		if err := s.call(ctx, "serial_send", map[string]any{"instance": instance, "data": "echo " + tok, "wait_for": tok + `\r\ntiny> $`, "timeout": 10}, &w); err != nil {
			return nil, err
		}
		ds = append(ds, time.Since(t))
		if !w.Matched {
			return nil, fmt.Errorf("echo %s not seen", tok)
		}
	}
	return ds, nil
}

// echoes times n echo round trips on one instance's console, after ten
// for warm-up.
func (s *server) echoes(ctx context.Context, instance string, n int) ([]time.Duration, error) {
	const warmUp = 10
	ds, err := s.echoesFrom(ctx, instance, 0, warmUp+n)
	if err != nil {
		return nil, err
	}
	return ds[warmUp:], nil
}

// mcpInstances boots n instances of the tiny kernel in one server: all at
// once (the time until every one is at its prompt), against n boots one
// after another (the sum of their times).
func mcpInstances(ctx context.Context, n int) (together, oneByOne time.Duration, err error) {
	s, err := startServer(ctx, "-max-instances", strconv.Itoa(n))
	if err != nil {
		return 0, 0, err
	}
	defer s.close()
	for i := range n {
		name := "s" + strconv.Itoa(i)
		t := time.Now()
		if err := s.bootInstance(ctx, name, `tiny> $`); err != nil {
			return 0, 0, err
		}
		oneByOne += time.Since(t)
		if err := s.call(ctx, "qemu_shutdown", map[string]any{"instance": name}, nil); err != nil {
			return 0, 0, err
		}
	}
	errs := make(chan error, n)
	t := time.Now()
	for i := range n {
		go func() { errs <- s.bootInstance(ctx, "p"+strconv.Itoa(i), `tiny> $`) }()
	}
	for range n {
		if e := <-errs; e != nil {
			err = e
		}
	}
	return time.Since(t), oneByOne, err
}

// mcpEchoBesideFloods times echoes on one instance while n-1 others of the
// same server flood their consoles without pause.
func mcpEchoBesideFloods(ctx context.Context, n, echoes int) ([]time.Duration, int64, error) {
	s, err := startServer(ctx, "-max-instances", strconv.Itoa(n))
	if err != nil {
		return nil, 0, err
	}
	defer s.close()
	for i := range n {
		if err := s.bootInstance(ctx, "g"+strconv.Itoa(i), `tiny> $`); err != nil {
			return nil, 0, err
		}
	}
	for i := 1; i < n; i++ {
		if err := s.call(ctx, "serial_send", map[string]any{"instance": "g" + strconv.Itoa(i), "data": "flood 100000000000"}, nil); err != nil {
			return nil, 0, err
		}
	}
	ds, err := s.echoes(ctx, "g0", echoes)
	if err != nil {
		return nil, 0, err
	}
	var flooded int64
	for i := 1; i < n; i++ {
		var st struct {
			SerialBytes int64 `json:"serial_bytes"`
		}
		if err := s.call(ctx, "qemu_status", map[string]any{"instance": "g" + strconv.Itoa(i)}, &st); err != nil {
			return nil, 0, err
		}
		flooded += st.SerialBytes
	}
	return ds, flooded, nil
}

func mcpBoot(ctx context.Context, n int) ([]time.Duration, error) {
	s, err := startServer(ctx)
	if err != nil {
		return nil, err
	}
	defer s.close()
	var ds []time.Duration
	for i := 0; i < n+1; i++ {
		t := time.Now()
		if err := s.boot(ctx, banner); err != nil {
			return nil, err
		}
		if i > 0 {
			ds = append(ds, time.Since(t))
		}
	}
	return ds, nil
}

// mcpFlood floods through the guest the way an agent reads a long output:
// one serial_send that waits for the end marker, then serial_read pages
// from the send's cursor, every byte checked against the kernel's pattern.
func mcpFlood(ctx context.Context, size int) (float64, error) {
	s, err := bootedServer(ctx)
	if err != nil {
		return 0, err
	}
	defer s.close()
	cmd := "flood " + strconv.Itoa(size)
	var sent struct {
		Matched     bool  `json:"matched"`
		OutputStart int64 `json:"output_start"`
		Cursor      int64 `json:"cursor"`
	}
	t := time.Now()
	if err := s.call(ctx, "serial_send", map[string]any{"data": cmd, "wait_for": "flood done " + strconv.Itoa(size) + `\r\n`, "timeout": 300, "max_bytes": 1}, &sent); err != nil {
		return 0, err
	}
	if !sent.Matched {
		return 0, fmt.Errorf("flood did not finish")
	}
	// The flood is over when the server has every byte, as the raw
	// reader's is when it has read the last: both are checked after.
	el := time.Since(t)
	var got bytes.Buffer
	// The send's output was cut to its last byte: its start is where the
	// send began (cursor minus everything).
	cursor := sent.Cursor - int64(size) - int64(len(cmd)) - 64
	if cursor < 0 {
		cursor = 0
	}
	for cursor < sent.Cursor {
		var r struct {
			Output string `json:"output"`
			Cursor int64  `json:"cursor"`
		}
		if err := s.call(ctx, "serial_read", map[string]any{"since": cursor, "max_bytes": 32 << 10, "raw": true}, &r); err != nil {
			return 0, err
		}
		got.WriteString(r.Output)
		cursor = r.Cursor
	}
	if err := checkFlood(got.Bytes(), cmd, size); err != nil {
		return 0, fmt.Errorf("through serial_read: %w", err)
	}
	return float64(size) / el.Seconds(), nil
}

// checkFlood verifies the echo of the command, then exactly size bytes of
// the pattern (testdata/images/tiny/README.md), in order.
func checkFlood(out []byte, cmd string, size int) error {
	i := bytes.Index(out, []byte(cmd+"\r\n"))
	if i < 0 {
		return fmt.Errorf("command echo not found")
	}
	data := out[i+len(cmd)+2:]
	if len(data) < size {
		return fmt.Errorf("%d bytes, want %d", len(data), size)
	}
	const cycle = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQR"
	var line [64]byte
	for off := 0; off < size; off += 64 {
		n := off / 64
		copy(line[:], fmt.Sprintf("%08d ", n%100000000))
		for j := 0; j < 54; j++ {
			line[9+j] = cycle[j]
		}
		line[63] = '\n'
		want := line[:min(64, size-off)]
		if !bytes.Equal(data[off:off+len(want)], want) {
			return fmt.Errorf("byte %d: got %q, want %q", off, data[off:off+len(want)], want)
		}
	}
	if !bytes.HasPrefix(data[size:], []byte("\r\nflood done "+strconv.Itoa(size)+"\r\n")) {
		return fmt.Errorf("trailer %q", data[size:min(len(data), size+40)])
	}
	return nil
}

// soakMemory samples the server's RSS while the guest floods and a client
// reads only now and then, the way an agent would.
func soakMemory(ctx context.Context, d time.Duration) (peak, idle, produced int64, err error) {
	s, err := bootedServer(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	defer s.close()
	idle = vmRSS(s.cmd.Process.Pid)
	if err := s.call(ctx, "serial_send", map[string]any{"data": "flood 100000000000"}, nil); err != nil {
		return 0, 0, 0, err
	}
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		time.Sleep(100 * time.Millisecond)
		peak = max(peak, vmRSS(s.cmd.Process.Pid))
	}
	var st struct {
		SerialBytes int64 `json:"serial_bytes"`
	}
	if err := s.call(ctx, "qemu_status", nil, &st); err != nil {
		return 0, 0, 0, err
	}
	s.call(ctx, "serial_send", map[string]any{"data": "\x03", "newline": "none"}, nil)
	return peak, idle, st.SerialBytes, nil
}

// --- the raw ceilings: QEMU alone on FIFOs (see raw.go) ---

// rawInstances starts n QEMUs alone at once and waits until every one is at
// its prompt: the ceiling for n instances booted together.
func rawInstances(n int) (time.Duration, error) {
	errs := make(chan error, n)
	t := time.Now()
	for range n {
		go func() {
			q, err := startRaw()
			if err != nil {
				errs <- err
				return
			}
			_, err = q.readUntil("tiny> ")
			errs <- err
			// Keep it running until all are up, as ours do.
			go func() { time.Sleep(10 * time.Second); q.close() }()
		}()
	}
	var err error
	for range n {
		if e := <-errs; e != nil {
			err = e
		}
	}
	return time.Since(t), err
}

func rawBoot(n int) ([]time.Duration, error) {
	var ds []time.Duration
	for i := 0; i < n+1; i++ {
		t := time.Now()
		q, err := startRaw()
		if err != nil {
			return nil, err
		}
		_, err = q.readUntil(banner)
		d := time.Since(t)
		q.close()
		if err != nil {
			return nil, err
		}
		if i > 0 {
			ds = append(ds, d)
		}
	}
	return ds, nil
}

// echoRows measures the echo round trip through MCP stdio, the raw echo
// (each reader's, the best taken) and the call floor (qemu_status of the
// same server), in rounds of echoBatch calls each, in turn: the load of a
// shared machine drifts within seconds, and a ceiling measured before or
// after its figure would compare different machines.
func echoRows(ctx context.Context, fail func(string, error)) ([]row, time.Duration) {
	s, err := startServer(ctx)
	if err != nil {
		fail("mcp echo", err)
	}
	defer s.close()
	var b struct {
		PID     int  `json:"pid"`
		Matched bool `json:"matched"`
	}
	if err := s.call(ctx, "qemu_boot", withArch(map[string]any{"wait_for": `tiny> $`, "timeout": 60}), &b); err != nil || !b.Matched {
		fail("mcp echo", fmt.Errorf("boot: %v (matched %v)", err, b.Matched))
	}
	oursID, err := identity(b.PID)
	if err != nil {
		fail("mcp echo", err)
	}
	ref, err := startRef(ctx)
	if err != nil {
		fail("reference server", err)
	}
	defer ref.close()
	raws := make([]*rawQEMU, len(readers))
	for k, rd := range readers {
		q, err := startRawWith(rd)
		if err != nil {
			fail("raw echo ("+rd.name+")", err)
		}
		defer q.close()
		if _, err := q.readUntil("tiny> "); err != nil {
			fail("raw echo ("+rd.name+")", err)
		}
		raws[k] = q
	}
	pid := s.cmd.Process.Pid
	var ours, floor, refFloor []time.Duration
	rawDs := make([][]time.Duration, len(readers))
	var cost, floorCost procCost
	seq := 0
	// side k of a round: 0 ours, 1 the floor, 2 the reference's floor,
	// then the raw readers.
	sides := 3 + len(readers)
	run := func(k, n int, keep bool) {
		switch k {
		case 0:
			before := costOf(pid)
			ds, err := s.echoesFrom(ctx, "default", seq, n)
			if err != nil {
				fail("mcp echo", err)
			}
			seq += n
			if keep {
				ours = append(ours, ds...)
				cost = cost.plus(costOf(pid).minus(before))
			}
		case 1:
			before := costOf(pid)
			ds, err := s.calls(ctx, "qemu_status", nil, n)
			if err != nil {
				fail("mcp floor", err)
			}
			if keep {
				floor = append(floor, ds...)
				floorCost = floorCost.plus(costOf(pid).minus(before))
			}
		case 2:
			ds, err := ref.calls(ctx, "ping", map[string]any{"text": "x"}, n)
			if err != nil {
				fail("reference call floor", err)
			}
			if keep {
				refFloor = append(refFloor, ds...)
			}
		default:
			r := k - 3
			ds, err := raws[r].echoes(seq, n)
			if err != nil {
				fail("raw echo ("+readers[r].name+")", err)
			}
			seq += n
			if keep {
				rawDs[r] = append(rawDs[r], ds...)
			}
		}
	}
	// The tiny kernel polls its UART at the prompt: each QEMU spins a
	// core. One runs at a time, the side's own (ours for the floors, as
	// the echo has it), as when each was measured alone.
	running := -1
	only := func(k int) {
		q := 0
		if k >= 3 {
			q = k - 2
		}
		if q == running {
			return
		}
		for i := 0; i <= len(raws); i++ {
			if err := pauseQEMU(oursID, raws, i, i != q); err != nil {
				fail("pause the QEMUs not measured", err)
			}
		}
		running = q
	}
	for k := range sides {
		only(k)
		run(k, 10, false) // warm-up
	}
	rounds := max(1, *echoes/echoBatch)
	for i := range rounds {
		for j := range sides {
			only((i + j) % sides)
			run((i+j)%sides, echoBatch, true)
		}
	}
	only(0)
	n := rounds * echoBatch
	cost = procCost{cpu: cost.cpu / time.Duration(n), switches: cost.switches / float64(n)}
	floorCost = procCost{cpu: floorCost.cpu / time.Duration(n), switches: floorCost.switches / float64(n)}
	var raw []time.Duration
	rawName := ""
	var each []string
	for k, ds := range rawDs {
		each = append(each, fmt.Sprintf("%s %s", readers[k].name, ms(median(ds))))
		if raw == nil || median(ds) < median(raw) {
			raw, rawName = ds, readers[k].name
		}
	}
	fmt.Fprintf(os.Stderr, "bench: raw echo readers: %s\n", strings.Join(each, "; "))
	var rows []row
	rows = append(rows, row{fmt.Sprintf("MCP stdio call floor: qemu_status, median of %d (raw: the reference server's trivial tool)", n),
		ms(median(floor)), ms(median(refFloor)), ratio(median(floor), median(refFloor)), ""})
	rows = append(rows, row{fmt.Sprintf("echo round trip, median of %d (raw: the best reader, %s)", n, rawName), ms(median(ours)), ms(median(raw)),
		ratio(median(ours), median(raw)), "<= 5x raw"})
	ceiling := median(raw) + median(floor)
	rows = append(rows, row{fmt.Sprintf("echo round trip against its ceiling: the raw echo plus the call floor, all measured above in %d alternating rounds of %d", rounds, echoBatch),
		ms(median(ours)), ms(ceiling), fmt.Sprintf("%+.3f ms", float64((median(ours)-ceiling).Microseconds())/1000), "<= +0.150 ms"})
	rows = append(rows, row{"echo round trip, p90", ms(pct(ours, 90)), ms(pct(raw, 90)), ratio(pct(ours, 90), pct(raw, 90)), ""})
	rows = append(rows, row{"the server process per echo: CPU time (user and system) and context switches of all its threads (raw: the same per call floor)",
		fmt.Sprintf("%s, %.1f switches", ms(cost.cpu), cost.switches), fmt.Sprintf("%s, %.1f switches", ms(floorCost.cpu), floorCost.switches), "-", ""})
	return rows, median(ours)
}

// floodRows measures the flood through the server beside each raw
// reader, alternating.
func floodRows(ctx context.Context, fail func(string, error)) []row {
	// Raw and ours alternate, so that drifts of the machine hit both; the
	// ceiling is the best reader's median.
	rawRates := make([][]float64, len(readers))
	var ourRates []float64
	for i := 0; i < *floodRuns; i++ {
		for k, rd := range readers {
			r, err := rawFloodWith(rd, *floodSize)
			if err != nil {
				fail("raw flood ("+rd.name+")", err)
			}
			rawRates[k] = append(rawRates[k], r)
		}
		o, err := mcpFlood(ctx, *floodSize)
		if err != nil {
			fail("mcp flood", err)
		}
		ourRates = append(ourRates, o)
	}
	rawRate, best, kBest := 0.0, "", 0
	var each []string
	for k, rd := range readers {
		m := medianF(rawRates[k])
		each = append(each, fmt.Sprintf("%s %s", rd.name, rate(m)))
		if m > rawRate {
			rawRate, best, kBest = m, rd.name, k
		}
	}
	fmt.Fprintf(os.Stderr, "bench: raw flood readers: %s\n", strings.Join(each, "; "))
	ourRate := medianF(ourRates)
	// The emulator's speed drifts by 10 % and more within minutes on a
	// shared host; a run and the best reader's run of the same round
	// are seconds apart, so their ratio mostly cancels the drift.
	paired := make([]float64, len(ourRates))
	for i, o := range ourRates {
		paired[i] = o / rawRates[kBest][i]
	}
	return []row{
		{fmt.Sprintf("flood %d bytes, every byte checked, median of %d alternating runs (raw: the best of %d readers, %s)", *floodSize, *floodRuns, len(readers), best), rate(ourRate), rate(rawRate),
			fmt.Sprintf("%.1f%%", 100*ourRate/rawRate), ">= 95% of raw"},
		{"the same runs paired: median of each round's ratio to that reader's run in the same round (min to max)", "-", "-",
			fmt.Sprintf("%.1f%% (%.1f to %.1f%%)", 100*medianF(paired), 100*slices.Min(paired), 100*slices.Max(paired)), ""},
	}

}

// pauseQEMU stops (or resumes) QEMU i of echoRows, 0 the server's, i the
// raw QEMU of raws[i-1], with SIGSTOP (SIGCONT): a QMP stop would show
// in the server's guest events, and so in qemu_status, the floor.
func pauseQEMU(ours proc.Identity, raws []*rawQEMU, i int, stop bool) error {
	id := ours
	if i > 0 {
		id = raws[i-1].ident
	}
	sig := syscall.SIGCONT
	if stop {
		sig = syscall.SIGSTOP
	}
	// Only the process started as recorded: its start time checked.
	if live, _, err := proc.Check(id); err != nil || live != proc.Alive {
		return fmt.Errorf("QEMU %d is gone (%v)", id.PID, err)
	}
	return syscall.Kill(id.PID, sig)
}

// identity is the process pid as it runs now (its start time).
func identity(pid int) (proc.Identity, error) {
	info, err := proc.Stat(pid)
	if err != nil {
		return proc.Identity{}, err
	}
	return proc.Identity{PID: info.PID, StartTime: info.StartTime}, nil
}

// echoBatch is how many calls of one side a round of echoRows makes.
const echoBatch = 10

func (c procCost) plus(d procCost) procCost {
	return procCost{cpu: c.cpu + d.cpu, switches: c.switches + d.switches}
}

func (c procCost) minus(d procCost) procCost {
	return procCost{cpu: c.cpu - d.cpu, switches: c.switches - d.switches}
}

// calls times n calls of a tool.
func (s *server) calls(ctx context.Context, name string, args map[string]any, n int) ([]time.Duration, error) {
	ds := make([]time.Duration, 0, n)
	for range n {
		t := time.Now()
		if err := s.call(ctx, name, args, nil); err != nil {
			return nil, err
		}
		ds = append(ds, time.Since(t))
	}
	return ds, nil
}
