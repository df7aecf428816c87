package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/envd"
)

// executeRequest is the body of POST /execute (spec §5); all four keys are
// always present, null when unset.
type executeRequest struct {
	Code      string            `json:"code"`
	ContextID *string           `json:"context_id"`
	Language  *string           `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// runCodeOptions is a parsed `cellfork run-code` command line.
type runCodeOptions struct {
	language string
	context  string
	env      kvFlag
	timeout  int // seconds, 0 = none
	id       string
	code     string // "-" means standard input
}

func (a *app) parseRunCode(args []string) (*runCodeOptions, error) {
	o := &runCodeOptions{}
	fs := a.flagSet("run-code")
	fs.StringVar(&o.language, "language", "", "")
	fs.StringVar(&o.context, "context", "", "")
	fs.Var(&o.env, "env", "")
	fs.IntVar(&o.timeout, "timeout", 300, "")
	pos, err := parseArgs(fs, args, 0)
	if err != nil {
		return nil, flagError(err, usageRunCode)
	}
	switch {
	case len(pos) < 2:
		return nil, &usageError{msg: "want a sandbox id and code (or - for stdin)", usage: usageRunCode}
	case len(pos) > 2:
		return nil, &usageError{msg: fmt.Sprintf("unexpected argument %q (quote the code as one argument)", pos[2]), usage: usageRunCode}
	case o.language != "" && o.context != "":
		return nil, &usageError{msg: "--language and --context are mutually exclusive", usage: usageRunCode}
	case o.timeout < 0:
		return nil, &usageError{msg: "--timeout must not be negative", usage: usageRunCode}
	}
	o.id, o.code = pos[0], pos[1]
	return o, nil
}

func (a *app) runCode(ctx context.Context, args []string) error {
	o, err := a.parseRunCode(args)
	if err != nil {
		return err
	}
	code := o.code
	if code == "-" {
		b, err := io.ReadAll(a.stdin)
		if err != nil {
			return fmt.Errorf("reading code from stdin: %w", err)
		}
		code = string(b)
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	token, err := c.accessToken(ctx, o.id)
	if err != nil {
		return err
	}
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(o.timeout)*time.Second)
		defer cancel()
	}
	body := executeRequest{Code: code, EnvVars: o.env.m}
	if o.context != "" {
		body.ContextID = &o.context
	}
	if o.language != "" {
		body.Language = &o.language
	}
	resp, err := c.execute(ctx, o.id, token, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	failed, err := renderExecution(resp.Body, a.stdout, a.stderr, a.g.json)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("execution timed out after %ds", o.timeout)
		}
		return err
	}
	if failed {
		return &exitError{code: 1}
	}
	return nil
}

// execute starts POST /execute on the sandbox's code interpreter and returns
// the streaming response.
func (c *apiClient) execute(ctx context.Context, id, token string, body executeRequest) (*http.Response, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encoding request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.Base+"/execute", bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("building request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", userAgent)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(envd.CodeInterpreterPort))
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, reachError(c.Base, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, errorFromResponse(resp)
	}
	return resp, nil
}

// codeEvent is one line of the /execute NDJSON stream (spec §5).
type codeEvent struct {
	Type         string          `json:"type"`
	Text         string          `json:"text"`
	IsMainResult bool            `json:"is_main_result"`
	Name         string          `json:"name"`
	Value        string          `json:"value"`
	Traceback    json.RawMessage `json:"traceback"`
}

// renderExecution reads an /execute NDJSON stream and writes it for a
// person: stdout and stderr text as it arrives, the main result's text on
// stdout, an error's traceback on stderr. With asJSON it copies each event
// line (keepalives dropped) to stdout instead. failed reports whether the
// execution raised an error.
func renderExecution(r io.Reader, stdout, stderr io.Writer, asJSON bool) (failed bool, err error) {
	br := bufio.NewReader(r)
	for {
		line, readErr := br.ReadBytes('\n')
		if line = bytes.TrimSpace(line); len(line) > 0 {
			var ev codeEvent
			if err := json.Unmarshal(line, &ev); err != nil {
				return failed, fmt.Errorf("decoding execution event %.80q: %w", line, err)
			}
			if ev.Type == "error" || ev.Type == "unexpected_end_of_execution" {
				failed = true
			}
			if asJSON {
				err = writeEventLine(stdout, ev.Type, line)
			} else {
				err = renderEvent(stdout, stderr, &ev)
			}
			if err != nil {
				return failed, err
			}
		}
		if errors.Is(readErr, io.EOF) {
			return failed, nil
		}
		if readErr != nil {
			return failed, fmt.Errorf("reading execution stream: %w", readErr)
		}
	}
}

func writeEventLine(w io.Writer, typ string, line []byte) error {
	if typ == "keepalive" {
		return nil
	}
	_, err := w.Write(append(line, '\n'))
	return err
}

func renderEvent(stdout, stderr io.Writer, ev *codeEvent) error {
	var err error
	switch ev.Type {
	case "stdout":
		_, err = io.WriteString(stdout, ev.Text)
	case "stderr":
		_, err = io.WriteString(stderr, ev.Text)
	case "result":
		if ev.IsMainResult && ev.Text != "" {
			_, err = io.WriteString(stdout, withNewline(ev.Text))
		}
	case "error":
		_, err = io.WriteString(stderr, withNewline(errorText(ev)))
	case "unexpected_end_of_execution":
		_, err = io.WriteString(stderr, "cellfork: the code interpreter ended the execution unexpectedly\n")
	}
	return err
}

// errorText is an error event's traceback (a string or a list of lines), or
// "Name: Value" when it has none.
func errorText(ev *codeEvent) string {
	var s string
	if json.Unmarshal(ev.Traceback, &s) == nil && s != "" {
		return s
	}
	var lines []string
	if json.Unmarshal(ev.Traceback, &lines) == nil && len(lines) > 0 {
		return strings.Join(lines, "\n")
	}
	if ev.Value == "" {
		return ev.Name
	}
	return ev.Name + ": " + ev.Value
}

func withNewline(s string) string {
	if strings.HasSuffix(s, "\n") {
		return s
	}
	return s + "\n"
}
