// Package netnstest builds throwaway test hosts in network namespaces, so
// that egress tests have somewhere to connect without a packet leaving the
// machine.
package netnstest

import (
	"fmt"
	"net"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// Public and private addresses of the fake internet host, each serving TCP
// on :8080 (it answers "hi" and closes).
const (
	PublicAddr  = "203.0.113.10:8080" // TEST-NET-3
	PrivateAddr = "10.99.0.10:8080"
	HostSide    = "203.0.113.1" // the host's address on the test link
)

// FakeInternet makes the test host and routes to it from the host. It is
// removed when the test ends.
func FakeInternet(t testing.TB) {
	t.Helper()
	name := fmt.Sprintf("cftinet%d", time.Now().UnixNano()%100000)
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	sh("netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	sh("link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", name)
	sh("addr", "add", HostSide+"/24", "dev", name)
	sh("addr", "add", "10.99.0.1/24", "dev", name)
	sh("link", "set", name, "up")
	sh("-n", name, "addr", "add", "203.0.113.10/24", "dev", "eth0")
	sh("-n", name, "addr", "add", "10.99.0.10/24", "dev", "eth0")
	sh("-n", name, "link", "set", "eth0", "up")
	sh("-n", name, "link", "set", "lo", "up")
	sh("-n", name, "route", "add", "default", "via", HostSide)
	ln, err := listenIn(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hi"))
			c.Close()
		}
	}()
}

// listenIn opens the listener inside the named namespace.
func listenIn(name string) (net.Listener, error) {
	h, err := netns.GetFromName(name)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer orig.Close()
	if err := netns.Set(h); err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	ln, lerr := net.Listen("tcp4", ":8080")
	if err := netns.Set(orig); err != nil {
		return nil, err // the thread stays locked and dies with this goroutine
	}
	runtime.UnlockOSThread()
	return ln, lerr
}
