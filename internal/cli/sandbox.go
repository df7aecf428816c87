package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"text/tabwriter"
	"time"

	"github.com/cellfork/cellfork/internal/api/apitypes"
)

// maxListPages guards against a daemon that never stops paging.
const maxListPages = 10000

func (a *app) sandbox(ctx context.Context, args []string) error {
	fs := a.flagSet("sandbox")
	rest, err := parseArgs(fs, args, 1)
	if err != nil {
		return flagError(err, usageSandbox)
	}
	if len(rest) == 0 {
		return &usageError{msg: "missing sandbox subcommand", usage: usageSandbox}
	}
	switch rest[0] {
	case "create":
		return a.sandboxCreate(ctx, rest[1:])
	case "list", "ls":
		return a.sandboxList(ctx, rest[1:])
	case "kill", "rm":
		return a.sandboxKill(ctx, rest[1:])
	}
	return &usageError{msg: fmt.Sprintf("unknown sandbox subcommand %q", rest[0]), usage: usageSandbox}
}

func (a *app) sandboxCreate(ctx context.Context, args []string) error {
	fs := a.flagSet("sandbox create")
	var env, meta kvFlag
	var allowOut, denyOut listFlag
	template := fs.String("template", "base", "")
	noInternet := fs.Bool("no-internet", false, "")
	fs.Var(&allowOut, "allow-out", "")
	fs.Var(&denyOut, "deny-out", "")
	snapshot := fs.String("snapshot", "", "")
	timeout := fs.Int("timeout", 300, "")
	fs.Var(&env, "env", "")
	fs.Var(&meta, "metadata", "")
	limits := map[string]*int{"cpus": nil, "memory-mb": nil, "disk-mb": nil, "pids-max": nil, "open-files": nil}
	for name := range limits {
		limits[name] = fs.Int(name, 0, "")
	}
	if err := parseNoArgs(fs, args, usageCreate); err != nil {
		return err
	}
	// --snapshot is --template by another name: the daemon takes a
	// snapshot's id or name as templateID.
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	given := func(name string) *int {
		if set[name] {
			return limits[name]
		}
		return nil
	}
	if set["snapshot"] {
		if set["template"] {
			return &usageError{msg: "--template and --snapshot are mutually exclusive", usage: usageCreate}
		}
		*template = *snapshot
	}
	if *template == "" {
		return &usageError{msg: "--template must not be empty", usage: usageCreate}
	}
	if *timeout <= 0 {
		return &usageError{msg: "--timeout must be positive", usage: usageCreate}
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	// Limits are sent only when given; the daemon checks them.
	req := apitypes.NewSandbox{TemplateID: *template, Timeout: timeout, Metadata: meta.wire(), EnvVars: env.wire(),
		CPUCount: given("cpus"), MemoryMB: given("memory-mb"), DiskSizeMB: given("disk-mb"),
		PidsMax: given("pids-max"), OpenFiles: given("open-files")}
	if *noInternet {
		req.AllowInternetAccess = new(bool)
	}
	if len(allowOut) > 0 || len(denyOut) > 0 {
		req.Network = &apitypes.NetworkConfig{AllowOut: allowOut, DenyOut: denyOut}
	}
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodPost, "/v2/sandboxes", nil, req, &raw); err != nil {
		return err
	}
	if a.g.json {
		return a.printJSON(raw)
	}
	var sb apitypes.Sandbox
	if err := json.Unmarshal(raw, &sb); err != nil || sb.SandboxID == "" {
		return fmt.Errorf("decoding create response: no sandboxID in %s", raw)
	}
	fmt.Fprintln(a.stdout, sb.SandboxID)
	return nil
}

// printJSON writes a JSON document indented, followed by a newline.
func (a *app) printJSON(raw json.RawMessage) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return fmt.Errorf("formatting JSON: %w", err)
	}
	buf.WriteByte('\n')
	_, err := a.stdout.Write(buf.Bytes())
	return err
}

func (a *app) sandboxList(ctx context.Context, args []string) error {
	fs := a.flagSet("sandbox list")
	var meta kvFlag
	state := fs.String("state", "", "")
	fs.Var(&meta, "metadata", "")
	if err := parseNoArgs(fs, args, usageList); err != nil {
		return err
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	items, err := c.listAll(ctx, listQuery(*state, meta.m))
	if err != nil {
		return err
	}
	if a.g.json {
		raw, err := json.Marshal(items)
		if err != nil {
			return fmt.Errorf("encoding list: %w", err)
		}
		return a.printJSON(raw)
	}
	return a.printSandboxTable(items)
}

// listQuery builds the GET /v2/sandboxes query (spec §2.4.5): metadata is
// itself a URL-encoded k=v&k2=v2 string whose keys and values are
// percent-encoded first, as the E2B SDKs send it.
func listQuery(state string, meta map[string]string) url.Values {
	q := url.Values{}
	if state != "" {
		q.Set("state", state)
	}
	if len(meta) > 0 {
		m := url.Values{}
		for k, v := range meta {
			m.Set(url.QueryEscape(k), url.QueryEscape(v))
		}
		q.Set("metadata", m.Encode())
	}
	return q
}

// listAll fetches every page of GET /v2/sandboxes.
func (c *apiClient) listAll(ctx context.Context, q url.Values) ([]json.RawMessage, error) {
	return c.listPages(ctx, "/v2/sandboxes", "sandboxes", q)
}

// listPages fetches every page of a JSON-array listing at path, following
// X-Next-Token. what names the listing in errors.
func (c *apiClient) listPages(ctx context.Context, path, what string, q url.Values) ([]json.RawMessage, error) {
	all := []json.RawMessage{}
	seen := map[string]bool{}
	for range maxListPages {
		var page []json.RawMessage
		h, err := c.do(ctx, http.MethodGet, path, q, nil, &page)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		next := h.Get("X-Next-Token")
		if next == "" {
			return all, nil
		}
		if seen[next] {
			return nil, fmt.Errorf("listing %s: daemon repeated page token %q", what, next)
		}
		seen[next] = true
		q.Set("nextToken", next)
	}
	return nil, fmt.Errorf("listing %s: more than %d pages", what, maxListPages)
}

func (a *app) printSandboxTable(items []json.RawMessage) error {
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTEMPLATE\tSTATE\tSTARTED\tENDS")
	for _, raw := range items {
		var s apitypes.ListedSandbox
		if err := json.Unmarshal(raw, &s); err != nil {
			return fmt.Errorf("decoding listed sandbox: %w", err)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.SandboxID, s.TemplateID, s.State, shortTime(s.StartedAt), shortTime(s.EndAt))
	}
	return tw.Flush()
}

// shortTime renders a time in UTC to the second.
func shortTime(t time.Time) string {
	return t.UTC().Format(time.RFC3339)
}

func (a *app) sandboxKill(ctx context.Context, args []string) error {
	fs := a.flagSet("sandbox kill")
	ids, err := parseArgs(fs, args, 0)
	if err != nil {
		return flagError(err, usageKill)
	}
	if len(ids) == 0 {
		return &usageError{msg: "missing sandbox id", usage: usageKill}
	}
	return a.deleteEach(ctx, ids, "/sandboxes/", "sandboxID", "killed")
}

// deleteEach sends DELETE prefix+id for every id. It prints each id it
// deleted (with --json, one {idKey, doneKey, "error"?} object per id) and
// reports a failure if any delete failed.
func (a *app) deleteEach(ctx context.Context, ids []string, prefix, idKey, doneKey string) error {
	c, err := a.client()
	if err != nil {
		return err
	}
	results := make([]map[string]any, 0, len(ids))
	failed := false
	for _, id := range ids {
		_, err := c.do(ctx, http.MethodDelete, prefix+url.PathEscape(id), nil, nil, nil)
		r := map[string]any{idKey: id, doneKey: err == nil}
		if err != nil {
			failed = true
			r["error"] = err.Error()
			fmt.Fprintf(a.stderr, "cellfork: %s\n", err)
		} else if !a.g.json {
			fmt.Fprintln(a.stdout, id)
		}
		results = append(results, r)
	}
	if a.g.json {
		if err := a.printJSONValue(results); err != nil {
			return err
		}
	}
	if failed {
		return &exitError{code: 1}
	}
	return nil
}
