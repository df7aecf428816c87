package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/cellfork/cellfork/internal/api/apitypes"
)

func (a *app) fork(ctx context.Context, args []string) error {
	fs := a.flagSet("fork")
	count := fs.Int("n", 1, "")
	fs.IntVar(count, "count", 1, "")
	timeout := fs.Int("timeout", 0, "")
	id, err := parseOneID(fs, args, "sandbox id", usageFork)
	if err != nil {
		return err
	}
	if *count < 1 {
		return &usageError{msg: "-n must be at least 1", usage: usageFork}
	}
	if *timeout < 0 {
		return &usageError{msg: "--timeout must not be negative", usage: usageFork}
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	body := apitypes.ForkRequest{Count: count, Timeout: apitypes.Optional(*timeout)}
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/fork", nil, body, &raw); err != nil {
		return err
	}
	// One result per child: a sandbox, or the error that kept it from
	// starting.
	var results []apitypes.ForkResult
	if err := json.Unmarshal(raw, &results); err != nil {
		return fmt.Errorf("decoding fork response: %w", err)
	}
	if a.g.json {
		if err := a.printJSON(raw); err != nil {
			return err
		}
	}
	failed := false
	for i, r := range results {
		switch {
		case r.Sandbox != nil && r.Sandbox.SandboxID != "" && r.Error == nil:
			if !a.g.json {
				fmt.Fprintln(a.stdout, r.Sandbox.SandboxID)
			}
		case r.Error != nil:
			failed = true
			fmt.Fprintf(a.stderr, "cellfork: fork child %d of %d failed: %s (%d)\n", i+1, len(results), r.Error.Message, r.Error.Code)
		default:
			failed = true
			fmt.Fprintf(a.stderr, "cellfork: fork child %d of %d: neither a sandbox nor an error in the answer\n", i+1, len(results))
		}
	}
	if len(results) != *count {
		failed = true
		fmt.Fprintf(a.stderr, "cellfork: asked for %d children, the daemon answered for %d\n", *count, len(results))
	}
	if failed {
		return &exitError{code: 1}
	}
	return nil
}

// sandboxAction POSTs body to /sandboxes/{id}/{action} and prints the
// sandbox id from the answer (--json: the answer).
func (a *app) sandboxAction(ctx context.Context, id, action string, body any) error {
	c, err := a.client()
	if err != nil {
		return err
	}
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/"+action, nil, body, &raw); err != nil {
		return err
	}
	if a.g.json {
		return a.printJSON(raw)
	}
	var sb apitypes.Sandbox
	if err := json.Unmarshal(raw, &sb); err != nil || sb.SandboxID == "" {
		return fmt.Errorf("decoding %s response: no sandboxID in %s", action, raw)
	}
	fmt.Fprintln(a.stdout, sb.SandboxID)
	return nil
}

func (a *app) rollback(ctx context.Context, args []string) error {
	fs := a.flagSet("rollback")
	pos, err := parseArgs(fs, args, 0)
	if err != nil {
		return flagError(err, usageRollback)
	}
	if len(pos) != 2 {
		return &usageError{msg: "want a sandbox id and a snapshot id or name", usage: usageRollback}
	}
	return a.sandboxAction(ctx, pos[0], "rollback", apitypes.RollbackRequest{SnapshotID: pos[1]})
}

func (a *app) merge(ctx context.Context, args []string) error {
	fs := a.flagSet("merge")
	pos, err := parseArgs(fs, args, 0)
	if err != nil {
		return flagError(err, usageMerge)
	}
	if len(pos) != 2 {
		return &usageError{msg: "want a parent and a child sandbox id", usage: usageMerge}
	}
	return a.sandboxAction(ctx, pos[0], "merge", apitypes.MergeRequest{SandboxID: pos[1]})
}

// pauseResult is `pause --json`.
type pauseResult struct {
	SandboxID string `json:"sandboxID"`
	Paused    bool   `json:"paused"`
	Spill     bool   `json:"spill"`
}

func (a *app) pause(ctx context.Context, args []string) error {
	fs := a.flagSet("pause")
	spill := fs.Bool("spill", false, "")
	id, err := parseOneID(fs, args, "sandbox id", usagePause)
	if err != nil {
		return err
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	body := apitypes.PauseRequest{Spill: apitypes.Optional(*spill)}
	if _, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/pause", nil, body, nil); err != nil {
		return err
	}
	if a.g.json {
		return a.printJSONValue(pauseResult{SandboxID: id, Paused: true, Spill: *spill})
	}
	fmt.Fprintln(a.stdout, id)
	return nil
}

func (a *app) resume(ctx context.Context, args []string) error {
	fs := a.flagSet("resume")
	timeout := fs.Int("timeout", 0, "")
	id, err := parseOneID(fs, args, "sandbox id", usageResume)
	if err != nil {
		return err
	}
	if *timeout < 0 {
		return &usageError{msg: "--timeout must not be negative", usage: usageResume}
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	body := apitypes.ConnectRequest{Timeout: apitypes.Optional(*timeout)}
	var raw json.RawMessage
	status, _, err := c.call(ctx, http.MethodPost, "/v2/sandboxes/"+url.PathEscape(id)+"/connect", nil, body, &raw)
	if err != nil {
		return err
	}
	// connect answers 201 when it resumed the sandbox, 200 when it was
	// running already.
	resumed := status == http.StatusCreated
	if a.g.json {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err != nil {
			return fmt.Errorf("decoding connect response: %w", err)
		}
		obj["resumed"] = json.RawMessage(fmt.Sprint(resumed))
		return a.printJSONValue(obj)
	}
	var sb apitypes.Sandbox
	if err := json.Unmarshal(raw, &sb); err != nil || sb.SandboxID == "" {
		return fmt.Errorf("decoding connect response: no sandboxID in %s", raw)
	}
	if !resumed {
		fmt.Fprintf(a.stderr, "cellfork: sandbox %s was already running\n", sb.SandboxID)
	}
	fmt.Fprintln(a.stdout, sb.SandboxID)
	return nil
}
