//go:build linux

package main

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/clitest"
	"github.com/gorocev2/rocev2/udp/share"
)

// bindStartAddr is an address from TEST-NET-1 that the servers below are
// bound to: only bound, never sent to.
const bindStartAddr = "192.0.2.77"

// TestServerBindAtStart: a server given --bind opens its RoCEv2 socket
// before it waits for a client, so an address this host does not have
// fails at once, naming address and port, instead of after a client came.
func TestServerBindAtStart(t *testing.T) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().String() == bindStartAddr {
			t.Skipf("%s is configured on this host", bindStartAddr)
		}
	}
	for _, cmd := range []string{"write-bw", "read-lat", "pingpong", "srq-pingpong", "ud-pingpong"} {
		t.Run(cmd, func(t *testing.T) {
			start := time.Now()
			// A server that waited for a client would wait its whole
			// --timeout (60 s); one that fails at start returns long
			// before half of it, however loaded the machine (2 s was
			// not enough margin on a loaded 2-core machine).
			code, out, errOut := runIn(t, cmd, "--bind", bindStartAddr, "-p", strconv.Itoa(clitest.FreeTCPPort(t)), "--timeout", "60s")
			if el := time.Since(start); el > 30*time.Second {
				t.Errorf("took %v: the server waited for a client", el)
			}
			if code != cli.ExitFail || !strings.Contains(errOut, bindStartAddr+":4791") || !strings.Contains(errOut, "not configured on this host") {
				t.Errorf("exit %d, want %d naming %s:4791 as not configured\n%s%s", code, cli.ExitFail, bindStartAddr, out, errOut)
			}
		})
	}
}

// TestServerBindClash: UDP 4791 taken on a server's --bind address fails
// at once, pointing at another 127.0.0.x address; a client on the server's
// address finds the port taken (the server holds it before it accepts) and
// the server's message says so instead of blaming -R alone.
func TestServerBindClash(t *testing.T) {
	if testing.Short() {
		t.Skip("uses loopback sockets")
	}
	const addr = "127.0.0.83"
	t.Run("taken before", func(t *testing.T) {
		pc, err := net.ListenPacket("udp", addr+":4791")
		if err != nil {
			t.Skipf("cannot hold %s:4791 for the test: %v", addr, err)
		}
		defer pc.Close()
		start := time.Now()
		code, out, errOut := runIn(t, "write-bw", "--bind", addr, "-p", strconv.Itoa(clitest.FreeTCPPort(t)), "--timeout", "3s")
		if time.Since(start) > 2*time.Second || code != cli.ExitFail || !strings.Contains(errOut, addr+":4791") ||
			!strings.Contains(errOut, "address already in use") || !strings.Contains(errOut, "127.0.0.N with another N") {
			t.Errorf("exit %d after %v\n%s%s", code, time.Since(start), out, errOut)
		}
	})
	// pair runs a write-bw server and client on the one address addr, with
	// the extra flags, and returns both exit codes and outputs.
	pair := func(t *testing.T, extra ...string) (srvCode, cliCode int, srvOut, cliOut string) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		port := strconv.Itoa(clitest.FreeTCPPort(t))
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			var o, e bytes.Buffer
			srvCode = run(ctx, append([]string{"write-bw", "-p", port, "--bind", addr, "-n", "5"}, extra...), &o, &e)
			srvOut = o.String() + e.String()
		}()
		var o, e bytes.Buffer
		cliCode = run(ctx, append([]string{"write-bw", "-p", port, "--bind", addr, "-n", "5"}, append(extra, addr)...), &o, &e)
		wg.Wait()
		return srvCode, cliCode, srvOut, o.String() + e.String()
	}
	t.Run("client on the server's address, unshared", func(t *testing.T) {
		srvCode, code, srvOut, out := pair(t, "--share=false")
		if code != cli.ExitFail || !strings.Contains(out, "cannot open a RoCEv2 socket on "+addr+":4791") {
			t.Errorf("client: exit %d\n%s", code, out)
		}
		if srvCode != cli.ExitFail || !strings.Contains(srvOut, "it connected from "+addr+", where this side holds UDP port 4791") {
			t.Errorf("server: exit %d\n%s", srvCode, srvOut)
		}
	})
	// Where the process may share UDP 4791 (issue 28: CAP_BPF and
	// CAP_NET_ADMIN), a client and a server on one address are two members
	// of its group, and the run succeeds.
	t.Run("client on the server's address, shared", func(t *testing.T) {
		if err := share.CheckCapabilities(); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("CI runs as root, where sharing must be possible: %v", err)
			}
			t.Skipf("SKIPPED: this process may not share UDP 4791: %v", err)
		}
		srvCode, code, srvOut, out := pair(t, "--share")
		if code != 0 || srvCode != 0 {
			t.Errorf("client exit %d, server exit %d\n--- client:\n%s--- server:\n%s", code, srvCode, out, srvOut)
		}
	})
}
