package envd

import (
	"bufio"
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// metrics is the GET /metrics body (upstream envd's field names).
type metrics struct {
	Timestamp  int64   `json:"ts"`
	CPUCount   int     `json:"cpu_count"`
	CPUUsedPct float64 `json:"cpu_used_pct"`
	MemTotal   uint64  `json:"mem_total"`
	MemUsed    uint64  `json:"mem_used"`
	DiskUsed   uint64  `json:"disk_used"`
	DiskTotal  uint64  `json:"disk_total"`
}

// metricsHandler reads host metrics from /proc and statfs, best effort: a
// value that cannot be read is 0. CPU usage is measured since the previous
// request (since boot for the first). Safe for concurrent use.
type metricsHandler struct {
	procRoot string

	mu              sync.Mutex
	lastBusy, lastT uint64
}

func (m *metricsHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	out := metrics{Timestamp: time.Now().Unix(), CPUCount: runtime.NumCPU()}
	out.CPUUsedPct = m.cpuPercent()
	out.MemTotal, out.MemUsed = memory(m.procRoot + "/meminfo")
	var st syscall.Statfs_t
	if err := syscall.Statfs("/", &st); err == nil {
		bs := uint64(st.Bsize)
		out.DiskTotal = st.Blocks * bs
		out.DiskUsed = (st.Blocks - st.Bfree) * bs
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func (m *metricsHandler) cpuPercent() float64 {
	busy, total, ok := cpuTimes(m.procRoot + "/stat")
	if !ok {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	db, dt := busy-m.lastBusy, total-m.lastT
	if busy < m.lastBusy || total <= m.lastT {
		db, dt = busy, total
	}
	m.lastBusy, m.lastT = busy, total
	if dt == 0 {
		return 0
	}
	return math.Round(float64(db)/float64(dt)*10000) / 100
}

// cpuTimes parses the aggregate "cpu" line of /proc/stat.
func cpuTimes(path string) (busy, total uint64, ok bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := bytes.Cut(data, []byte{'\n'})
	fields := strings.Fields(string(line))
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, 0, false
	}
	for i, f := range fields[1:] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		if i >= 8 { // guest time is already counted in user time
			break
		}
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total, true
}

// memory returns MemTotal and MemTotal-MemAvailable in bytes.
func memory(path string) (total, used uint64) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	var avail uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "MemTotal":
			total = n * 1024
		case "MemAvailable":
			avail = n * 1024
		}
	}
	if avail > total {
		avail = total
	}
	return total, total - avail
}
