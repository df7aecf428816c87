package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/cellfork/cellfork/internal/envd/process"
	"github.com/cellfork/cellfork/internal/envd/process/processconnect"
)

const (
	testKey   = "test-key"
	testToken = "envd-token"
)

// fakeDaemon answers the few daemon endpoints the CLI calls with canned
// JSON, and records what it was sent. Safe for concurrent use.
type fakeDaemon struct {
	t    *testing.T
	srv  *httptest.Server
	proc *fakeProcess

	mu       sync.Mutex
	requests []*recorded
	pages    []listPage // GET /v2/sandboxes answers, by page
	snaps    []listPage // GET /snapshots answers, by page
	tree     string     // GET /snapshots/tree answer
	execute  string     // POST /execute NDJSON answer
}

type recorded struct {
	Method string
	Path   string
	Query  string
	Header http.Header
	Body   string
}

type listPage struct {
	Body string
	Next string
}

func newFakeDaemon(t *testing.T) *fakeDaemon {
	t.Helper()
	d := &fakeDaemon{t: t, proc: &fakeProcess{}}
	mux := http.NewServeMux()
	path, h := processconnect.NewProcessHandler(d.proc)
	mux.Handle(path, d.dataPlane(h))
	mux.HandleFunc("POST /v2/sandboxes", d.create)
	mux.HandleFunc("GET /v2/sandboxes", d.list)
	mux.HandleFunc("POST /v2/sandboxes/{id}/connect", d.connect)
	mux.HandleFunc("DELETE /sandboxes/{id}", d.kill)
	mux.HandleFunc("POST /execute", d.executeHandler)
	d.forkFirstRoutes(mux)
	d.srv = httptest.NewServer(d.record(mux))
	t.Cleanup(d.srv.Close)
	return d
}

func (d *fakeDaemon) record(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		d.mu.Lock()
		d.requests = append(d.requests, &recorded{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Clone(), string(body)})
		d.mu.Unlock()
		w.Header().Set("X-Request-Id", "req-"+r.Method)
		if r.Header.Get("E2b-Sandbox-Port") == "" && r.Header.Get("X-API-KEY") != testKey {
			writeError(w, http.StatusUnauthorized, "invalid API key")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// dataPlane checks the envd routing headers and answers like the daemon's
// proxy for an unknown sandbox.
func (d *fakeDaemon) dataPlane(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("E2b-Sandbox-Id") == "gone" {
			writeError(w, http.StatusBadGateway, "The sandbox was not found")
			return
		}
		if r.Header.Get("E2b-Sandbox-Port") != "49983" || r.Header.Get("X-Access-Token") != testToken {
			writeError(w, http.StatusUnauthorized, "bad data-plane headers")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}

func (d *fakeDaemon) create(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"templateID":"base","sandboxID":"sbx1","clientID":"local","envdVersion":"0.6.13","envdAccessToken":"envd-token","domain":null}`)
}

func (d *fakeDaemon) list(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	pages := d.pages
	d.mu.Unlock()
	servePages(w, r, pages)
}

// servePages answers a paged listing: the nextToken's last digit is the
// page index.
func servePages(w http.ResponseWriter, r *http.Request, pages []listPage) {
	i := 0
	if tok := r.URL.Query().Get("nextToken"); tok != "" {
		i = int(tok[len(tok)-1] - '0')
	}
	if i >= len(pages) {
		writeError(w, http.StatusBadRequest, "bad token")
		return
	}
	if pages[i].Next != "" {
		w.Header().Set("X-Next-Token", pages[i].Next)
	}
	io.WriteString(w, pages[i].Body)
}

func (d *fakeDaemon) connect(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if id == "missing" {
		writeError(w, http.StatusNotFound, "sandbox missing not found")
		return
	}
	if id == "paused" { // resumed: 201, as the daemon answers
		w.WriteHeader(http.StatusCreated)
	}
	io.WriteString(w, `{"templateID":"base","sandboxID":"`+id+`","clientID":"local","envdVersion":"0.6.13","envdAccessToken":"envd-token"}`)
}

func (d *fakeDaemon) kill(w http.ResponseWriter, r *http.Request) {
	if r.PathValue("id") == "missing" {
		writeError(w, http.StatusNotFound, "sandbox missing not found")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (d *fakeDaemon) executeHandler(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("E2b-Sandbox-Port") != "49999" || r.Header.Get("X-Access-Token") != testToken {
		http.Error(w, "bad headers", http.StatusUnauthorized)
		return
	}
	if r.Header.Get("E2b-Sandbox-Id") == "nokernel" {
		http.Error(w, "Context not found", http.StatusNotFound)
		return
	}
	d.mu.Lock()
	body := d.execute
	d.mu.Unlock()
	io.WriteString(w, body)
}

// last returns the last recorded request with this method and path.
func (d *fakeDaemon) last(method, path string) *recorded {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := len(d.requests) - 1; i >= 0; i-- {
		if r := d.requests[i]; r.Method == method && r.Path == path {
			return r
		}
	}
	d.t.Fatalf("no %s %s request recorded", method, path)
	return nil
}

// run runs the CLI against the fake daemon with CELLFORK_URL/API_KEY set.
func (d *fakeDaemon) run(ctx context.Context, stdin string, args ...string) (code int, stdout, stderr string) {
	env := map[string]string{"CELLFORK_URL": d.srv.URL, "CELLFORK_API_KEY": testKey}
	return runCLI(ctx, env, stdin, args...)
}

func runCLI(ctx context.Context, env map[string]string, stdin string, args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	a := &app{
		stdin:  strings.NewReader(stdin),
		stdout: &out,
		stderr: &errOut,
		getenv: func(k string) string { return env[k] },
	}
	code := a.main(ctx, args)
	return code, out.String(), errOut.String()
}

// fakeProcess is an envd process service whose behaviour is picked by the
// bash script it is asked to run. Safe for concurrent use.
type fakeProcess struct {
	processconnect.UnimplementedProcessHandler

	mu      sync.Mutex
	start   *process.StartRequest
	header  http.Header
	started bool
	signals []uint32
}

func (f *fakeProcess) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	f.mu.Lock()
	f.start, f.header, f.started = req.Msg, req.Header().Clone(), true
	f.mu.Unlock()
	if script := req.Msg.GetProcess().GetArgs()[2]; script == "fail" {
		return connect.NewError(connect.CodeInternal, errors.New("boom"))
	}
	send := func(ev *process.ProcessEvent) error {
		return stream.Send(&process.StartResponse{Event: ev})
	}
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: 42}}}); err != nil {
		return err
	}
	for _, ev := range fakeScript(req.Msg.GetProcess().GetArgs()[2]) {
		if ev == nil { // block until the client goes away
			<-ctx.Done()
			return ctx.Err()
		}
		if err := send(ev); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeProcess) SendSignal(_ context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	f.mu.Lock()
	f.signals = append(f.signals, req.Msg.GetProcess().GetPid())
	f.mu.Unlock()
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (f *fakeProcess) snapshot() (start *process.StartRequest, h http.Header, started bool, signals []uint32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.start, f.header, f.started, append([]uint32(nil), f.signals...)
}

func dataEv(stdout, stderr string) *process.ProcessEvent {
	d := &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: []byte(stdout)}}
	if stderr != "" {
		d.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: []byte(stderr)}
	}
	return &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: d}}
}

func endEv(code int32, exited bool, status string, errMsg *string) *process.ProcessEvent {
	return &process.ProcessEvent{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{
		ExitCode: code, Exited: exited, Status: status, Error: errMsg,
	}}}
}

// fakeScript maps a script to the events after start; a nil event blocks.
func fakeScript(script string) []*process.ProcessEvent {
	keepalive := &process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}
	switch script {
	case "echo hi", "'echo hi'":
		return []*process.ProcessEvent{dataEv("hi\n", ""), keepalive, dataEv("", "oops\n"), endEv(0, true, "exit status 0", nil)}
	case "exit3":
		return []*process.ProcessEvent{endEv(3, true, "exit status 3", nil)}
	case "killed":
		return []*process.ProcessEvent{endEv(-1, false, "signal: killed", nil)}
	case "noend":
		return nil
	case "sleep":
		return []*process.ProcessEvent{dataEv("zz\n", ""), nil}
	}
	msg := "unknown script"
	return []*process.ProcessEvent{endEv(127, true, "exit status 127", &msg)}
}
