//go:build unix

package main

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/transport"
)

func TestUDPingpongFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    pingpongConfig
		wantErr string
	}{
		{name: "defaults", args: nil,
			want: pingpongConfig{port: 18515, ibPort: 1, size: 1024, mtu: transport.MTU1024, rxDepth: 500, iters: 1000, gidIdx: -1, kind: ppUD}},
		{name: "ibv style", args: []string{"-d", "rxe0", "-g", "1", "-n", "5", "-s", "512", "-c", "-e", "-o", "-l", "3", "192.0.2.2"},
			want: pingpongConfig{port: 18515, dev: "rxe0", ibPort: 1, size: 512, mtu: transport.MTU1024, rxDepth: 500, iters: 5, sl: 3, gidIdx: 1, chk: true, events: true, server: "192.0.2.2", kind: ppUD}},
		{name: "port MTU", args: []string{"--mtu=4096", "--size=4096", "--odp", "--rx-depth", "8"},
			want: pingpongConfig{port: 18515, ibPort: 1, size: 4096, mtu: transport.MTU4096, rxDepth: 8, iters: 1000, gidIdx: -1, kind: ppUD}},
		{name: "bad mtu", args: []string{"-m", "1500"}, wantErr: "-m 1500"},
		{name: "bad size", args: []string{"-s", "0"}, wantErr: "-s 0"},
		{name: "two servers", args: []string{"a", "b"}, wantErr: `unexpected argument "b"`},
		{name: "unknown flag", args: []string{"-P"}, wantErr: "-P"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parsePPFlags(tc.args, ppUD)
			if tc.wantErr != "" {
				if err == nil || !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want a usage error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if *c != tc.want {
				t.Fatalf("got  %+v\nwant %+v", *c, tc.want)
			}
		})
	}
	// pingpong (RC) has no -o.
	if _, err := parsePingpongFlags([]string{"-o"}); err == nil {
		t.Error("pingpong accepted -o")
	}
}

// The address lines of ibv_ud_pingpong: "PSN 0x...: GID" on the local one,
// "PSN 0x..., GID" on the remote one.
var (
	reUDLocal  = regexp.MustCompile(`(?m)^  local address:  LID 0x0000, QPN (0x[0-9a-f]{6}), PSN (0x[0-9a-f]{6}): GID (::ffff:127\.0\.0\.[12])$`)
	reUDRemote = regexp.MustCompile(`(?m)^  remote address: LID 0x0000, QPN (0x[0-9a-f]{6}), PSN (0x[0-9a-f]{6}), GID (::ffff:127\.0\.0\.[12])$`)
)

type ppResult struct {
	code     int
	out, err string
}

// runUDPair runs `rocev2d ud-pingpong` in process as a server on 127.0.0.2
// (args + srvArgs) and a client on 127.0.0.1 (args + cliArgs), retrying
// while UDP 4791 on those addresses is busy (other tests of the
// repository use them), and returns both results.
func runUDPair(t *testing.T, args, srvArgs, cliArgs []string) (srv, cli ppResult) {
	t.Helper()
	return runPPPair(t, ppUD, args, srvArgs, cliArgs)
}

// runPPPair is runUDPair for the ping-pong of any kind.
func runPPPair(t *testing.T, kind ppKind, args, srvArgs, cliArgs []string) (srv, cli ppResult) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run1 := func(ctx context.Context, a ...string) ppResult {
		var out, errb bytes.Buffer
		code := run(ctx, append([]string{kind.String()}, a...), &out, &errb)
		return ppResult{code, out.String(), errb.String()}
	}
	for attempt := 0; ; attempt++ {
		port := strconv.Itoa(freeTCPPort(t))
		sctx, scancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			srv = run1(sctx, append(append([]string{"-p", port, "--bind", "127.0.0.2"}, args...), srvArgs...)...)
		}()
		// The client retries the connection until the server listens.
		for deadline := time.Now().Add(10 * time.Second); ; {
			cli = run1(ctx, append(append(append([]string{"-p", port, "--bind", "127.0.0.1"}, args...), cliArgs...), "127.0.0.2")...)
			if cli.code == 0 || !strings.Contains(cli.err, "couldn't connect") || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if cli.code != 0 && strings.Contains(cli.err, "couldn't connect") {
			scancel() // let the server give up
		}
		wg.Wait()
		scancel()
		if !strings.Contains(srv.err+cli.err, "address already in use") || attempt == 5 {
			return srv, cli
		}
		t.Logf("UDP 4791 busy, retrying: %s%s", srv.err, cli.err)
		time.Sleep(time.Duration(200*(attempt+1)) * time.Millisecond)
	}
}

// TestUDPingpongLoopback runs rocev2d ud-pingpong against itself over
// loopback (server 127.0.0.2, client 127.0.0.1) at several sizes and port
// MTUs, with -c, and checks both sides' address and result lines.
func TestUDPingpongLoopback(t *testing.T) {
	for _, tc := range []struct {
		size, iters, mtu int
		events, verbose  bool
	}{
		{size: 1024, iters: 200, mtu: 0, verbose: true}, // the defaults: port MTU 1024
		{size: 512, iters: 100, mtu: 1024},
		{size: 1, iters: 50, mtu: 256, events: true},
		{size: 4096, iters: 50, mtu: 4096},
	} {
		t.Run(strconv.Itoa(tc.size)+"B_mtu"+strconv.Itoa(tc.mtu), func(t *testing.T) {
			args := []string{"-n", strconv.Itoa(tc.iters), "-r", "16", "-c", "--timeout", "50s"}
			if tc.size != 1024 {
				args = append(args, "-s", strconv.Itoa(tc.size))
			}
			if tc.mtu != 0 {
				args = append(args, "-m", strconv.Itoa(tc.mtu))
			}
			if tc.events {
				args = append(args, "-e")
			}
			if tc.verbose {
				args = append(args, "-v")
			}
			srv, cli := runUDPair(t, args, nil, []string{"-g", "1", "-d", "rocev2"})
			for _, r := range []struct {
				side string
				ppResult
			}{{"server", srv}, {"client", cli}} {
				if r.code != 0 {
					t.Fatalf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", r.side, r.code, r.out, r.err)
				}
				if reUDLocal.FindString(r.out) == "" || reUDRemote.FindString(r.out) == "" {
					t.Errorf("%s: address lines missing or wrong:\n%s", r.side, r.out)
				}
				mb, mi := reBytes.FindStringSubmatch(r.out), reIters.FindStringSubmatch(r.out)
				if mb == nil || mi == nil {
					t.Fatalf("%s: result lines missing:\n%s", r.side, r.out)
				}
				if want := strconv.Itoa(2 * tc.size * tc.iters); mb[1] != want {
					t.Errorf("%s: %s bytes, want %s", r.side, mb[1], want)
				}
				if want := strconv.Itoa(tc.iters); mi[1] != want {
					t.Errorf("%s: %s iters, want %s", r.side, mi[1], want)
				}
				if tc.verbose {
					// No ACKs on UD: exactly one packet per message each way,
					// every datagram delivered.
					for _, c := range []string{"sent_pkts", "rcvd_pkts", "rdma_recvs"} {
						if !regexp.MustCompile(`(?m)^  ` + c + ` +` + strconv.Itoa(tc.iters) + `$`).MatchString(r.out) {
							t.Errorf("%s: -v counters lack %s %d:\n%s", r.side, c, tc.iters, r.out)
						}
					}
					if strings.Contains(r.out, "ud_no_recv_wqe") || strings.Contains(r.out, "qkey_violation") {
						t.Errorf("%s: datagrams dropped:\n%s", r.side, r.out)
					}
				}
			}
			// Each side's remote line names the other side's QPN, PSN and GID.
			sl, sr := reUDLocal.FindStringSubmatch(srv.out), reUDRemote.FindStringSubmatch(srv.out)
			cl, cr := reUDLocal.FindStringSubmatch(cli.out), reUDRemote.FindStringSubmatch(cli.out)
			if sl == nil || sr == nil || cl == nil || cr == nil ||
				strings.Join(sl[1:], " ") != strings.Join(cr[1:], " ") || strings.Join(cl[1:], " ") != strings.Join(sr[1:], " ") {
				t.Errorf("address lines do not match:\nserver:\n%s\nclient:\n%s", srv.out, cli.out)
			}
		})
	}
}

// TestUDPingpongChk: without -c on the client the message's first byte
// stays 0x7b, which the server's -c reports (exit 1), as
// ibv_ud_pingpong's server reports "invalid data in page 0".
func TestUDPingpongChk(t *testing.T) {
	srv, cli := runUDPair(t, []string{"-n", "20", "-s", "256", "--timeout", "50s"}, []string{"-c"}, nil)
	if cli.code != 0 {
		t.Fatalf("client: exit %d\n%s%s", cli.code, cli.out, cli.err)
	}
	if srv.code != exitFail || !strings.Contains(srv.err, "data validation failed at byte 0: got 0x7b, want 0") {
		t.Fatalf("server: exit %d, want %d and a validation error\n%s%s", srv.code, exitFail, srv.out, srv.err)
	}
	if reBytes.FindString(srv.out) == "" {
		t.Errorf("server: no result lines before the validation error:\n%s", srv.out)
	}
}

func TestUDPingpongErrors(t *testing.T) {
	ctx := context.Background()
	runUD := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(ctx, append([]string{"ud-pingpong"}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}
	t.Run("size above the port MTU", func(t *testing.T) {
		// Refused before listening, like ibv_ud_pingpong's
		// "Requested size larger than port MTU (1024)": exit 1.
		for _, args := range [][]string{{"-s", "2048"}, {"-s", "1025", "127.0.0.1"}, {"-s", "4096", "-m", "2048"}} {
			code, _, stderr := runUD(args...)
			if code != exitFail || !strings.Contains(stderr, "larger than port MTU") {
				t.Errorf("%v: exit %d, stderr %q", args, code, stderr)
			}
		}
	})
	t.Run("usage", func(t *testing.T) {
		code, _, stderr := runUD("-m", "9000")
		if code != exitUsage || !strings.Contains(stderr, "MTU must be") || !strings.Contains(stderr, "rocev2d help ud-pingpong") {
			t.Fatalf("exit %d, stderr %q", code, stderr)
		}
	})
	t.Run("help", func(t *testing.T) {
		code, out, _ := runUD("-h")
		if code != exitOK || !strings.Contains(out, "ibv_ud_pingpong") || !strings.Contains(out, "0x11111111") {
			t.Fatalf("exit %d, stdout %q", code, out)
		}
	})
	t.Run("peer unreachable", func(t *testing.T) {
		port := strconv.Itoa(freeTCPPort(t))
		code, _, stderr := runUD("-p", port, "127.0.0.1")
		if code != exitFail || !strings.Contains(stderr, "rocev2d ud-pingpong: couldn't connect to 127.0.0.1:"+port) {
			t.Fatalf("exit %d, stderr %q", code, stderr)
		}
	})
}
