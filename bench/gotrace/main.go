// Command gotrace reads a Go execution trace of a sentry (runsc's global
// flags `--profile --trace=FILE`, given to the `runsc create` of a
// sandbox's shell; the file is complete once the sandbox exits) and says
// where a window of wall-clock time went, as Markdown:
//
//	go run ./bench/gotrace -from 1795911853.5446 -to 1795911853.5948 FILE
//	go run ./bench/gotrace -after-start 40ms FILE
//
// The window is given in Unix seconds (what the client saw), or as the
// first stretch after the restored kernel started (Kernel.Start). For it:
//
//   - goroutines that waited runnable longer than -min: a P held by a
//     goroutine blocked in a syscall shows up here (docs/benchmarks.md,
//     "The restore's tail": poll-handoff);
//   - syscalls longer than -min, with the stack that made them;
//   - running time by stack, the most first.
package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/exp/trace"
)

func main() {
	from := flag.Float64("from", 0, "window start, Unix seconds")
	to := flag.Float64("to", 0, "window end, Unix seconds")
	afterStart := flag.Duration("after-start", 0, "window: this long from the kernel's start (Kernel.Start)")
	over := flag.Duration("min", 500*time.Microsecond, "report waits and syscalls longer than this")
	depth := flag.Int("depth", 3, "stack frames to show")
	flag.Parse()
	if flag.NArg() != 1 || (*afterStart == 0) == (*to == 0) {
		log.Fatal("usage: gotrace (-from S -to S | -after-start D) [-min D] [-depth N] FILE")
	}
	evs, offset, err := read(flag.Arg(0))
	if err != nil {
		log.Fatal(err)
	}
	var t0, t1 trace.Time
	if *afterStart != 0 {
		i := slices.IndexFunc(evs, func(ev trace.Event) bool {
			return strings.Contains(stack(ev, 8), "kernel.(*Kernel).Start")
		})
		if i < 0 {
			log.Fatal("no Kernel.Start in the trace")
		}
		t0 = evs[i].Time()
		t1 = t0 + trace.Time(*afterStart)
	} else {
		if offset == 0 {
			log.Fatal("the trace has no clock snapshot: use -after-start")
		}
		t0 = traceTime(int64(*from*1e9) - offset)
		t1 = traceTime(int64(*to*1e9) - offset)
	}
	report(os.Stdout, evs, t0, t1, offset, *over, *depth)
}

func traceTime(ns int64) trace.Time { return trace.Time(ns) }

// read returns the trace's events and the offset from trace time to Unix
// nanoseconds (0 if the trace has no clock snapshot). A trace cut short
// (a sandbox killed) is read up to the cut.
func read(path string) ([]trace.Event, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	r, err := trace.NewReader(f)
	if err != nil {
		return nil, 0, err
	}
	var evs []trace.Event
	var offset int64
	for {
		ev, err := r.ReadEvent()
		if errors.Is(err, io.EOF) {
			return evs, offset, nil
		}
		if err != nil {
			if len(evs) == 0 {
				return nil, 0, err
			}
			fmt.Fprintf(os.Stderr, "gotrace: the trace ends early (%v): read up to there\n", err)
			return evs, offset, nil
		}
		if ev.Kind() == trace.EventSync && offset == 0 {
			if cs := ev.Sync().ClockSnapshot; cs != nil {
				offset = cs.Wall.UnixNano() - int64(cs.Trace)
			}
		}
		evs = append(evs, ev)
	}
}

// stack is the event's stack, or its transition's, n frames deep.
func stack(ev trace.Event, n int) string {
	st := ev.Stack()
	if st == trace.NoStack && ev.Kind() == trace.EventStateTransition {
		st = ev.StateTransition().Stack
	}
	var fs []string
	for f := range st.Frames() {
		fn := f.Func
		if i := strings.LastIndex(fn, "/"); i >= 0 {
			fn = fn[i+1:]
		}
		if fs = append(fs, fn); len(fs) == n {
			break
		}
	}
	return strings.Join(fs, " < ")
}

type span struct {
	g     trace.GoID
	start trace.Time
	d     time.Duration
	stack string
}

func report(w io.Writer, evs []trace.Event, t0, t1 trace.Time, offset int64, over time.Duration, depth int) {
	since := map[trace.GoID]trace.Time{}  // entered its current state
	last := map[trace.GoID]string{}       // its last known stack
	stateStack := map[trace.GoID]string{} // the stack it entered its state with
	busy := map[string]time.Duration{}
	var waits, syscalls []span
	for _, ev := range evs {
		if ev.Kind() != trace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		g := st.Resource.Goroutine()
		from, _ := st.Goroutine()
		t := ev.Time()
		if s := stack(ev, depth); s != "" {
			last[g] = s
		}
		if s, ok := since[g]; ok && t >= t0 && s <= t1 {
			// The part of the state's span inside the window.
			d := time.Duration(min(t, t1) - max(s, t0))
			sp := span{g, s, time.Duration(t - s), stateStack[g]}
			switch from {
			case trace.GoRunnable:
				if sp.d > over {
					waits = append(waits, sp)
				}
			case trace.GoSyscall:
				if sp.d > over {
					syscalls = append(syscalls, sp)
				}
			case trace.GoRunning:
				busy[last[g]] += d
			}
		}
		since[g], stateStack[g] = t, last[g]
	}
	at := func(t trace.Time) string {
		if offset == 0 {
			return fmt.Sprintf("%+.2f ms", float64(t-t0)/1e6)
		}
		return time.Unix(0, int64(t)+offset).Format("15:04:05.000000")
	}
	fmt.Fprintf(w, "Window %s to %s (%.1f ms).\n\n", at(t0), at(t1), float64(t1-t0)/1e6)
	table := func(title string, rows []span) {
		slices.SortFunc(rows, func(a, b span) int { return cmp.Compare(a.start, b.start) })
		fmt.Fprintf(w, "%s (over %s): %d\n\n| start | ms | goroutine | stack |\n|---|---|---|---|\n", title, over, len(rows))
		for _, r := range rows {
			fmt.Fprintf(w, "| %s | %.2f | %d | %s |\n", at(r.start), float64(r.d)/1e6, r.g, r.stack)
		}
		fmt.Fprintln(w)
	}
	table("Goroutines runnable but not running", waits)
	table("Syscalls", syscalls)
	type kv struct {
		k string
		v time.Duration
	}
	var kvs []kv
	for k, v := range busy {
		kvs = append(kvs, kv{k, v})
	}
	slices.SortFunc(kvs, func(a, b kv) int { return cmp.Compare(b.v, a.v) })
	fmt.Fprintf(w, "Running time in the window by stack (the goroutine's last):\n\n| ms | stack |\n|---|---|\n")
	for i, x := range kvs {
		if i == 15 {
			break
		}
		fmt.Fprintf(w, "| %.2f | %s |\n", float64(x.v)/1e6, x.k)
	}
}
