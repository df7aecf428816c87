package gvisor

import (
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReadReplyPeerGone: a sentry that dies mid-reply (its socket reset,
// or closed after half a message) is an error, never a panic.
func TestReadReplyPeerGone(t *testing.T) {
	for _, reset := range []bool{false, true} {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fds[0]), "ours")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conn := c.(*net.UnixConn)
		if reset {
			// Data the peer never reads makes its close a reset.
			if _, err := conn.Write([]byte("unread")); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := unix.Write(fds[1], []byte(`{"success":tr`)); err != nil {
			t.Fatal(err)
		}
		unix.Close(fds[1])
		if data, files, err := readReply(conn); err == nil {
			t.Errorf("reset=%v: a reply cut short read as %q (%d files)", reset, data, len(files))
		}
		conn.Close()
	}
}
