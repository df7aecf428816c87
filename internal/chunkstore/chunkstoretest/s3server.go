package chunkstoretest

import (
	"context"
	"fmt"
	"go/build"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/cellfork/cellfork/internal/chunkstore"
)

// S3Server is a real S3 server for tests: versitygw over a directory, on a
// free loopback port, installed by scripts/setup.sh. Stop and Start take it
// down and bring it back on the same port and data, for fault tests.
type S3Server struct {
	bin, dir, addr string
	access, secret string
	log            *os.File

	mu  sync.Mutex // guards cmd
	cmd *exec.Cmd
}

// VersityGW returns the versitygw binary's path: on $PATH or in
// $(go env GOPATH)/bin, where scripts/setup.sh installs it.
func VersityGW() (string, error) {
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, nil
	}
	p := filepath.Join(build.Default.GOPATH, "bin", "versitygw")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("versitygw is not installed (scripts/setup.sh installs it): %w", err)
	}
	return p, nil
}

// StartS3 starts a server for t and stops it when t ends.
func StartS3(t testing.TB) *S3Server {
	t.Helper()
	s, err := NewS3Server(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		if t.Failed() {
			if b, err := os.ReadFile(s.log.Name()); err == nil && len(b) > 0 {
				t.Logf("versitygw log (tail):\n%s", tail(string(b), 2000))
			}
		}
	})
	return s
}

// NewS3Server starts a server keeping its data and log in dir, on a free
// loopback port. Close stops it.
func NewS3Server(dir string) (*S3Server, error) { return NewS3ServerOn(dir, "127.0.0.1") }

// NewS3ServerOn starts a server on a free port of the address ip (one
// that other network namespaces reach, for a cluster's hosts).
func NewS3ServerOn(dir, ip string) (*S3Server, error) {
	bin, err := VersityGW()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o700); err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(dir, "versitygw.log"))
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	s := &S3Server{bin: bin, dir: filepath.Join(dir, "data"), addr: addr, access: "cellfork-test", secret: "cellfork-test-secret", log: log}
	if err := s.Start(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Close stops the server for good.
func (s *S3Server) Close() {
	s.Stop()
	s.log.Close()
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Endpoint is the server's URL.
func (s *S3Server) Endpoint() string { return "http://" + s.addr }

// Env is how a daemon reaches the server: the AWS_* variables
// chunkstore.S3ConfigFromEnv reads.
func (s *S3Server) Env() []string {
	return []string{"AWS_ENDPOINT_URL_S3=" + s.Endpoint(), "AWS_ACCESS_KEY_ID=" + s.access, "AWS_SECRET_ACCESS_KEY=" + s.secret}
}

// Config is how a chunkstore reaches the server.
func (s *S3Server) Config() chunkstore.S3Config {
	return chunkstore.S3Config{Endpoint: s.Endpoint(), AccessKey: s.access, SecretKey: s.secret, Timeout: 5 * time.Second, LockLease: 3 * time.Second}
}

// Start runs the server and waits until it answers.
func (s *S3Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	cmd := exec.Command(s.bin, "--port", s.addr, "--access", s.access, "--secret", s.secret, "posix", s.dir)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting versitygw: %w", err)
	}
	s.cmd = cmd
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(s.Endpoint())
		if err == nil {
			resp.Body.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("versitygw on %s did not answer within 20s", s.addr)
}

// Stop kills the server (as a crash or a network cut would: no goodbye).
func (s *S3Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
}

// NewBucket creates a bucket with a fresh name and returns it.
func (s *S3Server) NewBucket(t testing.TB) string {
	t.Helper()
	name, err := s.MakeBucket()
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// MakeBucket creates a bucket with a fresh name and returns it.
func (s *S3Server) MakeBucket() (string, error) {
	c, err := minio.New(s.addr, &minio.Options{Creds: credentials.NewStaticV4(s.access, s.secret, ""), BucketLookup: minio.BucketLookupPath})
	if err != nil {
		return "", err
	}
	name := "t-" + strings.ToLower(fmt.Sprintf("%x", time.Now().UnixNano()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.MakeBucket(ctx, name, minio.MakeBucketOptions{}); err != nil {
		return "", fmt.Errorf("creating bucket %s: %w", name, err)
	}
	return name, nil
}
