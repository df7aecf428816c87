// Package mcpserver is `cellfork mcp`: a Model Context Protocol server
// (the official Go SDK) whose tools and resources drive sandboxes through
// a cellfork daemon's (or gateway's) public HTTP API with an API key. Any
// MCP client (Claude Desktop, IDE agents, agent frameworks) can then
// create sandboxes, run code and commands in them, move files, and
// snapshot, fork, roll back, pause and kill them. It serves over stdio or
// streamable HTTP. Like the CLI it links no daemon code (deps_test.go).
package mcpserver

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/cellfork/cellfork/internal/api/apitypes"
	"github.com/cellfork/cellfork/internal/client"
)

// maxFileBytes bounds what read_file and the file resources return.
const maxFileBytes = 10 << 20

// tools binds the tools to one API client (one API key).
type tools struct {
	c *client.Client
}

// NewServer returns an MCP server whose tools call the API through c.
func NewServer(c *client.Client, version string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "cellfork", Title: "cellfork sandboxes", Version: version}, &mcp.ServerOptions{
		Instructions: "Sandboxes are isolated Linux machines (gVisor) with Python and a stateful code interpreter. " +
			"Create one with create_sandbox, then run_code (Python; variables persist between calls) or run_command (bash), " +
			"and read_file/write_file/list_files. snapshot saves its whole state (memory, processes, files); " +
			"fork makes live copies; rollback returns it to a snapshot. kill it when done.",
	})
	t := &tools{c: c}
	mcp.AddTool(s, &mcp.Tool{Name: "create_sandbox", Description: "Create a sandbox from a template (default \"base\": Debian with Python, numpy, pandas, matplotlib) or a snapshot id. Returns its sandbox_id."}, t.create)
	mcp.AddTool(s, &mcp.Tool{Name: "run_code", Description: "Run Python code in the sandbox's stateful interpreter (variables and imports persist). Returns stdout, stderr, the results (plots as images) and any error."}, t.runCode)
	mcp.AddTool(s, &mcp.Tool{Name: "run_command", Description: "Run a shell command (bash -l -c) in the sandbox and wait for it. Returns stdout, stderr and the exit code."}, t.runCommand)
	mcp.AddTool(s, &mcp.Tool{Name: "read_file", Description: "Read a file from the sandbox (text as text, images as images)."}, t.readFile)
	mcp.AddTool(s, &mcp.Tool{Name: "write_file", Description: "Write a text file in the sandbox (parent directories are created)."}, t.writeFile)
	mcp.AddTool(s, &mcp.Tool{Name: "list_files", Description: "List a directory of the sandbox."}, t.listFiles)
	mcp.AddTool(s, &mcp.Tool{Name: "snapshot", Description: "Save the sandbox's whole state (memory, processes, files) as a snapshot; the sandbox keeps running. Returns the snapshot_id, usable with rollback or as create_sandbox's template."}, t.snapshot)
	mcp.AddTool(s, &mcp.Tool{Name: "fork", Description: "Make count live, independent copies of the sandbox (same memory, processes and files). Returns their sandbox ids."}, t.fork)
	mcp.AddTool(s, &mcp.Tool{Name: "rollback", Description: "Return the sandbox to one of its snapshots (same sandbox id)."}, t.rollback)
	mcp.AddTool(s, &mcp.Tool{Name: "pause", Description: "Pause the sandbox (frozen, then written to disk); any later call on it resumes it."}, t.pause)
	mcp.AddTool(s, &mcp.Tool{Name: "kill", Description: "Kill the sandbox and free everything it holds."}, t.kill)
	mcp.AddTool(s, &mcp.Tool{Name: "list_sandboxes", Description: "List the running and paused sandboxes."}, t.list)
	s.AddResourceTemplate(&mcp.ResourceTemplate{
		Name:        "sandbox-file",
		Title:       "A file in a sandbox",
		URITemplate: "cellfork://sandboxes/{sandbox_id}/files/{+path}",
		Description: "The file at path (absolute, without its leading slash) inside the sandbox.",
	}, t.readResource)
	return s
}

// Inputs and outputs of the tools. Field comments become the schemas'
// descriptions.

type createIn struct {
	Template       string            `json:"template,omitempty" jsonschema:"template name or alias, or a snapshot id; default base"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty" jsonschema:"lifetime in seconds before it is killed; default the daemon's (300)"`
	AllowInternet  *bool             `json:"allow_internet,omitempty" jsonschema:"allow egress to the internet; default true"`
	AllowOut       []string          `json:"allow_out,omitempty" jsonschema:"addresses, CIDRs or domain names (*.example.com) always allowed"`
	DenyOut        []string          `json:"deny_out,omitempty" jsonschema:"addresses or CIDRs denied (0.0.0.0/0 denies all but allow_out)"`
	EnvVars        map[string]string `json:"env_vars,omitempty" jsonschema:"environment variables of everything it runs"`
	Metadata       map[string]string `json:"metadata,omitempty" jsonschema:"labels for listing"`
}

type createOut struct {
	SandboxID  string `json:"sandbox_id"`
	TemplateID string `json:"template_id"`
	BootMode   string `json:"boot_mode,omitempty"`
}

func (t *tools) create(ctx context.Context, _ *mcp.CallToolRequest, in createIn) (*mcp.CallToolResult, createOut, error) {
	body := map[string]any{"templateID": in.Template}
	if in.Template == "" {
		body["templateID"] = "base"
	}
	if in.TimeoutSeconds > 0 {
		body["timeout"] = in.TimeoutSeconds
	}
	if in.AllowInternet != nil {
		body["allow_internet_access"] = *in.AllowInternet
	}
	if len(in.AllowOut) > 0 || len(in.DenyOut) > 0 {
		body["network"] = map[string]any{"allowOut": in.AllowOut, "denyOut": in.DenyOut}
	}
	if in.EnvVars != nil {
		body["envVars"] = in.EnvVars
	}
	if in.Metadata != nil {
		body["metadata"] = in.Metadata
	}
	var sb apitypes.Sandbox
	if _, err := t.c.Do(ctx, http.MethodPost, "/v2/sandboxes", nil, body, &sb); err != nil {
		return nil, createOut{}, err
	}
	out := createOut{SandboxID: sb.SandboxID, TemplateID: sb.TemplateID}
	if sb.BootMode != nil {
		out.BootMode = string(*sb.BootMode)
	}
	return nil, out, nil
}

type sandboxIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
}

type runCodeIn struct {
	SandboxID      string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Code           string `json:"code" jsonschema:"Python code; the last expression's value is the main result"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty" jsonschema:"give up after this many seconds; default 300"`
}

// token connects to the sandbox (resuming it if paused) for its
// data-plane access token.
func (t *tools) token(ctx context.Context, id string) (string, error) {
	if id == "" {
		return "", fmt.Errorf("sandbox_id is required")
	}
	return t.c.AccessToken(ctx, id)
}

func (t *tools) runCode(ctx context.Context, _ *mcp.CallToolRequest, in runCodeIn) (*mcp.CallToolResult, any, error) {
	tok, err := t.token(ctx, in.SandboxID)
	if err != nil {
		return nil, nil, err
	}
	timeout := 300 * time.Second
	if in.TimeoutSeconds > 0 {
		timeout = time.Duration(in.TimeoutSeconds) * time.Second
	}
	ex, err := t.c.RunCode(ctx, in.SandboxID, tok, in.Code, "", timeout)
	if err != nil && ex == nil {
		return nil, nil, err
	}
	res := executionContent(ex)
	if err != nil {
		res.Content = append(res.Content, &mcp.TextContent{Text: err.Error()})
		res.IsError = true
	}
	return res, nil, nil
}

// executionContent renders an execution as MCP content: stdout, stderr,
// each result (images as image content, other formats as text), and the
// error (which marks the result as an error).
func executionContent(ex *client.Execution) *mcp.CallToolResult {
	res := &mcp.CallToolResult{Content: []mcp.Content{}}
	if ex.Stdout != "" {
		res.Content = append(res.Content, &mcp.TextContent{Text: ex.Stdout})
	}
	if ex.Stderr != "" {
		res.Content = append(res.Content, &mcp.TextContent{Text: "stderr:\n" + ex.Stderr})
	}
	for _, r := range ex.Results {
		image := false
		for _, f := range []struct{ key, mime string }{{"png", "image/png"}, {"jpeg", "image/jpeg"}} {
			if b64 := r.Text(f.key); b64 != "" {
				if data, err := base64.StdEncoding.DecodeString(b64); err == nil {
					res.Content = append(res.Content, &mcp.ImageContent{Data: data, MIMEType: f.mime})
					image = true
				}
			}
		}
		for _, f := range []string{"text", "markdown", "json", "html", "latex", "svg"} {
			if v := r.Text(f); v != "" && !(image && f == "text") {
				text := v
				if f != "text" {
					text = f + ":\n" + v
				}
				res.Content = append(res.Content, &mcp.TextContent{Text: text})
				break // one textual form per result
			}
		}
	}
	if e := ex.Error; e != nil {
		res.IsError = true
		res.Content = append(res.Content, &mcp.TextContent{Text: fmt.Sprintf("%s: %s\n%s", e.Name, e.Value, e.Traceback)})
	}
	if len(res.Content) == 0 {
		res.Content = append(res.Content, &mcp.TextContent{Text: "(no output)"})
	}
	return res
}

type runCommandIn struct {
	SandboxID      string            `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Command        string            `json:"command" jsonschema:"a bash command line"`
	Cwd            string            `json:"cwd,omitempty" jsonschema:"working directory; default the user's home"`
	User           string            `json:"user,omitempty" jsonschema:"user to run as (user or root); default user"`
	EnvVars        map[string]string `json:"env_vars,omitempty" jsonschema:"extra environment variables"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds; default 60"`
}

func (t *tools) runCommand(ctx context.Context, _ *mcp.CallToolRequest, in runCommandIn) (*mcp.CallToolResult, client.CommandResult, error) {
	tok, err := t.token(ctx, in.SandboxID)
	if err != nil {
		return nil, client.CommandResult{}, err
	}
	timeout := 60 * time.Second
	if in.TimeoutSeconds > 0 {
		timeout = time.Duration(in.TimeoutSeconds) * time.Second
	}
	out, err := t.c.RunCommand(ctx, in.SandboxID, tok, in.User, in.Command, in.Cwd, in.EnvVars, timeout)
	if err != nil {
		return nil, client.CommandResult{}, err
	}
	text := out.Stdout
	if out.Stderr != "" {
		text += "\nstderr:\n" + out.Stderr
	}
	text += fmt.Sprintf("\nexit code: %d", out.ExitCode)
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.TrimLeft(text, "\n")}}, IsError: out.ExitCode != 0}, *out, nil
}

type fileIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Path      string `json:"path" jsonschema:"absolute path, or relative to the user's home"`
	User      string `json:"user,omitempty" jsonschema:"user to act as (user or root); default user"`
}

func (t *tools) readFile(ctx context.Context, _ *mcp.CallToolRequest, in fileIn) (*mcp.CallToolResult, any, error) {
	tok, err := t.token(ctx, in.SandboxID)
	if err != nil {
		return nil, nil, err
	}
	b, err := t.c.ReadFile(ctx, in.SandboxID, tok, in.User, in.Path, maxFileBytes)
	if err != nil {
		return nil, nil, err
	}
	return &mcp.CallToolResult{Content: []mcp.Content{fileContent(in.SandboxID, in.Path, b)}}, nil, nil
}

// fileContent is a file as MCP content: an image, text, or a binary
// resource.
func fileContent(id, path string, b []byte) mcp.Content {
	switch ct := http.DetectContentType(b); {
	case ct == "image/png" || ct == "image/jpeg" || ct == "image/gif" || ct == "image/webp":
		return &mcp.ImageContent{Data: b, MIMEType: ct}
	case utf8.Valid(b):
		return &mcp.TextContent{Text: string(b)}
	default:
		return &mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: fileURI(id, path), MIMEType: ct, Blob: b}}
	}
}

func fileURI(id, path string) string {
	return "cellfork://sandboxes/" + url.PathEscape(id) + "/files/" + strings.TrimPrefix(path, "/")
}

type writeFileIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Path      string `json:"path" jsonschema:"absolute path, or relative to the user's home"`
	Content   string `json:"content" jsonschema:"the file's text"`
	User      string `json:"user,omitempty" jsonschema:"user to act as (user or root); default user"`
}

type writeFileOut struct {
	Path  string `json:"path"`
	Bytes int    `json:"bytes"`
}

func (t *tools) writeFile(ctx context.Context, _ *mcp.CallToolRequest, in writeFileIn) (*mcp.CallToolResult, writeFileOut, error) {
	tok, err := t.token(ctx, in.SandboxID)
	if err != nil {
		return nil, writeFileOut{}, err
	}
	if err := t.c.WriteFile(ctx, in.SandboxID, tok, in.User, in.Path, []byte(in.Content)); err != nil {
		return nil, writeFileOut{}, err
	}
	return nil, writeFileOut{Path: in.Path, Bytes: len(in.Content)}, nil
}

type listFilesIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Path      string `json:"path,omitempty" jsonschema:"directory; default the user's home"`
	Depth     int    `json:"depth,omitempty" jsonschema:"levels to descend; default 1"`
	User      string `json:"user,omitempty" jsonschema:"user to act as (user or root); default user"`
}

type listFilesOut struct {
	Entries []client.Entry `json:"entries"`
}

func (t *tools) listFiles(ctx context.Context, _ *mcp.CallToolRequest, in listFilesIn) (*mcp.CallToolResult, listFilesOut, error) {
	tok, err := t.token(ctx, in.SandboxID)
	if err != nil {
		return nil, listFilesOut{}, err
	}
	path := in.Path
	if path == "" {
		path = "."
	}
	es, err := t.c.ListDir(ctx, in.SandboxID, tok, in.User, path, in.Depth)
	if err != nil {
		return nil, listFilesOut{}, err
	}
	if es == nil {
		es = []client.Entry{}
	}
	return nil, listFilesOut{Entries: es}, nil
}

type snapshotIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Name      string `json:"name,omitempty" jsonschema:"a name to find the snapshot by"`
}

type snapshotOut struct {
	SnapshotID string   `json:"snapshot_id"`
	Names      []string `json:"names,omitempty"`
	SizeBytes  int64    `json:"size_bytes"`
}

func (t *tools) snapshot(ctx context.Context, _ *mcp.CallToolRequest, in snapshotIn) (*mcp.CallToolResult, snapshotOut, error) {
	body := map[string]any{}
	if in.Name != "" {
		body["name"] = in.Name
	}
	var sn struct {
		SnapshotID string   `json:"snapshotID"`
		Names      []string `json:"names"`
		SizeBytes  int64    `json:"sizeBytes"`
	}
	if _, err := t.c.Do(ctx, http.MethodPost, sandboxPath(in.SandboxID, "/snapshots"), nil, body, &sn); err != nil {
		return nil, snapshotOut{}, err
	}
	return nil, snapshotOut{SnapshotID: sn.SnapshotID, Names: sn.Names, SizeBytes: sn.SizeBytes}, nil
}

func sandboxPath(id, suffix string) string { return "/sandboxes/" + url.PathEscape(id) + suffix }

type forkIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	Count     int    `json:"count,omitempty" jsonschema:"how many copies; default 1"`
}

type forkOut struct {
	SandboxIDs []string `json:"sandbox_ids"`
	Errors     []string `json:"errors,omitempty"`
}

func (t *tools) fork(ctx context.Context, _ *mcp.CallToolRequest, in forkIn) (*mcp.CallToolResult, forkOut, error) {
	n := max(in.Count, 1)
	var res []struct {
		Sandbox *apitypes.Sandbox `json:"sandbox"`
		Error   *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if _, err := t.c.Do(ctx, http.MethodPost, sandboxPath(in.SandboxID, "/fork"), nil, map[string]any{"count": n}, &res); err != nil {
		return nil, forkOut{}, err
	}
	out := forkOut{SandboxIDs: []string{}}
	for _, r := range res {
		switch {
		case r.Sandbox != nil:
			out.SandboxIDs = append(out.SandboxIDs, r.Sandbox.SandboxID)
		case r.Error != nil:
			out.Errors = append(out.Errors, r.Error.Message)
		}
	}
	return nil, out, nil
}

type rollbackIn struct {
	SandboxID  string `json:"sandbox_id" jsonschema:"the sandbox's id"`
	SnapshotID string `json:"snapshot_id" jsonschema:"a snapshot of this sandbox's tree (id or name)"`
}

type okOut struct {
	OK bool `json:"ok"`
}

func (t *tools) rollback(ctx context.Context, _ *mcp.CallToolRequest, in rollbackIn) (*mcp.CallToolResult, okOut, error) {
	if _, err := t.c.Do(ctx, http.MethodPost, sandboxPath(in.SandboxID, "/rollback"), nil, map[string]any{"snapshotID": in.SnapshotID}, nil); err != nil {
		return nil, okOut{}, err
	}
	return nil, okOut{OK: true}, nil
}

func (t *tools) pause(ctx context.Context, _ *mcp.CallToolRequest, in sandboxIn) (*mcp.CallToolResult, okOut, error) {
	if _, err := t.c.Do(ctx, http.MethodPost, sandboxPath(in.SandboxID, "/pause"), nil, nil, nil); err != nil {
		return nil, okOut{}, err
	}
	return nil, okOut{OK: true}, nil
}

func (t *tools) kill(ctx context.Context, _ *mcp.CallToolRequest, in sandboxIn) (*mcp.CallToolResult, okOut, error) {
	if _, err := t.c.Do(ctx, http.MethodDelete, sandboxPath(in.SandboxID, ""), nil, nil, nil); err != nil {
		return nil, okOut{}, err
	}
	return nil, okOut{OK: true}, nil
}

type listOut struct {
	Sandboxes []listedSandbox `json:"sandboxes"`
}

type listedSandbox struct {
	SandboxID  string            `json:"sandbox_id"`
	TemplateID string            `json:"template_id"`
	State      string            `json:"state"`
	StartedAt  string            `json:"started_at"`
	EndAt      string            `json:"end_at"`
	Metadata   map[string]string `json:"metadata,omitempty"`
}

func (t *tools) list(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, listOut, error) {
	var items []struct {
		SandboxID  string            `json:"sandboxID"`
		TemplateID string            `json:"templateID"`
		State      string            `json:"state"`
		StartedAt  string            `json:"startedAt"`
		EndAt      string            `json:"endAt"`
		Metadata   map[string]string `json:"metadata"`
	}
	q := url.Values{"state": {"running,paused"}, "limit": {"1000"}}
	if _, err := t.c.Do(ctx, http.MethodGet, "/v2/sandboxes", q, nil, &items); err != nil {
		return nil, listOut{}, err
	}
	out := listOut{Sandboxes: []listedSandbox{}}
	for _, it := range items {
		out.Sandboxes = append(out.Sandboxes, listedSandbox{SandboxID: it.SandboxID, TemplateID: it.TemplateID,
			State: it.State, StartedAt: it.StartedAt, EndAt: it.EndAt, Metadata: it.Metadata})
	}
	return nil, out, nil
}

// readResource serves cellfork://sandboxes/{id}/files/{+path}.
func (t *tools) readResource(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	rest, ok := strings.CutPrefix(uri, "cellfork://sandboxes/")
	if !ok {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	id, path, ok := strings.Cut(rest, "/files/")
	if !ok || id == "" || path == "" {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	if p, err := url.PathUnescape(path); err == nil {
		path = p
	}
	tok, err := t.token(ctx, id)
	if err != nil {
		return nil, err
	}
	b, err := t.c.ReadFile(ctx, id, tok, "", "/"+path, maxFileBytes)
	if err != nil {
		return nil, err
	}
	rc := &mcp.ResourceContents{URI: uri, MIMEType: http.DetectContentType(b)}
	if utf8.Valid(b) {
		rc.Text = string(b)
	} else {
		rc.Blob = b
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{rc}}, nil
}
