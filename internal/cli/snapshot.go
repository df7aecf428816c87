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

// snapshotInfo is the daemon's snapshot JSON (POST /sandboxes/{id}/snapshots,
// GET /snapshots).
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
	ParentID   *string  `json:"parentID"`
	SandboxID  string   `json:"sandboxID"`
	TemplateID string   `json:"templateID"`
	SizeBytes  int64    `json:"sizeBytes"`
	CreatedAt  string   `json:"createdAt"`
}

func (s *snapshotInfo) parent() string {
	if s.ParentID == nil {
		return ""
	}
	return *s.ParentID
}

func decodeSnapshot(raw json.RawMessage) (*snapshotInfo, error) {
	var s snapshotInfo
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
	body := struct {
		Name string `json:"name,omitempty"`
	}{*name}
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
	snaps := make([]*snapshotInfo, 0, len(items))
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
	return a.printSnapshotTable([]*snapshotInfo{s})
}

func (a *app) printSnapshotTable(snaps []*snapshotInfo) error {
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAMES\tPARENT\tSANDBOX\tSIZE\tCREATED")
	for _, s := range snaps {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.SnapshotID, namesCell(s.Names), orDash(s.parent()),
			orDash(s.SandboxID), humanBytes(s.SizeBytes), shortTime(s.CreatedAt))
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

// snapshotNode is one snapshot in the tree built from parentIDs.
type snapshotNode struct {
	raw      json.RawMessage
	info     *snapshotInfo
	children []*snapshotNode
	// note explains a root that has a parent: not listed, or a cycle.
	note string
}

// buildSnapshotTree arranges snapshots into a forest by parentID, keeping
// the daemon's order (oldest first) among siblings. A snapshot whose parent
// is not listed is a root; so is one caught in a parent cycle (which a
// sane daemon never reports), so every snapshot appears exactly once.
func buildSnapshotTree(items []json.RawMessage) ([]*snapshotNode, error) {
	nodes := make([]*snapshotNode, 0, len(items))
	byID := map[string]*snapshotNode{}
	for _, raw := range items {
		s, err := decodeSnapshot(raw)
		if err != nil {
			return nil, err
		}
		if byID[s.SnapshotID] != nil {
			continue // listed twice (a page boundary moved); keep the first
		}
		n := &snapshotNode{raw: raw, info: s}
		nodes = append(nodes, n)
		byID[s.SnapshotID] = n
	}
	var roots []*snapshotNode
	for _, n := range nodes {
		p := n.info.parent()
		if parent := byID[p]; parent != nil && p != n.info.SnapshotID {
			parent.children = append(parent.children, n)
			continue
		}
		switch {
		case p == n.info.SnapshotID:
			n.note = "(its own parent)"
		case p != "":
			n.note = fmt.Sprintf("(parent %s not listed)", p)
		}
		roots = append(roots, n)
	}
	// Nodes in a cycle are unreachable from the roots: cut each cycle at its
	// first node (in list order) and make that a root.
	reached := map[*snapshotNode]bool{}
	var mark func(*snapshotNode)
	mark = func(n *snapshotNode) {
		if reached[n] {
			return
		}
		reached[n] = true
		for _, c := range n.children {
			mark(c)
		}
	}
	for _, r := range roots {
		mark(r)
	}
	for _, n := range nodes {
		if reached[n] {
			continue
		}
		parent := byID[n.info.parent()]
		for i, c := range parent.children {
			if c == n {
				parent.children = append(parent.children[:i:i], parent.children[i+1:]...)
				break
			}
		}
		n.note = fmt.Sprintf("(parent cycle via %s)", n.info.parent())
		roots = append(roots, n)
		mark(n)
	}
	return roots, nil
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
	items, err := c.listPages(ctx, "/snapshots", "snapshots", url.Values{})
	if err != nil {
		return err
	}
	roots, err := buildSnapshotTree(items)
	if err != nil {
		return err
	}
	if a.g.json {
		out, err := treeJSON(roots)
		if err != nil {
			return err
		}
		return a.printJSONValue(out)
	}
	return printSnapshotTree(a.stdout, roots)
}

// printSnapshotTree draws the forest, one snapshot a line: the id indented
// under its parent, then its names, size and source sandbox in aligned
// columns.
func printSnapshotTree(w io.Writer, roots []*snapshotNode) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SNAPSHOT\tNAMES\tSIZE\tSANDBOX")
	var walk func(n *snapshotNode, prefix, branch string)
	walk = func(n *snapshotNode, prefix, branch string) {
		s := n.info
		line := fmt.Sprintf("%s%s%s\t%s\t%s\t%s", prefix, branch, s.SnapshotID, namesCell(s.Names),
			humanBytes(s.SizeBytes), orDash(s.SandboxID))
		if n.note != "" {
			line += "\t" + n.note
		}
		fmt.Fprintln(tw, line)
		switch branch {
		case "├── ":
			prefix += "│   "
		case "└── ":
			prefix += "    "
		}
		for i, c := range n.children {
			b := "├── "
			if i == len(n.children)-1 {
				b = "└── "
			}
			walk(c, prefix, b)
		}
	}
	for _, r := range roots {
		walk(r, "", "")
	}
	return tw.Flush()
}

// treeJSON renders the forest as the daemon's snapshot objects, each with
// a "children" array.
func treeJSON(nodes []*snapshotNode) ([]map[string]json.RawMessage, error) {
	out := make([]map[string]json.RawMessage, 0, len(nodes))
	for _, n := range nodes {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(n.raw, &obj); err != nil {
			return nil, fmt.Errorf("decoding snapshot: %w", err)
		}
		children, err := treeJSON(n.children)
		if err != nil {
			return nil, err
		}
		raw, err := json.Marshal(children)
		if err != nil {
			return nil, err
		}
		obj["children"] = raw
		out = append(out, obj)
	}
	return out, nil
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

// snapshotUsageInfo is GET /snapshots/usage.
type snapshotUsageInfo struct {
	TotalBytes int64 `json:"totalBytes"`
	CapBytes   int64 `json:"capBytes"`
	Count      int64 `json:"count"`
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
	var u snapshotUsageInfo
	if err := json.Unmarshal(raw, &u); err != nil {
		return fmt.Errorf("decoding snapshot usage: %w", err)
	}
	fmt.Fprintln(a.stdout, formatUsage(u))
	return nil
}

func formatUsage(u snapshotUsageInfo) string {
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
