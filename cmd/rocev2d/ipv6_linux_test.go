//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/clitest"
	"github.com/gorocev2/rocev2/internal/netns"
)

// ipv6Pair is a namespace pair for the IPv6 tests: 203.0.113.1/.2 and the
// link-local fe80::c0:1 / fe80::c0:2 (no DAD) on the veth ends.
type ipv6Pair struct {
	*netns.Pair
	llA, llB netip.Addr // with their zones (the veth ends)
}

var (
	ll6A = netip.MustParseAddr("fe80::c0:1")
	ll6B = netip.MustParseAddr("fe80::c0:2")
)

func newIPv6Pair(t *testing.T) *ipv6Pair {
	t.Helper()
	p := netns.TestPair(t, netns.PairConfig{Prefix: "rv6z", IfPrefix: "r6",
		AddrA: netip.MustParseAddr("203.0.113.1"), AddrB: netip.MustParseAddr("203.0.113.2")})
	for _, x := range []struct {
		ns, dev string
		a       netip.Addr
	}{{p.NsA, p.IfA, ll6A}, {p.NsB, p.IfB, ll6B}} {
		if out, err := exec.Command("ip", "-n", x.ns, "addr", "add", x.a.String()+"/64", "dev", x.dev, "nodad").CombinedOutput(); err != nil {
			t.Fatalf("ip addr add: %v: %s", err, out)
		}
		// lo with ::1: Go's net decides at start whether the host has
		// IPv6 by binding ::1; without it a wildcard TCP listener (the
		// out-of-band server) is IPv4 only.
		if out, err := exec.Command("ip", "-n", x.ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
			t.Fatalf("ip link set lo up: %v: %s", err, out)
		}
	}
	return &ipv6Pair{Pair: p, llA: ll6A.WithZone(p.IfA), llB: ll6B.WithZone(p.IfB)}
}

// runNSPair runs the server in namespace B and then the client in A
// (both the rocev2d binary), and returns their exit statuses and outputs.
func runNSPair(t *testing.T, bin string, p *ipv6Pair, srvArgs, cliArgs []string) (sc, cc int, so, co string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var sout, cout bytes.Buffer
	srv := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", p.NsB, bin}, srvArgs...)...)
	srv.Stdout, srv.Stderr = &sout, &sout
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if srvArgs[0] == "rping" || srvArgs[0] == "rdma-server" || srvArgs[0] == "udaddy" {
		// No TCP: wait for its RoCEv2 socket (then its CM listens at
		// once; the client's CM retries its REQ anyway).
		waitUDP6(srv.Process.Pid, bin, 4791, 10*time.Second)
	} else {
		waitTCPListen(srv.Process.Pid, bin, 18515, 10*time.Second)
	}
	cli := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", p.NsA, bin}, cliArgs...)...)
	cli.Stdout, cli.Stderr = &cout, &cout
	cerr := cli.Run()
	serr := srv.Wait()
	return clitest.ProcExitCode(serr), clitest.ProcExitCode(cerr), sout.String(), cout.String()
}

// waitTCPListen waits up to d until process pid, once it runs bin (ip
// netns exec has joined the namespace and exec'd it), listens on TCP port
// (its own view of /proc/PID/net/tcp and tcp6, so inside its namespace).
func waitTCPListen(pid int, bin string, port int, d time.Duration) {
	want := fmt.Sprintf(":%04X ", port)
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); exe != bin {
			continue
		}
		for _, f := range []string{"tcp", "tcp6"} {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
			for _, line := range strings.Split(string(b), "\n") {
				fs := strings.Fields(line)
				if len(fs) > 3 && fs[3] == "0A" && strings.HasSuffix(fs[1]+" ", want) {
					return
				}
			}
		}
	}
}

// waitUDP6 waits up to d until process pid, once it runs bin, has an IPv6
// UDP socket on port.
func waitUDP6(pid int, bin string, port int, d time.Duration) {
	want := fmt.Sprintf(":%04X ", port)
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); exe != bin {
			continue
		}
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/udp6", pid))
		for _, line := range strings.Split(string(b), "\n") {
			if fs := strings.Fields(line); len(fs) > 1 && strings.HasSuffix(fs[1]+" ", want) {
				time.Sleep(200 * time.Millisecond)
				return
			}
		}
	}
}

// TestIPv6LinkLocal runs pingpong, write-bw and every other out-of-band
// command between two rocev2d processes over a veth pair on link-local
// IPv6 addresses with zones:
// --bind fe80::...%veth and the server address with its zone; write-bw's
// client also with an IPv4 server address (the out-of-band connection then
// must not be bound to the IPv6 --bind). The GIDs printed are the
// link-local addresses. Then the errors: a link-local server without a
// zone and without --bind fails at once, naming the kernel's reason.
func TestIPv6LinkLocal(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs it in network namespaces")
	}
	netns.Require(t, "ip")
	p := newIPv6Pair(t)
	bin := clitest.BuildRocev2d(t)
	common := []string{"--timeout", "30s"}
	gidLines := func(out string) bool {
		return strings.Contains(out, "GID "+ll6A.String()) && strings.Contains(out, "GID "+ll6B.String())
	}
	t.Run("pingpong", func(t *testing.T) {
		srv := append([]string{"pingpong", "--bind", p.llB.String(), "-s", "4096", "-n", "20", "-c"}, common...)
		cli := append([]string{"pingpong", "--bind", p.llA.String(), "-s", "4096", "-n", "20", "-c"}, common...)
		sc, cc, so, co := runNSPair(t, bin, p, srv, append(cli, ll6B.WithZone(p.IfA).String()))
		if sc != 0 || cc != 0 || !reIters.MatchString(so) || !reIters.MatchString(co) || !gidLines(so) || !gidLines(co) {
			t.Fatalf("exit %d/%d\n--- server:\n%s--- client:\n%s", sc, cc, so, co)
		}
		// Without --bind: the addresses come from the out-of-band
		// connection, zone included.
		sc, cc, so, co = runNSPair(t, bin, p, []string{"pingpong", "-s", "64", "-n", "10", "--timeout", "30s"},
			[]string{"pingpong", "-s", "64", "-n", "10", "--timeout", "30s", ll6B.WithZone(p.IfA).String()})
		if sc != 0 || cc != 0 || !gidLines(so) || !gidLines(co) {
			t.Fatalf("without --bind: exit %d/%d\n--- server:\n%s--- client:\n%s", sc, cc, so, co)
		}
	})
	for _, server := range []string{ll6B.WithZone(p.IfA).String(), "203.0.113.2"} {
		t.Run("write-bw to "+server, func(t *testing.T) {
			args := append([]string{"-s", "8192", "-n", "50", "--check", "--connect-timeout", "10s"}, common...)
			srv := append([]string{"write-bw", "--bind", p.llB.String()}, args...)
			cli := append(append([]string{"write-bw", "--bind", p.llA.String()}, args...), server)
			sc, cc, so, co := runNSPair(t, bin, p, srv, cli)
			// perftest prints GIDs as decimal bytes: fe80::c0:1.
			if sc != 0 || cc != 0 || !strings.Contains(co, " data check: ok") || !strings.Contains(co, "GID: 254:128:00:00:00:00:00:00:00:00:00:00:00:192:00:01") {
				t.Fatalf("exit %d/%d\n--- server:\n%s--- client:\n%s", sc, cc, so, co)
			}
		})
	}
	// Every other command the same way: --bind with zones on both sides,
	// the server address with its zone (the CM commands have no TCP: the
	// address is rdma_cm's, -a/-s; their servers are given a moment).
	srvLL, cliLL, dst := p.llB.String(), p.llA.String(), ll6B.WithZone(p.IfA).String()
	for _, c := range []struct {
		name     string
		srv, cli []string
		want     string // in the outputs
	}{
		{"uc-pingpong", []string{"uc-pingpong", "--bind", srvLL, "-s", "4096", "-n", "10"}, []string{"uc-pingpong", "--bind", cliLL, "-s", "4096", "-n", "10", dst}, "10 iters in"},
		{"ud-pingpong", []string{"ud-pingpong", "--bind", srvLL, "-s", "512", "-n", "10", "-c"}, []string{"ud-pingpong", "--bind", cliLL, "-s", "512", "-n", "10", "-c", dst}, "10 iters in"},
		{"srq-pingpong", []string{"srq-pingpong", "--bind", srvLL, "-s", "64", "-n", "10"}, []string{"srq-pingpong", "--bind", cliLL, "-s", "64", "-n", "10", dst}, "iters in"},
		{"read-bw", []string{"read-bw", "--bind", srvLL, "-n", "20", "--check"}, []string{"read-bw", "--bind", cliLL, "-n", "20", "--check", dst}, " data check: ok"},
		{"send-bw", []string{"send-bw", "--bind", srvLL, "-n", "20", "--check"}, []string{"send-bw", "--bind", cliLL, "-n", "20", "--check", dst}, " data check: ok"},
		{"atomic-bw", []string{"atomic-bw", "--bind", srvLL, "-n", "20", "--check"}, []string{"atomic-bw", "--bind", cliLL, "-n", "20", "--check", dst}, " data check: ok"},
		{"write-lat", []string{"write-lat", "--bind", srvLL, "-n", "20"}, []string{"write-lat", "--bind", cliLL, "-n", "20", dst}, "t_avg[usec]"},
		{"read-lat", []string{"read-lat", "--bind", srvLL, "-n", "20", "--check"}, []string{"read-lat", "--bind", cliLL, "-n", "20", "--check", dst}, " data check: ok"},
		{"send-lat", []string{"send-lat", "--bind", srvLL, "-n", "20", "--check"}, []string{"send-lat", "--bind", cliLL, "-n", "20", "--check", dst}, " data check: ok"},
		{"atomic-lat", []string{"atomic-lat", "--bind", srvLL, "-n", "20", "--check"}, []string{"atomic-lat", "--bind", cliLL, "-n", "20", "--check", dst}, " data check: ok"},
		// Through the CM: rdma_cm's addresses are the link-local ones.
		{"write-bw -R", []string{"write-bw", "-R", "--bind", srvLL, "-n", "20", "--check"}, []string{"write-bw", "-R", "--bind", cliLL, "-n", "20", "--check", dst}, " data check: ok"},
		{"rping", []string{"rping", "-s", "-v", "-a", srvLL}, []string{"rping", "-c", "-v", "-C", "3", "-a", dst, "-I", cliLL}, "ping data: rdma-ping-2"},
		{"rdma-server", []string{"rdma-server", "-s", srvLL}, []string{"rdma-client", "-s", dst, "--bind", cliLL}, "rdma_client: end 0"},
		{"udaddy", []string{"udaddy", "-b", srvLL}, []string{"udaddy", "-s", dst, "-b", cliLL}, "test complete"},
	} {
		t.Run(c.name, func(t *testing.T) {
			sc, cc, so, co := runNSPair(t, bin, p, append(c.srv, common...), append(c.cli, common...))
			if sc != 0 || cc != 0 || !strings.Contains(so+co, c.want) {
				t.Fatalf("exit %d/%d, want %q\n--- server:\n%s--- client:\n%s", sc, cc, c.want, so, co)
			}
		})
	}
	t.Run("family mismatch", func(t *testing.T) {
		// The server's RoCEv2 address is its end of an IPv4 exchange,
		// the client's GID IPv6: the server names the way out.
		sc, cc, so, co := runNSPair(t, bin, p, append([]string{"pingpong", "-n", "5"}, common...),
			append([]string{"pingpong", "--bind", cliLL, "-n", "5", "203.0.113.2"}, common...))
		if sc == 0 || cc == 0 || !strings.Contains(so, "the peer's GID fe80::c0:1 is IPv6 but the local RoCEv2 address 203.0.113.2 is IPv4: give --bind an IPv6 address") {
			t.Errorf("exit %d/%d\n--- server:\n%s--- client:\n%s", sc, cc, so, co)
		}
	})
	t.Run("errors", func(t *testing.T) {
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", p.NsA, bin, "write-bw", "--connect-timeout", "10s", ll6B.String()).CombinedOutput()
		// A usage error naming the zone (it was the dial's bare "invalid
		// argument", exit 1).
		if clitest.ProcExitCode(err) != cli.ExitUsage || !strings.Contains(string(out), "server "+ll6B.String()+": a link-local address needs its zone") ||
			strings.Contains(string(out), "running there as a server") || time.Since(t0) > 5*time.Second {
			t.Errorf("link-local server without zone: exit %d after %v:\n%s", clitest.ProcExitCode(err), time.Since(t0), out)
		}
		// --bind to an address this host does not have: the bind error,
		// at once.
		t0 = time.Now()
		out, err = exec.CommandContext(ctx, "ip", "netns", "exec", p.NsA, bin, "write-bw", "--connect-timeout", "10s",
			"--bind", "fe80::c0:9%"+p.IfA, ll6B.WithZone(p.IfA).String()).CombinedOutput()
		if clitest.ProcExitCode(err) != cli.ExitFail || time.Since(t0) > 5*time.Second ||
			!strings.Contains(string(out), "cannot bind the out-of-band TCP connection to --bind fe80::c0:9%"+p.IfA) {
			t.Errorf("--bind to a missing address: exit %d after %v:\n%s", clitest.ProcExitCode(err), time.Since(t0), out)
		}
	})
}
