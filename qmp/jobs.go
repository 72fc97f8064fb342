package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"
)

var jobSeq atomic.Uint64

// JobError is a job that concluded with an error: QEMU reports it in
// query-jobs, not in the command's return, which only says the job began.
type JobError struct {
	Command string
	Msg     string
}

func (e *JobError) Error() string { return fmt.Sprintf("qmp %s: %s", e.Command, e.Msg) }

// RunJob runs a command that starts a job (snapshot-save, snapshot-load,
// blockdev-create ...; args without "job-id", which RunJob adds), waits for
// the job to conclude, dismisses it and returns its error, a *JobError, if
// it failed. It watches JOB_STATUS_CHANGE events and, in case the event
// queue dropped one, polls query-jobs too.
func (m *Monitor) RunJob(ctx context.Context, command string, args map[string]any) error {
	id := "qmcp-job-" + strconv.FormatUint(jobSeq.Add(1), 10) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	a := make(map[string]any, len(args)+1)
	for k, v := range args {
		a[k] = v
	}
	a["job-id"] = id
	evctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events, err := m.Events(evctx)
	if err != nil {
		return err
	}
	if _, err := m.Execute(ctx, command, a); err != nil {
		return err
	}
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return fmt.Errorf("qmp %s: the monitor closed while the job ran: %w", command, errors.Join(ctx.Err(), m.Err()))
			}
			if ev.Event != "JOB_STATUS_CHANGE" || ev.Data["id"] != id || ev.Data["status"] != "concluded" {
				continue
			}
		case <-poll.C:
			st, _, err := m.job(ctx, id)
			if err != nil {
				return fmt.Errorf("qmp %s: %w", command, err)
			}
			if st != "concluded" {
				continue
			}
		case <-ctx.Done():
			// The job goes on in QEMU; cancel it so that it leaves no
			// half-written state behind.
			cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_, _ = m.Execute(cctx, "job-cancel", map[string]any{"id": id})
			ccancel()
			return fmt.Errorf("qmp %s: %w", command, ctx.Err())
		}
		_, msg, err := m.job(ctx, id)
		if err != nil {
			return fmt.Errorf("qmp %s: %w", command, err)
		}
		if _, err := m.Execute(ctx, "job-dismiss", map[string]any{"id": id}); err != nil {
			return fmt.Errorf("qmp %s: dismiss the job: %w", command, err)
		}
		if msg != "" {
			return &JobError{Command: command, Msg: msg}
		}
		return nil
	}
}

// job reads one job's status and error from query-jobs.
func (m *Monitor) job(ctx context.Context, id string) (status, errMsg string, err error) {
	raw, err := m.Execute(ctx, "query-jobs", nil)
	if err != nil {
		return "", "", err
	}
	var jobs []struct {
		ID     string `json:"id"`
		Status string `json:"status"`
		Error  string `json:"error"`
	}
	if err := json.Unmarshal(raw, &jobs); err != nil {
		return "", "", fmt.Errorf("query-jobs: %w", err)
	}
	for _, j := range jobs {
		if j.ID == id {
			return j.Status, j.Error, nil
		}
	}
	return "", "", fmt.Errorf("job %s is not in query-jobs", id)
}
