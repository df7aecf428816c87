package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"runtime/trace"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// sleepInSyscall blocks 30 ms in a plain nanosleep syscall.
func sleepInSyscall() {
	ts := syscall.Timespec{Nsec: int64(30 * time.Millisecond)}
	syscall.Syscall(syscall.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// A trace of this process, with a goroutine 30 ms in a syscall, read back:
// the syscall is in its table with the function that made it, and the
// whole trace's window is read by wall clock.
func TestReport(t *testing.T) {
	var buf bytes.Buffer
	start := time.Now()
	if err := trace.Start(&buf); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { sleepInSyscall(); close(done) }()
	<-done
	trace.Stop()
	end := time.Now()
	path := filepath.Join(t.TempDir(), "trace")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	evs, offset, err := read(path)
	if err != nil {
		t.Fatal(err)
	}
	if offset == 0 {
		t.Fatal("no clock snapshot in a Go 1.26 trace")
	}
	var out strings.Builder
	report(&out, evs, 0, 0, 0, time.Millisecond, 3) // an empty window
	if !strings.Contains(out.String(), "Syscalls (over 1ms): 0") {
		t.Fatalf("an empty window reported syscalls:\n%s", out.String())
	}
	out.Reset()
	from, to := start.UnixNano()-offset, end.UnixNano()-offset
	report(&out, evs, traceTime(from), traceTime(to), offset, time.Millisecond, 3)
	m := regexp.MustCompile(`\| [0-9:.]+ \| ([0-9.]+) \| \d+ \| [^|]*sleepInSyscall`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("the 30 ms syscall is not reported:\n%s", out.String())
	}
	if ms, err := strconv.ParseFloat(m[1], 64); err != nil || ms < 25 {
		t.Fatalf("the syscall took %s ms, want about 30:\n%s", m[1], out.String())
	}
}
