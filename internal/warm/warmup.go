package warm

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/cellfork/cellfork/internal/envd"
	"github.com/cellfork/cellfork/internal/envd/process"
	"github.com/cellfork/cellfork/internal/envd/process/processconnect"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// The first restore of an image records which of its pages the sandbox
// copies on write in its first seconds, and every later restore loads those
// up front instead of faulting them in one by one (patches/gvisor:
// working-set). Left to the pool, a new warm image's first restore is a
// refill that sits idle until it is claimed, so the working set it records
// is the agent's idle one, and the first run_code of every pooled sandbox
// faults the code interpreter's pages in (and so does every fork child and
// sandbox created from a snapshot of one: their images carry the pages the
// parent wrote, patches/gvisor: diff-prefetch). So the daemon restores each
// warm image it builds once, before the pool does, and runs first requests
// in it.

// warmupCode is the first run_code of the warm-up: it prints, as nearly
// every first request does, so that the output path is recorded too.
const warmupCode = "print(sum(range(10)))"

// warmupCommand is the warm-up's first command, as the SDKs send one
// (bash -l -c): the image's spare login shell serves it and forks and
// execs a program, so the pages a first command touches are recorded too.
const warmupCommand = "sleep 0; echo warm"

// warmupSettle is how long the warm-up sandbox lives on after its request:
// the sentry writes the working set out every 100 ms.
const warmupSettle = 300 * time.Millisecond

// recordWorkingSet restores the warm image just built into a throwaway
// sandbox, hands it off as a pool refill does, runs warmupCode in its
// default code context and then warmupCommand. Best effort: a failure
// costs only the prefetch.
func (m *Maker) recordWorkingSet(ctx context.Context, name, rootfs, image string, limits sandbox.Limits) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	t0 := time.Now()
	if err := m.warmup(ctx, rootfs, image, limits); err != nil {
		m.d.Log.Warn("warm image's first request failed: its working set is what it recorded until then", "template", name, "err", err)
		return
	}
	m.d.Log.Info("warm image's working set recorded", "template", name, "ms", time.Since(t0).Milliseconds())
}

func (m *Maker) warmup(ctx context.Context, rootfs, image string, limits sandbox.Limits) error {
	b, err := m.d.Boxes.Restore(ctx, image, rootfs, limits, sandbox.Limits{}, nil, false)
	if err != nil {
		return err
	}
	defer m.d.Boxes.Destroy(context.WithoutCancel(ctx), b)
	if err := m.d.Boxes.Ready(ctx, b, limits); err != nil {
		return err
	}
	body := fmt.Sprintf(`{"code": %q}`, warmupCode)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://sandbox:%d/execute", envd.CodeInterpreterPort), strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.Transport.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("running the first code: %w", err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("reading the first code's output: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("running the first code: %s", resp.Status)
	}
	if err := firstCommand(ctx, b.Transport); err != nil {
		return err
	}
	time.Sleep(warmupSettle)
	return nil
}

// firstCommand runs warmupCommand through the agent's process service and
// reads it to its end.
func firstCommand(ctx context.Context, tr http.RoundTripper) error {
	proc := processconnect.NewProcessClient(&http.Client{Transport: tr}, fmt.Sprintf("http://sandbox:%d", envd.Port), connect.WithProtoJSON())
	stream, err := proc.Start(ctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{
		Cmd: "/bin/bash", Args: []string{"-l", "-c", warmupCommand}}}))
	if err != nil {
		return fmt.Errorf("running the first command: %w", err)
	}
	defer stream.Close()
	for stream.Receive() {
		if end := stream.Msg().GetEvent().GetEnd(); end != nil {
			if end.GetExitCode() != 0 {
				return fmt.Errorf("running the first command: %s", end.GetStatus())
			}
			return nil
		}
	}
	return fmt.Errorf("running the first command: the stream ended without an exit status (%v)", stream.Err())
}
