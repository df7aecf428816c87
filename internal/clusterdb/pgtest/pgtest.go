// Package pgtest runs a real PostgreSQL server for tests: initdb into a
// temporary directory and pg_ctl start, as a self-hoster would run one. As
// root (PostgreSQL refuses to run as root) the server runs as the
// "postgres" user that Debian's postgresql package creates.
package pgtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Bin is where Debian puts PostgreSQL 15's programs.
var Bin = "/usr/lib/postgresql/15/bin"

// Server is a running PostgreSQL.
type Server struct {
	Dir  string // data directory (and socket directory)
	Addr string // host:port it listens on
	URL  string // postgres:// URL of the database "cellfork" as superuser
	cred *syscall.Credential
}

// Start initializes and starts a server listening on listen (host:port;
// port 0 picks a free one) with its data under dir.
func Start(dir, listen string) (*Server, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, err
	}
	if port == "0" {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, err
		}
		port = strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		ln.Close()
	}
	s := &Server{Dir: filepath.Join(dir, "pg"), Addr: net.JoinHostPort(host, port)}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("PostgreSQL does not run as root and there is no postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.MkdirAll(s.Dir, 0o700); err != nil {
			return nil, err
		}
		if err := os.Chown(s.Dir, uid, gid); err != nil {
			return nil, err
		}
		// Its parents must let the postgres user through.
		for d := filepath.Dir(s.Dir); d != "/" && d != "."; d = filepath.Dir(d) {
			if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
				_ = os.Chmod(d, fi.Mode().Perm()|0o011)
			}
		}
	}
	if out, err := s.run("initdb", "-D", s.Dir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"); err != nil {
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	conf := fmt.Sprintf("listen_addresses = '%s'\nport = %s\nunix_socket_directories = '%s'\nfsync = off\nsynchronous_commit = off\nfull_page_writes = off\nshared_buffers = 32MB\nmax_connections = 200\n", host, port, s.Dir)
	if err := appendFile(filepath.Join(s.Dir, "postgresql.conf"), conf); err != nil {
		return nil, err
	}
	if err := appendFile(filepath.Join(s.Dir, "pg_hba.conf"), "host all all 0.0.0.0/0 trust\n"); err != nil {
		return nil, err
	}
	if err := s.StartServer(); err != nil {
		return nil, err
	}
	if out, err := s.run("createdb", "-h", s.Dir, "-p", port, "-U", "postgres", "cellfork"); err != nil {
		s.Stop()
		return nil, fmt.Errorf("createdb: %w: %s", err, out)
	}
	s.URL = fmt.Sprintf("postgres://postgres@%s/cellfork?sslmode=disable", s.Addr)
	return s, nil
}

// Main runs a package's tests (TestMain) with a server of their own,
// stored in *s while they run, and exits with their code.
func Main(m *testing.M, s **Server) {
	dir, _ := os.MkdirTemp("", "pgtest-")
	var err error
	if *s, err = Start(dir, "127.0.0.1:0"); err != nil {
		fmt.Fprintln(os.Stderr, "starting PostgreSQL:", err)
		os.Exit(1)
	}
	code := m.Run()
	(*s).Stop()
	os.RemoveAll(dir)
	os.Exit(code)
}

var databases atomic.Int64

// Database creates a database of the test's own on the server and returns
// its URL.
func (s *Server) Database(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d_%d", os.Getpid(), databases.Add(1))
	_, port, _ := net.SplitHostPort(s.Addr)
	if out, err := s.run("createdb", "-h", s.Dir, "-p", port, "-U", "postgres", name); err != nil {
		t.Fatalf("createdb: %v: %s", err, out)
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", s.Addr, name)
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteString(text)
	return err
}

func (s *Server) run(prog string, args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(Bin, prog), args...)
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd.CombinedOutput()
}

// StartServer starts the server (again) and waits until it answers.
func (s *Server) StartServer() error {
	if out, err := s.run("pg_ctl", "-D", s.Dir, "-l", filepath.Join(s.Dir, "server.log"), "-w", "-t", "60", "start"); err != nil {
		return fmt.Errorf("pg_ctl start: %w: %s", err, out)
	}
	return nil
}

// StopServer stops it: mode "fast" (clients cut, clean) or "immediate"
// (as a crash).
func (s *Server) StopServer(mode string) error {
	if out, err := s.run("pg_ctl", "-D", s.Dir, "-m", mode, "-w", "-t", "60", "stop"); err != nil && !strings.Contains(string(out), "not running") {
		return fmt.Errorf("pg_ctl stop: %w: %s", err, out)
	}
	return nil
}

// Stop stops the server and removes its data.
func (s *Server) Stop() {
	_ = s.StopServer("immediate")
	for i := 0; i < 50; i++ {
		if err := os.RemoveAll(s.Dir); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}
