//go:build unix

package main

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/transport"
)

func TestUCPingpongFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    pingpongConfig
		wantErr string
	}{
		{name: "defaults", args: nil,
			want: pingpongConfig{port: 18515, ibPort: 1, size: 4096, mtu: transport.MTU1024, rxDepth: 500, iters: 1000, gidIdx: -1, kind: ppUC}},
		{name: "ibv style", args: []string{"-d", "rxe0", "-g", "1", "-n", "5", "-s", "64", "-m", "2048", "-c", "-e", "-l", "3", "192.0.2.2"},
			want: pingpongConfig{port: 18515, dev: "rxe0", ibPort: 1, size: 64, mtu: transport.MTU2048, rxDepth: 500, iters: 5, sl: 3, gidIdx: 1, chk: true, events: true, server: "192.0.2.2", kind: ppUC}},
		{name: "long flags", args: []string{"--port=2000", "--size", "100", "--rx-depth=8", "--iters=3", "--mtu=4096"},
			want: pingpongConfig{port: 2000, ibPort: 1, size: 100, mtu: transport.MTU4096, rxDepth: 8, iters: 3, gidIdx: -1, kind: ppUC}},
		{name: "bad mtu", args: []string{"-m", "1500"}, wantErr: "-m 1500"},
		{name: "bad size", args: []string{"-s", "0"}, wantErr: "-s 0"},
		// ibv_uc_pingpong's getopt string is "p:d:i:s:m:r:n:l:eg:c":
		// no -o (ud-pingpong's) and none of rc_pingpong's ODP/DM flags.
		{name: "no -o", args: []string{"-o"}, wantErr: "-o"},
		{name: "two servers", args: []string{"a", "b"}, wantErr: `unexpected argument "b"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parsePPFlags(tc.args, ppUC)
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
}

// TestUCPingpongLoopback runs rocev2d uc-pingpong against itself over
// loopback (server 127.0.0.2, client 127.0.0.1) at several sizes and path
// MTUs, single- and multi-packet, with -c, and checks both sides' address
// and result lines; with -v, that the traffic was UC: exactly the
// messages' packets each way, no acknowledgements, nothing dropped.
func TestUCPingpongLoopback(t *testing.T) {
	for _, tc := range []struct {
		size, iters, mtu int
		events, verbose  bool
	}{
		{size: 4096, iters: 200, mtu: 0, verbose: true}, // the defaults: 4 packets per message
		{size: 64, iters: 100, mtu: 1024, verbose: true},
		{size: 10000, iters: 20, mtu: 256, verbose: true}, // 40 packets, 3 pages
		{size: 1, iters: 50, mtu: 4096, events: true},
		{size: 65536, iters: 20, mtu: 4096},
	} {
		t.Run(strconv.Itoa(tc.size)+"B_mtu"+strconv.Itoa(tc.mtu), func(t *testing.T) {
			args := []string{"-n", strconv.Itoa(tc.iters), "-r", "16", "-c", "--timeout", "50s"}
			if tc.size != 4096 {
				args = append(args, "-s", strconv.Itoa(tc.size))
			}
			mtu := tc.mtu
			if mtu != 0 {
				args = append(args, "-m", strconv.Itoa(mtu))
			} else {
				mtu = 1024
			}
			if tc.events {
				args = append(args, "-e")
			}
			if tc.verbose {
				args = append(args, "-v")
			}
			srv, cli := runPPPair(t, ppUC, args, nil, []string{"-g", "1", "-d", "rocev2"})
			pkts := tc.iters * ((tc.size + mtu - 1) / mtu)
			for _, r := range []struct {
				side string
				ppResult
			}{{"server", srv}, {"client", cli}} {
				if r.code != 0 {
					t.Fatalf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", r.side, r.code, r.out, r.err)
				}
				if got := len(reAddr.FindAllString(r.out, -1)); got != 2 {
					t.Errorf("%s: %d address lines (ibv_uc_pingpong's, the same as ibv_rc_pingpong's), want 2:\n%s", r.side, got, r.out)
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
					// No ACKs on UC (RC would add one per message): the
					// messages' packets and nothing else, each way.
					for c, n := range map[string]int{"sent_pkts": pkts, "rcvd_pkts": pkts, "rdma_sends": tc.iters, "rdma_recvs": tc.iters} {
						if !regexp.MustCompile(`(?m)^  ` + c + ` +` + strconv.Itoa(n) + `$`).MatchString(r.out) {
							t.Errorf("%s: -v counters lack %s %d:\n%s", r.side, c, n, r.out)
						}
					}
					for _, c := range []string{"uc_msgs_dropped", "retransmitted_pkts", "local_ack_timeout_err", "transport_mismatch"} {
						if strings.Contains(r.out, c) {
							t.Errorf("%s: %s counted:\n%s", r.side, c, r.out)
						}
					}
				}
			}
			// Each side's remote line is the other side's local line.
			loc := func(s string) string { return reAddr.FindAllString(s, -1)[0][len("  local address: "):] }
			rem := func(s string) string { return reAddr.FindAllString(s, -1)[1][len("  remote address:"):] }
			if strings.TrimSpace(loc(srv.out)) != strings.TrimSpace(rem(cli.out)) ||
				strings.TrimSpace(loc(cli.out)) != strings.TrimSpace(rem(srv.out)) {
				t.Errorf("address lines do not match:\nserver:\n%s\nclient:\n%s", srv.out, cli.out)
			}
		})
	}
}

// TestUCPingpongChk: without -c on the client the first byte of each page
// stays 0x7b, which the server's -c reports (exit 1), as ibv_uc_pingpong's
// server reports "invalid data in page 0".
func TestUCPingpongChk(t *testing.T) {
	srv, cli := runPPPair(t, ppUC, []string{"-n", "20", "-s", "5000", "--timeout", "50s"}, []string{"-c"}, nil)
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

func TestUCPingpongErrors(t *testing.T) {
	ctx := context.Background()
	runUC := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(ctx, append([]string{"uc-pingpong"}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}
	t.Run("usage", func(t *testing.T) {
		code, _, stderr := runUC("-m", "9000")
		if code != exitUsage || !strings.Contains(stderr, "MTU must be") || !strings.Contains(stderr, "rocev2d help uc-pingpong") {
			t.Fatalf("exit %d, stderr %q", code, stderr)
		}
	})
	t.Run("help", func(t *testing.T) {
		code, out, _ := runUC("-h")
		if code != exitOK || !strings.Contains(out, "ibv_uc_pingpong") || !strings.Contains(out, "uc-pingpong [options]") {
			t.Fatalf("exit %d, stdout %q", code, out)
		}
		var list bytes.Buffer
		run(ctx, []string{"help"}, &list, &list)
		if !regexp.MustCompile(`(?m)^  uc-pingpong +UC ping-pong`).MatchString(list.String()) {
			t.Errorf("help does not list uc-pingpong:\n%s", list.String())
		}
	})
	t.Run("peer unreachable", func(t *testing.T) {
		port := strconv.Itoa(freeTCPPort(t))
		code, _, stderr := runUC("-p", port, "127.0.0.1")
		if code != exitFail || !strings.Contains(stderr, "rocev2d uc-pingpong: couldn't connect to 127.0.0.1:"+port) {
			t.Fatalf("exit %d, stderr %q", code, stderr)
		}
	})
}
