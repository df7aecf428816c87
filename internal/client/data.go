package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"connectrpc.com/connect"

	"github.com/cellfork/cellfork/internal/envd"
	"github.com/cellfork/cellfork/internal/envd/filesystem"
	"github.com/cellfork/cellfork/internal/envd/filesystem/filesystemconnect"
	"github.com/cellfork/cellfork/internal/envd/process"
	"github.com/cellfork/cellfork/internal/envd/process/processconnect"
)

// Execution is what one run_code produced, in order (the code
// interpreter's NDJSON events, spec §5).
type Execution struct {
	Stdout  string
	Stderr  string
	Results []Result
	Error   *ExecutionError
}

// Result is one rich result: each format the object has (text, html,
// markdown, svg, png and jpeg as base64, json, ...).
type Result struct {
	Formats      map[string]json.RawMessage
	IsMainResult bool
}

// Text returns the result's format f as a string ("" if absent).
func (r Result) Text(f string) string {
	var s string
	if raw, ok := r.Formats[f]; ok && json.Unmarshal(raw, &s) != nil {
		return string(raw) // json, data, chart: objects
	}
	return s
}

// ExecutionError is the exception the code raised.
type ExecutionError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// resultFormats are the keys of a result event that are formats.
var resultFormats = []string{"text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json", "javascript", "data", "chart"}

// RunCode runs Python code in the sandbox's code interpreter (its default
// context unless contextID) and collects what it produced, within timeout
// (0: none).
func (c *Client) RunCode(ctx context.Context, id, token, code, contextID string, timeout time.Duration) (*Execution, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	body := map[string]any{"code": code}
	if contextID != "" {
		body["context_id"] = contextID
	}
	b, _ := json.Marshal(body)
	resp, err := c.DataRequest(ctx, http.MethodPost, id, envd.CodeInterpreterPort, token, "", "/execute", bytes.NewReader(b), "application/json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	ex := &Execution{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20) // a plot is one long line
	for sc.Scan() {
		var ev map[string]json.RawMessage
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue
		}
		var typ, text string
		_ = json.Unmarshal(ev["type"], &typ)
		_ = json.Unmarshal(ev["text"], &text)
		switch typ {
		case "stdout":
			ex.Stdout += text
		case "stderr":
			ex.Stderr += text
		case "result":
			r := Result{Formats: map[string]json.RawMessage{}}
			_ = json.Unmarshal(ev["is_main_result"], &r.IsMainResult)
			for _, f := range resultFormats {
				if raw, ok := ev[f]; ok && string(raw) != "null" {
					r.Formats[f] = raw
				}
			}
			ex.Results = append(ex.Results, r)
		case "error":
			e := &ExecutionError{}
			_ = json.Unmarshal(ev["name"], &e.Name)
			_ = json.Unmarshal(ev["value"], &e.Value)
			_ = json.Unmarshal(ev["traceback"], &e.Traceback)
			ex.Error = e
		}
	}
	if err := sc.Err(); err != nil {
		if ctx.Err() != nil {
			return ex, fmt.Errorf("execution did not finish within %s", timeout)
		}
		return ex, fmt.Errorf("reading the execution's output: %w", err)
	}
	return ex, nil
}

// CommandResult is a finished command's output and exit code.
type CommandResult struct {
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	ExitCode int    `json:"exit_code"`
}

// maxCommandOutput bounds what RunCommand keeps of each stream.
const maxCommandOutput = 1 << 20

// RunCommand runs a shell command (bash -l -c, as the E2B SDK's
// commands.run) as user ("" = the sandbox's default) and waits for it,
// within timeout (0: none); a command cut short is killed.
func (c *Client) RunCommand(ctx context.Context, id, token, user, command, cwd string, envs map[string]string, timeout time.Duration) (*CommandResult, error) {
	pc := processconnect.NewProcessClient(c.HTTP, c.Base, connect.WithProtoJSON())
	stdin := false
	cfg := &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", command}, Envs: envs}
	if cwd != "" {
		cfg.Cwd = &cwd
	}
	req := connect.NewRequest(&process.StartRequest{Process: cfg, Stdin: &stdin})
	SetDataHeaders(req.Header(), id, envd.Port, token, user)
	req.Header().Set("Keepalive-Ping-Interval", "30")
	runCtx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		runCtx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	stream, err := pc.Start(runCtx, req)
	if err != nil {
		return nil, connectError(err)
	}
	defer stream.Close()
	var out CommandResult
	var stdout, stderr bytes.Buffer
	var pid uint32
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if s := ev.GetStart(); s != nil {
			pid = s.GetPid()
		}
		if d := ev.GetData(); d != nil {
			if stdout.Len() < maxCommandOutput {
				stdout.Write(d.GetStdout())
			}
			if stderr.Len() < maxCommandOutput {
				stderr.Write(d.GetStderr())
			}
		}
		if e := ev.GetEnd(); e != nil {
			out.ExitCode = int(e.GetExitCode())
		}
	}
	out.Stdout, out.Stderr = stdout.String(), stderr.String()
	if err := stream.Err(); err != nil {
		if pid != 0 && runCtx.Err() != nil {
			kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer kcancel()
			kill := connect.NewRequest(&process.SendSignalRequest{
				Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}},
				Signal:  process.Signal_SIGNAL_SIGKILL,
			})
			SetDataHeaders(kill.Header(), id, envd.Port, token, user)
			_, _ = pc.SendSignal(kctx, kill)
			return &out, fmt.Errorf("command did not finish within %s and was killed", timeout)
		}
		return &out, connectError(err)
	}
	return &out, nil
}

// connectError turns a Connect error into the daemon's or agent's message.
func connectError(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return errors.New(ce.Message())
	}
	return err
}

// ReadFile returns the file at path in the sandbox, read as user.
func (c *Client) ReadFile(ctx context.Context, id, token, user, path string, limit int64) ([]byte, error) {
	q := url.Values{"path": {path}}
	resp, err := c.DataRequest(ctx, http.MethodGet, id, envd.Port, token, user, "/files?"+q.Encode(), nil, "")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return b, nil
}

// WriteFile writes data to path in the sandbox as user (parents created).
func (c *Client) WriteFile(ctx context.Context, id, token, user, path string, data []byte) error {
	q := url.Values{"path": {path}}
	resp, err := c.DataRequest(ctx, http.MethodPost, id, envd.Port, token, user, "/files?"+q.Encode(), bytes.NewReader(data), "application/octet-stream")
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Entry is one file or directory of a listing.
type Entry struct {
	Name string `json:"name"`
	Path string `json:"path"`
	Type string `json:"type"` // file, dir
	Size int64  `json:"size"`
}

// ListDir lists path in the sandbox down to depth levels (at least 1).
func (c *Client) ListDir(ctx context.Context, id, token, user, path string, depth int) ([]Entry, error) {
	fc := filesystemconnect.NewFilesystemClient(c.HTTP, c.Base, connect.WithProtoJSON())
	req := connect.NewRequest(&filesystem.ListDirRequest{Path: path, Depth: uint32(max(depth, 1))})
	SetDataHeaders(req.Header(), id, envd.Port, token, user)
	resp, err := fc.ListDir(ctx, req)
	if err != nil {
		return nil, connectError(err)
	}
	var out []Entry
	for _, e := range resp.Msg.GetEntries() {
		typ := "file"
		if e.GetType() == filesystem.FileType_FILE_TYPE_DIRECTORY {
			typ = "dir"
		}
		out = append(out, Entry{Name: e.GetName(), Path: e.GetPath(), Type: typ, Size: e.GetSize()})
	}
	return out, nil
}
