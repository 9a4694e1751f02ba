//go:build unix

package perftest

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/oob"
)

// TestPerfRDMACM runs write-bw, read-bw and send-bw (and the other tests
// once) with -R between two rocev2d on 127.0.0.1 <-> 127.0.0.2: both
// connections through the CM (rdmacm), the exchange as SENDs on the
// first, --check on both sides; then the roles swapped (the server on
// 127.0.0.1).
func TestPerfRDMACM(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	tests := []struct {
		test             string
		flags            []string
		size, iters      int
		srvRows, cliRows int
	}{
		{"write-bw", []string{"-n", "200", "-s", "4096"}, 4096, 200, 1, 1},
		{"read-bw", []string{"-n", "200", "-s", "4096"}, 4096, 200, 1, 1},
		{"send-bw", []string{"-n", "200", "-s", "4096", "-r", "64"}, 4096, 200, 1, 1},
		{"atomic-bw", []string{"-n", "50", "-A", "CMP_AND_SWAP"}, 8, 50, 1, 1},
		{"write-lat", []string{"-n", "50", "-s", "64"}, 64, 50, 1, 1},
		{"read-lat", []string{"-n", "50", "-s", "2048"}, 2048, 50, 0, 1},
		{"send-lat", []string{"-n", "50", "-s", "100"}, 100, 50, 1, 1},
		{"atomic-lat", []string{"-n", "20"}, 8, 20, 0, 1},
	}
	for _, tt := range tests {
		for _, swap := range []bool{false, true} {
			if swap && !strings.HasSuffix(tt.test, "-bw") || swap && tt.test == "atomic-bw" {
				continue
			}
			name := tt.test
			if swap {
				name += "-swapped"
			}
			t.Run(name, func(t *testing.T) {
				flags := append([]string{"-R", "--check", "-v"}, tt.flags...)
				srv, cli := runPerfPairAddrs(t, tt.test, swap, flags)
				mustPass(t, srv, cli)
				for _, side := range []struct {
					name string
					o    perfOut
					rows int
				}{{"server", srv, tt.srvRows}, {"client", cli, tt.cliRows}} {
					rows := resultRows(side.o.out)
					if len(rows) != side.rows {
						t.Fatalf("%s printed %d result rows, want %d:\n%s", side.name, len(rows), side.rows, side.o.out)
					}
					for _, r := range rows {
						if r[0] != strconv.Itoa(tt.size) || r[1] != strconv.Itoa(tt.iters) {
							t.Errorf("%s row %v, want %d bytes %d iterations", side.name, r, tt.size, tt.iters)
						}
					}
					for _, want := range []string{" data check: ok", " rdma_cm QPs\t : ON\n", " Data ex. method : rdma_cm\n",
						"  mad_sent ", "  mad_rcvd "} {
						if !strings.Contains(side.o.out, want) {
							t.Errorf("%s: no %q:\n%s", side.name, want, side.o.out)
						}
					}
				}
				if !strings.Contains(srv.out, " Waiting for client rdma_cm QP to connect\n") {
					t.Errorf("server: no rdma_cm wait lines:\n%s", srv.out)
				}
				// Each side's QP data names the QP the CM connected, with
				// the PSNs the CM set: the local line of one is the remote
				// line of the other.
				sl, sr := addrLine(srv.out, "local"), addrLine(srv.out, "remote")
				cl, cr := addrLine(cli.out, "local"), addrLine(cli.out, "remote")
				if sl == "" || sl != cr || cl != sr {
					t.Errorf("address lines differ: server %q / %q, client %q / %q", sl, sr, cl, cr)
				}
			})
		}
	}
}

// addrLine returns the text after "side address:" in a perftest output.
func addrLine(out, side string) string {
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(l, " "+side+" address: "); ok {
			return rest
		}
	}
	return ""
}

// runPerfPairAddrs is runPerfPair with the server on 127.0.0.1 and the
// client on 127.0.0.2 when swap is set.
func runPerfPairAddrs(t *testing.T, test string, swap bool, flags []string) (srv, client perfOut) {
	t.Helper()
	if !swap {
		return runPerfPair(t, test, flags...)
	}
	return runPerfPairAt(t, "127.0.0.1", "127.0.0.2", test, flags, nil)
}

// TestPerfRDMACMMismatch: a side with -R against one without refuses with
// a message that says so, both ways, and quickly; so does a peer whose QP
// data names another QP than the one it connected through the CM.
func TestPerfRDMACMMismatch(t *testing.T) {
	if testing.Short() {
		t.Skip("uses loopback sockets")
	}
	t.Run("client -R, server without", func(t *testing.T) {
		start := time.Now()
		srv, client := runPerfPairExtra(t, "write-bw", []string{"-n", "5", "--timeout", "20s"}, []string{"-R"})
		if client.code != cli.ExitFail || !strings.Contains(client.errOut, "perftest mode mismatch") || !strings.Contains(client.errOut, "the server runs without -R") {
			t.Errorf("client exit %d:\n%s%s", client.code, client.out, client.errOut)
		}
		if srv.code != cli.ExitFail || !strings.Contains(srv.errOut, "or it runs with -R and looked for a server without it: then add -R here too") {
			t.Errorf("server exit %d:\n%s%s", srv.code, srv.out, srv.errOut)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("took %v", d)
		}
	})
	t.Run("server -R, client without", func(t *testing.T) {
		port := strconv.Itoa(freeTCPPort(t))
		done := make(chan perfOut)
		go func() {
			var o perfOut
			o.code, o.out, o.errOut = runInRetry(t, "write-bw", "-R", "-p", port, "--bind", "127.0.0.2", "--timeout", "20s")
			done <- o
		}()
		// The client retries its TCP connection until the server listens.
		code, out, errOut := runIn(t, "write-bw", "-p", port, "--bind", "127.0.0.1", "127.0.0.2")
		srv := <-done
		if code != cli.ExitFail || !strings.Contains(errOut, "perftest mode mismatch: the server runs with -R") {
			t.Errorf("client exit %d:\n%s%s", code, out, errOut)
		}
		if srv.code != cli.ExitFail || !strings.Contains(srv.errOut, "perftest mode mismatch") || !strings.Contains(srv.errOut, "connected over TCP: it runs without -R") {
			t.Errorf("server exit %d:\n%s%s", srv.code, srv.out, srv.errOut)
		}
	})
	t.Run("QP data of another QP", func(t *testing.T) {
		perfTweakLocal = func(d *oob.PerfDest) {
			if d.QPN != 0 && d.VAddr >= 1<<30 && strings.Contains(d.String(), "127.0.0.2") {
				d.QPN ^= 0x40
			}
		}
		defer func() { perfTweakLocal = nil }()
		srv, client := runPerfPair(t, "write-bw", "-R", "-n", "5", "--timeout", "20s")
		if client.code != cli.ExitFail || !strings.Contains(client.errOut, "but its rdma_cm connection connected QPN") {
			t.Errorf("client exit %d:\n%s%s", client.code, client.out, client.errOut)
		}
		if srv.code != cli.ExitFail {
			t.Errorf("server exit %d:\n%s%s", srv.code, srv.out, srv.errOut)
		}
	})
	t.Run("nothing listens", func(t *testing.T) {
		port := strconv.Itoa(freeTCPPort(t))
		start := time.Now()
		code, _, errOut := runInRetry(t, "read-bw", "-R", "-p", port, "--bind", "127.0.0.1", "--connect-timeout", "1s", "127.0.0.2")
		if code != cli.ExitFail || !strings.Contains(errOut, "couldn't connect through rdma_cm to 127.0.0.2:"+port) || !strings.Contains(errOut, "`read-bw -R` running there") {
			t.Errorf("exit %d: %s", code, errOut)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("took %v", d)
		}
	})
	t.Run("flags", func(t *testing.T) {
		code, _, errOut := runIn(t, "write-bw", "-R")
		if code != cli.ExitUsage || !strings.Contains(errOut, "-R as a server needs --bind") {
			t.Errorf("-R server without --bind: exit %d: %s", code, errOut)
		}
		code, _, errOut = runIn(t, "send-bw", "-z", "127.0.0.2")
		if code != cli.ExitUsage || !strings.Contains(errOut, "-z (exchange over rdma_cm") {
			t.Errorf("-z: exit %d: %s", code, errOut)
		}
		c, err := parsePerfFlags(oob.ReadBW, []string{"--rdma_cm", "10.0.0.1"})
		if err != nil || !c.rdmaCM {
			t.Errorf("--rdma_cm: %+v %v", c, err)
		}
	})
}
