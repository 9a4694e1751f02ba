//go:build unix

package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/transport"
)

func TestPingpongFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    pingpongConfig
		wantErr string
	}{
		{name: "defaults", args: nil,
			want: pingpongConfig{port: 18515, ibPort: 1, size: 4096, mtu: transport.MTU1024, rxDepth: 500, iters: 1000, gidIdx: -1}},
		{name: "ibv style, server first", args: []string{"192.0.2.2", "-d", "rxe0", "-g", "1", "-n", "5", "-s", "64", "-m", "2048", "-c", "-e"},
			want: pingpongConfig{port: 18515, dev: "rxe0", ibPort: 1, size: 64, mtu: transport.MTU2048, rxDepth: 500, iters: 5, gidIdx: 1, chk: true, events: true, server: "192.0.2.2"}},
		{name: "long flags, server last", args: []string{"--port=2000", "--size", "100", "--rx-depth=8", "--iters=3", "--sl=2", "--bind", "127.0.0.2", "--timeout=5s", "127.0.0.1"},
			want: pingpongConfig{port: 2000, ibPort: 1, size: 100, mtu: transport.MTU1024, rxDepth: 8, iters: 3, sl: 2, gidIdx: -1, server: "127.0.0.1", timeout: 5 * time.Second}},
		{name: "bad mtu", args: []string{"-m", "1500"}, wantErr: "-m 1500"},
		{name: "bad size", args: []string{"-s", "0"}, wantErr: "-s 0"},
		{name: "bad port", args: []string{"-p", "70000"}, wantErr: "-p 70000"},
		{name: "bad ib port", args: []string{"-i", "2"}, wantErr: "-i 2"},
		{name: "bad iters", args: []string{"-n", "-1"}, wantErr: "-n -1"},
		{name: "bad bind", args: []string{"--bind", "host"}, wantErr: "--bind"},
		{name: "two servers", args: []string{"a", "b"}, wantErr: `unexpected argument "b"`},
		{name: "unknown flag", args: []string{"-x"}, wantErr: "-x"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parsePingpongFlags(tc.args)
			if tc.wantErr != "" {
				if err == nil || !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want a usage error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want.server == "" && c.bind.IsValid() {
				t.Fatalf("bind = %v, want unset", c.bind)
			}
			c.bind = tc.want.bind
			if *c != tc.want {
				t.Fatalf("got  %+v\nwant %+v", *c, tc.want)
			}
		})
	}
}

// freeTCPPort returns a TCP port that was free a moment ago.
func freeTCPPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

var (
	reBytes = regexp.MustCompile(`(?m)^(\d+) bytes in ([0-9.]+) seconds = ([0-9.]+) Mbit/sec$`)
	reIters = regexp.MustCompile(`(?m)^(\d+) iters in ([0-9.]+) seconds = ([0-9.]+) usec/iter$`)
	reAddr  = regexp.MustCompile(`(?m)^  (local|remote) address: +LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID ::ffff:(127\.0\.0\.[12])$`)
)

// runPP runs `rocev2d pingpong args` in process and returns status and output.
func runPP(ctx context.Context, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(ctx, append([]string{"pingpong"}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

// TestPingpongLoopback runs a server on 127.0.0.2 and a client on 127.0.0.1
// (each on its own UDP 4791) and checks both sides' result lines.
func TestPingpongLoopback(t *testing.T) {
	for _, tc := range []struct {
		size, iters, mtu int
		chk, verbose     bool
	}{
		{size: 64, iters: 200, mtu: 1024, verbose: true},
		{size: 4096, iters: 100, mtu: 1024, chk: true}, // 4 packets per message
		{size: 10000, iters: 20, mtu: 256, chk: true},  // 40 packets, 3 pages
		{size: 1, iters: 50, mtu: 4096},
	} {
		name := strconv.Itoa(tc.size) + "B_mtu" + strconv.Itoa(tc.mtu)
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			common := []string{"-s", strconv.Itoa(tc.size), "-n", strconv.Itoa(tc.iters), "-m", strconv.Itoa(tc.mtu), "-r", "16", "--timeout", "50s"}
			if tc.chk {
				common = append(common, "-c")
			}
			if tc.verbose {
				common = append(common, "-v")
			}
			var res [2]struct {
				code     int
				out, err string
			}
			// Port 4791 on these addresses may be busy for a moment when other
			// tests of the repository use them; retry a few times.
			for attempt := 0; ; attempt++ {
				port := strconv.Itoa(freeTCPPort(t))
				var wg sync.WaitGroup
				wg.Add(1)
				go func() {
					defer wg.Done()
					res[0].code, res[0].out, res[0].err = runPP(ctx, append([]string{"-p", port, "--bind", "127.0.0.2"}, common...)...)
				}()
				// The client retries the connection until the server listens.
				deadline := time.Now().Add(10 * time.Second)
				for {
					res[1].code, res[1].out, res[1].err = runPP(ctx, append([]string{"-p", port, "--bind", "127.0.0.1", "-d", "rocev2", "-g", "1"}, append(common, "127.0.0.2")...)...)
					if res[1].code == 0 || !strings.Contains(res[1].err, "couldn't connect") || time.Now().After(deadline) {
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
				if res[1].code != 0 && strings.Contains(res[1].err, "couldn't connect") {
					cancel() // let the server give up
				}
				wg.Wait()
				busy := strings.Contains(res[0].err+res[1].err, "address already in use")
				if !busy || attempt == 5 {
					break
				}
				t.Logf("UDP 4791 busy, retrying: %s%s", res[0].err, res[1].err)
				time.Sleep(time.Duration(200*(attempt+1)) * time.Millisecond)
			}
			for i, side := range []string{"server", "client"} {
				r := res[i]
				if r.code != 0 {
					t.Fatalf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", side, r.code, r.out, r.err)
				}
				if got := len(reAddr.FindAllString(r.out, -1)); got != 2 {
					t.Errorf("%s: %d address lines, want 2:\n%s", side, got, r.out)
				}
				mb := reBytes.FindStringSubmatch(r.out)
				mi := reIters.FindStringSubmatch(r.out)
				if mb == nil || mi == nil {
					t.Fatalf("%s: result lines missing:\n%s", side, r.out)
				}
				if want := strconv.Itoa(2 * tc.size * tc.iters); mb[1] != want {
					t.Errorf("%s: %s bytes, want %s", side, mb[1], want)
				}
				if want := strconv.Itoa(tc.iters); mi[1] != want {
					t.Errorf("%s: %s iters, want %s", side, mi[1], want)
				}
				if tc.verbose && !strings.Contains(r.out, "counters ") || !tc.verbose && strings.Contains(r.out, "counters ") {
					t.Errorf("%s: -v %v, output:\n%s", side, tc.verbose, r.out)
				}
				if tc.verbose && !regexp.MustCompile(`(?m)^  rdma_sends +`+strconv.Itoa(tc.iters)+`$`).MatchString(r.out) {
					t.Errorf("%s: -v counters lack rdma_sends %d:\n%s", side, tc.iters, r.out)
				}
			}
			// Each side's remote line is the other side's local line.
			loc := func(s string) string { return reAddr.FindAllString(s, -1)[0][len("  local address: "):] }
			rem := func(s string) string { return reAddr.FindAllString(s, -1)[1][len("  remote address:"):] }
			if strings.TrimSpace(loc(res[0].out)) != strings.TrimSpace(rem(res[1].out)) ||
				strings.TrimSpace(loc(res[1].out)) != strings.TrimSpace(rem(res[0].out)) {
				t.Errorf("address lines do not match:\nserver:\n%s\nclient:\n%s", res[0].out, res[1].out)
			}
		})
	}
}

func TestPingpongErrors(t *testing.T) {
	ctx := context.Background()
	t.Run("usage", func(t *testing.T) {
		code, _, stderr := runPP(ctx, "-m", "9000")
		if code != exitUsage || !strings.Contains(stderr, "MTU must be") {
			t.Fatalf("exit %d, stderr %q", code, stderr)
		}
	})
	t.Run("help", func(t *testing.T) {
		code, out, _ := runPP(ctx, "-h")
		if code != exitOK || !strings.Contains(out, "ibv_rc_pingpong") {
			t.Fatalf("exit %d, stdout %q", code, out)
		}
	})
	t.Run("peer unreachable", func(t *testing.T) {
		port := strconv.Itoa(freeTCPPort(t))
		code, _, stderr := runPP(ctx, "-p", port, "127.0.0.1")
		if code != exitFail || !strings.Contains(stderr, "couldn't connect to 127.0.0.1:"+port) {
			t.Fatalf("exit %d, stderr %q", code, stderr)
		}
	})
	t.Run("server timeout", func(t *testing.T) {
		port := strconv.Itoa(freeTCPPort(t))
		code, _, stderr := runPP(ctx, "-p", port, "--timeout", "200ms")
		if code != exitFail || !strings.Contains(stderr, "waiting for a client on TCP port "+port) {
			t.Fatalf("exit %d, stderr %q", code, stderr)
		}
	})
	t.Run("port in use", func(t *testing.T) {
		ln, err := net.Listen("tcp", ":0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		code, _, stderr := runPP(ctx, "-p", port)
		if code != exitFail || !strings.Contains(stderr, "port in use") {
			t.Fatalf("exit %d, stderr %q", code, stderr)
		}
	})
}

// TestPingpongProcesses runs server and client as two rocev2d processes on
// loopback (127.0.0.2 and 127.0.0.1, each on its own UDP 4791).
func TestPingpongProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs loopback traffic")
	}
	bin := buildRocev2d(t)
	const size, iters = 5000, 200 // 5 packets per message at MTU 1024
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		port := strconv.Itoa(freeTCPPort(t))
		args := []string{"-p", port, "-s", strconv.Itoa(size), "-n", strconv.Itoa(iters), "-c", "--timeout", "50s"}
		var sout, serr bytes.Buffer
		srv := exec.CommandContext(ctx, bin, append([]string{"pingpong", "--bind", "127.0.0.2"}, args...)...)
		srv.Stdout, srv.Stderr = &sout, &serr
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		var cout, cerr bytes.Buffer
		var cliErr error
		for deadline := time.Now().Add(10 * time.Second); ; {
			cout.Reset()
			cerr.Reset()
			cli := exec.CommandContext(ctx, bin, append(append([]string{"pingpong", "--bind", "127.0.0.1"}, args...), "127.0.0.2")...)
			cli.Stdout, cli.Stderr = &cout, &cerr
			cliErr = cli.Run()
			if cliErr == nil || !strings.Contains(cerr.String(), "couldn't connect") || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if cliErr != nil {
			srv.Process.Signal(syscall.SIGTERM)
		}
		srvErr := srv.Wait()
		cancel()
		if strings.Contains(serr.String()+cerr.String(), "address already in use") && attempt < 5 {
			t.Logf("UDP 4791 busy, retrying: %s%s", serr.String(), cerr.String())
			time.Sleep(time.Duration(200*(attempt+1)) * time.Millisecond)
			continue
		}
		for _, r := range []struct {
			side     string
			err      error
			out, std string
		}{{"server", srvErr, sout.String(), serr.String()}, {"client", cliErr, cout.String(), cerr.String()}} {
			if r.err != nil {
				t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", r.side, r.err, r.out, r.std)
			}
			mb, mi := reBytes.FindStringSubmatch(r.out), reIters.FindStringSubmatch(r.out)
			if mb == nil || mi == nil || mb[1] != strconv.Itoa(2*size*iters) || mi[1] != strconv.Itoa(iters) {
				t.Fatalf("%s: result lines wrong:\n%s", r.side, r.out)
			}
		}
		return
	}
}
