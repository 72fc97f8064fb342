package qemu

import (
	"context"
	"strings"
	"testing"
	"time"
)

// What runs before the guest does (a snapshot's load) is not bounded by
// what is left of the QMP connect's timeout: a load slower than that still
// ends in a running guest.
func TestBeforeContOutlastsConnectTimeout(t *testing.T) {
	k := needQEMU(t)
	dir := shortDir(t)
	var ctxErr error
	m, err := Start(context.Background(), Runtime{SerialBase: testSerial(dir, 2), QMPSocket: testSocket(dir, 2), ConnectTimeout: 2 * time.Second,
		BeforeCont: func(ctx context.Context, m *Process) error {
			time.Sleep(2500 * time.Millisecond)
			ctxErr = ctx.Err()
			return ctxErr
		}}, NewConfig(WithKernel(k)))
	if err != nil {
		t.Fatalf("Start = %v (the step before cont saw %v)", err, ctxErr)
	}
	defer m.Close()
	st, err := m.Monitor().Execute(context.Background(), "query-status", nil)
	if err != nil || !strings.Contains(string(st), `"running": true`) {
		t.Errorf("after the start: %s, %v; want a running guest", st, err)
	}
}
