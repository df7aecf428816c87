package templates

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/cellfork/cellfork/internal/templates/build"
)

// Build statuses, as E2B's TemplateBuildStatus.
const (
	StatusWaiting  = "waiting"  // created, not started
	StatusBuilding = "building" // started (queued or running)
	StatusReady    = "ready"
	StatusError    = "error"
)

// Template is the record of one custom template.
type Template struct {
	ID string `json:"id"`
	// Team owns it: a cluster's template host keeps every team's
	// templates, each seeing its own ("" on a single host).
	Team      string    `json:"team,omitempty"`
	Names     []string  `json:"names"` // E2B's aliases
	Public    bool      `json:"public"`
	CPUCount  int       `json:"cpuCount"`
	MemoryMB  int       `json:"memoryMB"`
	DiskMB    int       `json:"diskMB"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
	// LastSpawnedAt and SpawnCount count the sandboxes created from it.
	LastSpawnedAt *time.Time `json:"lastSpawnedAt,omitempty"`
	SpawnCount    int64      `json:"spawnCount"`
	// Tags maps a tag to the build it names.
	Tags   map[string]TagRef `json:"tags"`
	Builds []*Build          `json:"builds"` // oldest first
}

// TagRef is where a tag points.
type TagRef struct {
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

// Build is the record of one build of a template.
type Build struct {
	ID         string     `json:"id"`
	Status     string     `json:"status"`
	CreatedAt  time.Time  `json:"createdAt"`
	UpdatedAt  time.Time  `json:"updatedAt"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
	CPUCount   int        `json:"cpuCount"`
	MemoryMB   int        `json:"memoryMB"`
	DiskMB     int        `json:"diskMB"`
	// Tags are assigned when the build succeeds.
	Tags []string `json:"tags,omitempty"`
	// Spec is what was asked for (registry credentials removed).
	Spec   *build.Spec `json:"spec,omitempty"`
	Reason *Reason     `json:"reason,omitempty"`
	// The result, once ready.
	Layers  []string      `json:"layers,omitempty"`
	Context build.Context `json:"context"`
	Rootfs  string        `json:"rootfs,omitempty"`
	Image   string        `json:"image,omitempty"`
	WarmKey string        `json:"warmKey,omitempty"`
	Cached  int           `json:"cached,omitempty"`
	// Purged: its root and image were removed (superseded, unused).
	Purged bool `json:"purged,omitempty"`
}

// Reason says why a build failed, as E2B's BuildStatusReason.
type Reason struct {
	Message string     `json:"message"`
	Step    string     `json:"step,omitempty"`
	Logs    []LogEntry `json:"logEntries,omitempty"`
}

// LogEntry is one line of a build log, as E2B's BuildLogEntry.
type LogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

func (t *Template) build(id string) *Build {
	for _, b := range t.Builds {
		if b.ID == id {
			return b
		}
	}
	return nil
}

// latestReady is the newest ready build, or nil.
func (t *Template) latestReady() *Build {
	for i := len(t.Builds) - 1; i >= 0; i-- {
		if b := t.Builds[i]; b.Status == StatusReady && !b.Purged {
			return b
		}
	}
	return nil
}

// tagsOf lists the tags naming build id.
func (t *Template) tagsOf(id string) []string {
	var out []string
	for tag, ref := range t.Tags {
		if ref.BuildID == id {
			out = append(out, tag)
		}
	}
	slices.Sort(out)
	return out
}

func cloneTemplate(t *Template) *Template {
	b, _ := json.Marshal(t)
	var c Template
	_ = json.Unmarshal(b, &c)
	return &c
}

// state is what templates.json holds.
type state struct {
	Templates []*Template `json:"templates"`
	// Removing are build directories to delete once no sandbox or
	// snapshot uses their root (deleted templates, superseded builds).
	Removing []string `json:"removing,omitempty"`
}

// saveState writes the records atomically.
func saveState(path string, st *state) error {
	b, err := json.MarshalIndent(st, "", " ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func loadState(path string) (*state, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return &state{}, nil
	}
	if err != nil {
		return nil, err
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// buildLog is the log of one build: in memory while it runs (and after,
// until the daemon restarts), appended to <build dir>/log.jsonl. Safe for
// concurrent use.
type buildLog struct {
	mu      sync.Mutex
	entries []LogEntry
	f       *os.File
}

// maxLogEntries bounds a build's log; later lines are dropped (counted).
const maxLogEntries = 20000

func openBuildLog(dir string) (*buildLog, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, "log.jsonl"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, err
	}
	return &buildLog{f: f}, nil
}

func (l *buildLog) add(e LogEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.entries) >= maxLogEntries {
		return
	}
	if len(l.entries) == maxLogEntries-1 {
		e = LogEntry{Timestamp: e.Timestamp, Level: "warn", Message: "log truncated: the build printed too much"}
	}
	l.entries = append(l.entries, e)
	if l.f != nil {
		b, _ := json.Marshal(e)
		_, _ = l.f.Write(append(b, '\n'))
	}
}

func (l *buildLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

func (l *buildLog) snapshot() []LogEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.entries)
}

// readBuildLog loads a finished build's log.
func readBuildLog(dir string) []LogEntry {
	f, err := os.Open(filepath.Join(dir, "log.jsonl"))
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []LogEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e LogEntry
		if json.Unmarshal(sc.Bytes(), &e) == nil {
			out = append(out, e)
		}
	}
	return out
}
