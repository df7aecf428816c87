package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"

	"github.com/cellfork/cellfork/internal/api/apitypes"
)

func (a *app) snapshot(ctx context.Context, args []string) error {
	fs := a.flagSet("snapshot")
	rest, err := parseArgs(fs, args, 1)
	if err != nil {
		return flagError(err, usageSnapshot)
	}
	if len(rest) == 0 {
		return &usageError{msg: "missing snapshot subcommand", usage: usageSnapshot}
	}
	switch rest[0] {
	case "create":
		return a.snapshotCreate(ctx, rest[1:])
	case "list", "ls":
		return a.snapshotList(ctx, rest[1:])
	case "get", "show":
		return a.snapshotGet(ctx, rest[1:])
	case "tree":
		return a.snapshotTree(ctx, rest[1:])
	case "rm", "delete":
		return a.snapshotRemove(ctx, rest[1:])
	case "usage", "du":
		return a.snapshotUsage(ctx, rest[1:])
	}
	return &usageError{msg: fmt.Sprintf("unknown snapshot subcommand %q", rest[0]), usage: usageSnapshot}
}

// parentOf is a snapshot's parentID, "" for a root.
func parentOf(s *apitypes.Snapshot) string { return apitypes.Value(s.ParentID) }

func decodeSnapshot(raw json.RawMessage) (*apitypes.Snapshot, error) {
	var s apitypes.Snapshot
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("decoding snapshot: %w", err)
	}
	if s.SnapshotID == "" {
		return nil, fmt.Errorf("decoding snapshot: no snapshotID in %s", raw)
	}
	return &s, nil
}

func (a *app) snapshotCreate(ctx context.Context, args []string) error {
	fs := a.flagSet("snapshot create")
	name := fs.String("name", "", "")
	id, err := parseOneID(fs, args, "sandbox id", usageSnapshotCreate)
	if err != nil {
		return err
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	body := apitypes.SnapshotRequest{Name: apitypes.Optional(*name)}
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/snapshots", nil, body, &raw); err != nil {
		return err
	}
	if a.g.json {
		return a.printJSON(raw)
	}
	s, err := decodeSnapshot(raw)
	if err != nil {
		return err
	}
	fmt.Fprintln(a.stdout, s.SnapshotID)
	return nil
}

func (a *app) snapshotList(ctx context.Context, args []string) error {
	fs := a.flagSet("snapshot list")
	sandbox := fs.String("sandbox", "", "")
	name := fs.String("name", "", "")
	if err := parseNoArgs(fs, args, usageSnapshotList); err != nil {
		return err
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	q := url.Values{}
	if *sandbox != "" {
		q.Set("sandboxID", *sandbox)
	}
	if *name != "" {
		q.Set("name", *name)
	}
	items, err := c.listPages(ctx, "/snapshots", "snapshots", q)
	if err != nil {
		return err
	}
	if a.g.json {
		return a.printJSONValue(items)
	}
	snaps := make([]*apitypes.Snapshot, 0, len(items))
	for _, raw := range items {
		s, err := decodeSnapshot(raw)
		if err != nil {
			return err
		}
		snaps = append(snaps, s)
	}
	return a.printSnapshotTable(snaps)
}

func (a *app) snapshotGet(ctx context.Context, args []string) error {
	fs := a.flagSet("snapshot get")
	id, err := parseOneID(fs, args, "snapshot id", usageSnapshotGet)
	if err != nil {
		return err
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodGet, "/snapshots/"+url.PathEscape(id), nil, nil, &raw); err != nil {
		return err
	}
	if a.g.json {
		return a.printJSON(raw)
	}
	s, err := decodeSnapshot(raw)
	if err != nil {
		return err
	}
	return a.printSnapshotTable([]*apitypes.Snapshot{s})
}

func (a *app) printSnapshotTable(snaps []*apitypes.Snapshot) error {
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAMES\tPARENT\tSANDBOX\tSIZE\tSTORE\tCREATED")
	for _, s := range snaps {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.SnapshotID, namesCell(s.Names), orDash(parentOf(s)),
			orDash(s.SandboxID), humanBytes(s.SizeBytes), orDash(string(apitypes.Value(s.UploadState))), shortTime(s.CreatedAt))
	}
	return tw.Flush()
}

func namesCell(names []string) string {
	return orDash(strings.Join(names, ","))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// humanBytes renders a byte count in binary units: 512 B, 1.5 KiB, 20.0 GiB.
func humanBytes(n int64) string {
	if n < 1024 && n > -1024 {
		return fmt.Sprintf("%d B", n)
	}
	v := float64(n)
	for _, unit := range []string{"KiB", "MiB", "GiB", "TiB"} {
		v /= 1024
		if v < 1024 && v > -1024 || unit == "TiB" {
			return fmt.Sprintf("%.1f %s", v, unit)
		}
	}
	panic("unreachable")
}

func (a *app) snapshotTree(ctx context.Context, args []string) error {
	fs := a.flagSet("snapshot tree")
	if err := parseNoArgs(fs, args, usageSnapshotTree); err != nil {
		return err
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	// The daemon builds the tree (GET /snapshots/tree); the CLI draws it.
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodGet, "/snapshots/tree", nil, nil, &raw); err != nil {
		return err
	}
	if a.g.json {
		return a.printJSON(raw)
	}
	var roots []apitypes.SnapshotNode
	if err := json.Unmarshal(raw, &roots); err != nil {
		return fmt.Errorf("decoding snapshot tree: %w", err)
	}
	return printSnapshotTree(a.stdout, roots)
}

// printSnapshotTree draws the forest, one snapshot a line: the id indented
// under its parent, then its names, size and source sandbox in aligned
// columns. A root whose parent is gone says so.
func printSnapshotTree(w io.Writer, roots []apitypes.SnapshotNode) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SNAPSHOT\tNAMES\tSIZE\tSANDBOX")
	var walk func(n *apitypes.SnapshotNode, prefix, branch string)
	walk = func(n *apitypes.SnapshotNode, prefix, branch string) {
		line := fmt.Sprintf("%s%s%s\t%s\t%s\t%s", prefix, branch, n.SnapshotID, namesCell(n.Names),
			humanBytes(n.SizeBytes), orDash(n.SandboxID))
		if p := apitypes.Value(n.ParentID); branch == "" && p != "" {
			line += fmt.Sprintf("\t(parent %s gone)", p)
		}
		fmt.Fprintln(tw, line)
		switch branch {
		case "├── ":
			prefix += "│   "
		case "└── ":
			prefix += "    "
		}
		for i := range n.Children {
			b := "├── "
			if i == len(n.Children)-1 {
				b = "└── "
			}
			walk(&n.Children[i], prefix, b)
		}
	}
	for i := range roots {
		walk(&roots[i], "", "")
	}
	return tw.Flush()
}

func (a *app) snapshotRemove(ctx context.Context, args []string) error {
	fs := a.flagSet("snapshot rm")
	ids, err := parseArgs(fs, args, 0)
	if err != nil {
		return flagError(err, usageSnapshotRemove)
	}
	if len(ids) == 0 {
		return &usageError{msg: "missing snapshot id", usage: usageSnapshotRemove}
	}
	return a.deleteEach(ctx, ids, "/snapshots/", "snapshotID", "deleted")
}

func (a *app) snapshotUsage(ctx context.Context, args []string) error {
	fs := a.flagSet("snapshot usage")
	if err := parseNoArgs(fs, args, usageSnapshotUsage); err != nil {
		return err
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	var raw json.RawMessage
	if _, err := c.do(ctx, http.MethodGet, "/snapshots/usage", nil, nil, &raw); err != nil {
		return err
	}
	if a.g.json {
		return a.printJSON(raw)
	}
	var u apitypes.SnapshotUsage
	if err := json.Unmarshal(raw, &u); err != nil {
		return fmt.Errorf("decoding snapshot usage: %w", err)
	}
	fmt.Fprintln(a.stdout, formatUsage(u))
	return nil
}

func formatUsage(u apitypes.SnapshotUsage) string {
	noun := "snapshots"
	if u.Count == 1 {
		noun = "snapshot"
	}
	s := fmt.Sprintf("%d %s, %s", u.Count, noun, humanBytes(u.TotalBytes))
	if u.CapBytes <= 0 {
		return s + " (no cap)"
	}
	return s + fmt.Sprintf(" of %s cap (%.1f%%)", humanBytes(u.CapBytes), 100*float64(u.TotalBytes)/float64(u.CapBytes))
}

// parseOneID parses the flags of a command that takes one positional
// argument (what: "sandbox id", "snapshot id") and returns it, or a usage
// error naming what is missing or extra.
func parseOneID(fs *flag.FlagSet, args []string, what, usage string) (string, error) {
	pos, err := parseArgs(fs, args, 0)
	switch {
	case err != nil:
		return "", flagError(err, usage)
	case len(pos) == 0:
		return "", &usageError{msg: "missing " + what, usage: usage}
	case len(pos) > 1:
		return "", &usageError{msg: fmt.Sprintf("unexpected argument %q", pos[1]), usage: usage}
	}
	return pos[0], nil
}

// printJSONValue encodes v and prints it like printJSON.
func (a *app) printJSONValue(v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding output: %w", err)
	}
	return a.printJSON(raw)
}
