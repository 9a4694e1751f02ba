//go:build unix

package perftest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/pcapgo"
	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/clitest"
	"github.com/gorocev2/rocev2/cmd/internal/oob"
	"github.com/gorocev2/rocev2/cmd/internal/pcapcmd"
	"github.com/gorocev2/rocev2/rocelayer"
)

type perfOut struct {
	code        int
	out, errOut string
}

// runPerfPair runs `rocev2d test` as server on 127.0.0.2 and as client on
// 127.0.0.1 in this process, with the same extra flags.
func runPerfPair(t *testing.T, test string, flags ...string) (srv, client perfOut) {
	t.Helper()
	return runPerfPairExtra(t, test, flags, nil)
}

// runPerfPairExtra is runPerfPair with extra flags for the client only.
func runPerfPairExtra(t *testing.T, test string, flags, cliExtra []string) (srv, client perfOut) {
	t.Helper()
	return runPerfPairAt(t, "127.0.0.2", "127.0.0.1", test, flags, cliExtra)
}

// runPerfPairAt is runPerfPairExtra with the server on srvAddr and the
// client on cliAddr.
func runPerfPairAt(t *testing.T, srvAddr, cliAddr, test string, flags, cliExtra []string) (srv, client perfOut) {
	t.Helper()
	return runPerfTests(t, srvAddr, cliAddr, test, test, flags, cliExtra)
}

// runPerfTests is runPerfPairAt with the server running srvTest and the
// client cliTest.
func runPerfTests(t *testing.T, srvAddr, cliAddr, srvTest, cliTest string, flags, cliExtra []string) (srv, client perfOut) {
	t.Helper()
	return runPerfSides(t, srvAddr, cliAddr, srvTest, cliTest, flags, append(slices.Clone(flags), cliExtra...))
}

// runPerfSides runs `rocev2d srvTest srvFlags` as the server on srvAddr
// and `rocev2d cliTest cliFlags srvAddr` as the client on cliAddr, in this
// process, retried while UDP 4791 is taken (clitest.PortBusy): every
// runPerf* helper comes here.
func runPerfSides(t *testing.T, srvAddr, cliAddr, srvTest, cliTest string, srvFlags, cliFlags []string) (srv, client perfOut) {
	t.Helper()
	for try := 0; ; try++ {
		srv, client = runPerfSidesOnce(t, srvAddr, cliAddr, srvTest, cliTest, srvFlags, cliFlags)
		if try == 4 || !clitest.PortBusy(srv.errOut+client.errOut) {
			return srv, client
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// runInRetry is runIn, retried while UDP 4791 is taken by someone else.
func runInRetry(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return clitest.RunInRetry(t, Commands(), args...)
}

func runPerfSidesOnce(t *testing.T, srvAddr, cliAddr, srvTest, cliTest string, srvFlags, cliFlags []string) (srv, client perfOut) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	port := strconv.Itoa(freeTCPPort(t))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var o, e bytes.Buffer
		srv.code = run(ctx, append([]string{srvTest, "-p", port, "--bind", srvAddr}, srvFlags...), &o, &e)
		srv.out, srv.errOut = o.String(), e.String()
	}()
	var o, e bytes.Buffer
	client.code = run(ctx, append(append([]string{cliTest, "-p", port, "--bind", cliAddr}, cliFlags...), srvAddr), &o, &e)
	client.out, client.errOut = o.String(), e.String()
	wg.Wait()
	return srv, client
}

// mustPass fails the test unless both sides of a run exited 0, showing
// their output.
func mustPass(t *testing.T, srv, client perfOut) {
	t.Helper()
	if srv.code != 0 || client.code != 0 {
		t.Fatalf("exit server %d client %d\nserver:\n%s%s\nclient:\n%s%s", srv.code, client.code, srv.out, srv.errOut, client.out, client.errOut)
	}
}

// resultRows returns the result lines (those after a "#bytes" header that
// start with a number) as fields.
func resultRows(out string) [][]string {
	var rows [][]string
	inTable := false
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, " #bytes") {
			inTable = true
			continue
		}
		f := strings.Fields(line)
		if inTable && len(f) >= 5 {
			if _, err := strconv.Atoi(f[0]); err == nil {
				rows = append(rows, f)
			}
		}
	}
	return rows
}

// TestPerfLoopback runs every bandwidth and latency test between two
// rocev2d instances on 127.0.0.1 <-> 127.0.0.2 with data checks, and checks
// the exit status, the result table (sizes, iterations) and the check line.
func TestPerfLoopback(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	tests := []struct {
		test  string
		flags []string
		sizes []int
		iters int
		// rows printed by server and client
		srvRows, cliRows int
	}{
		{"write-bw", []string{"-n", "50", "-s", "4096"}, []int{4096}, 50, 1, 1},
		{"write-bw", []string{"-n", "20", "-s", "65536", "-m", "4096", "-t", "8"}, []int{65536}, 20, 1, 1},
		{"write-bw", []string{"-n", "5", "-a"}, nil, 5, 1, 23},
		{"read-bw", []string{"-n", "50", "-s", "5000"}, []int{5000}, 50, 1, 1},
		{"send-bw", []string{"-n", "50", "-s", "3000", "-r", "16"}, []int{3000}, 50, 1, 1},
		{"send-bw", []string{"-n", "5", "-s", "64"}, []int{64}, 5, 1, 1},
		{"atomic-bw", []string{"-n", "100"}, []int{8}, 100, 1, 1},
		{"atomic-bw", []string{"-n", "20", "-A", "CMP_AND_SWAP"}, []int{8}, 20, 1, 1},
		{"write-lat", []string{"-n", "50", "-s", "64"}, []int{64}, 50, 1, 1},
		{"write-lat", []string{"-n", "10", "-s", "10000"}, []int{10000}, 10, 1, 1},
		{"read-lat", []string{"-n", "50", "-s", "2048"}, []int{2048}, 50, 0, 1},
		{"send-lat", []string{"-n", "50", "-s", "100"}, []int{100}, 50, 1, 1},
		{"atomic-lat", []string{"-n", "20"}, []int{8}, 20, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.test+strings.Join(tt.flags, ""), func(t *testing.T) {
			srv, cli := runPerfPair(t, tt.test, append(tt.flags, "--check", "-F", "-x", "1")...)
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
				for i, r := range rows {
					size := 2 << i
					if tt.sizes != nil {
						size = tt.sizes[i]
					} else if side.rows == 1 {
						size = 1 << 23 // a perftest server prints the client's last report
					}
					if r[0] != strconv.Itoa(size) || r[1] != strconv.Itoa(tt.iters) {
						t.Errorf("%s row %d: %v, want %d bytes %d iterations", side.name, i, r, size, tt.iters)
					}
				}
				if !strings.Contains(side.o.out, " data check: ok") {
					t.Errorf("%s: no data check line:\n%s", side.name, side.o.out)
				}
				if !strings.Contains(side.o.out, " local address: LID 0000 QPN 0x") || !strings.Contains(side.o.out, " GID: 00:00:00:00:00:00:00:00:00:00:255:255:127:00:00:0") {
					t.Errorf("%s: address lines missing:\n%s", side.name, side.o.out)
				}
			}
		})
	}
}

// TestPerfDuration runs a bandwidth test for one second.
func TestPerfDuration(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	start := time.Now()
	srv, cli := runPerfPair(t, "write-bw", "-D", "1", "-s", "1024", "-v")
	mustPass(t, srv, cli)
	if el := time.Since(start); el < time.Second || el > 20*time.Second {
		t.Errorf("run took %v", el)
	}
	rows := resultRows(cli.out)
	if len(rows) != 1 || rows[0][0] != "1024" {
		t.Fatalf("rows %v", rows)
	}
	if n, _ := strconv.Atoi(rows[0][1]); n < 5 {
		t.Errorf("only %d iterations in 1 s", n)
	}
	if !strings.Contains(cli.out, "sent_pkts") || !strings.Contains(cli.out, "rdma_sends") && !strings.Contains(cli.out, "rcvd_pkts") {
		t.Errorf("-v printed no counters:\n%s", cli.out)
	}
}

// TestPerfPcap captures a client's traffic (both directions) and checks the
// capture with `rocev2d pcap check`.
func TestPerfPcap(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	file := filepath.Join(t.TempDir(), "read.pcap")
	srv, cli := runPerfPairExtra(t, "read-bw", []string{"-n", "10", "-s", "3000"}, []string{"--pcap", file})
	if cli.code != 0 || srv.code != 0 {
		t.Fatalf("exit client %d server %d\n%s%s\n%s%s", cli.code, srv.code, cli.out, cli.errOut, srv.out, srv.errOut)
	}
	out := cli.out
	// 10 READ requests and 10 x 3 responses (MTU 1024).
	if !strings.Contains(out, " wrote 40 packets to "+file) {
		t.Errorf("capture line missing:\n%s", out)
	}
	// Every packet of the capture decodes with a valid ICRC (what
	// `rocev2d pcap check` checks; its own tests are rocev2d's).
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	n, middles := 0, 0
	for {
		data, _, err := r.ReadPacketData()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := gopacket.NewPacket(data, r.LinkType(), gopacket.Default)
		if err := rocelayer.VerifyICRC(p); err != nil {
			t.Errorf("packet %d: %v", n, err)
		}
		if l, ok := p.Layer(rocelayer.LayerTypeBTH).(*rocelayer.BTH); ok && strings.Contains(l.Opcode.String(), "READ_RESPONSE_MIDDLE") {
			middles++
		}
		n++
	}
	if n != 40 || middles != 10 {
		t.Errorf("capture: %d packets, %d READ_RESPONSE_MIDDLE; want 40 and 10", n, middles)
	}
}

// TestPerfPcapCountsMatchCounters: a captured write-bw client (64 KiB
// messages, GSO batches) records exactly the packets its link counted —
// the file's records, the "wrote N packets" line and link_sent_pkts +
// link_rcvd_pkts of -v agree — whole and headers-only (--snaplen 128,
// records of at most 128 bytes with the frames' real lengths).
func TestPerfPcapCountsMatchCounters(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	for _, snap := range []string{"0", "128"} {
		t.Run("snaplen="+snap, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "w.pcap")
			srv, cli := runPerfPairExtra(t, "write-bw", []string{"-n", "100", "-s", "65536"}, []string{"-v", "--pcap", file, "--snaplen", snap})
			if cli.code != 0 || srv.code != 0 {
				t.Fatalf("exit client %d server %d\n%s%s\n%s%s", cli.code, srv.code, cli.out, cli.errOut, srv.out, srv.errOut)
			}
			counter := func(name string) int {
				m := regexp.MustCompile(`(?m)^\s*` + name + `\s+(\d+)$`).FindStringSubmatch(cli.out)
				if m == nil {
					t.Fatalf("no %s in -v output:\n%s", name, cli.out)
				}
				n, _ := strconv.Atoi(m[1])
				return n
			}
			links := counter("link_sent_pkts") + counter("link_rcvd_pkts")
			f, err := os.Open(file)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			r, err := pcapgo.NewReader(f)
			if err != nil {
				t.Fatal(err)
			}
			recs, cut := 0, 0
			for {
				data, ci, err := r.ReadPacketData()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("record %d: %v", recs, err)
				}
				if len(data) < ci.Length {
					cut++
				}
				if snap == "128" && len(data) > 128 {
					t.Fatalf("record %d: %d bytes kept with snap length 128", recs, len(data))
				}
				recs++
			}
			if recs != links || !strings.Contains(cli.out, fmt.Sprintf(" wrote %d packets to %s", links, file)) || links < 100*64 {
				t.Errorf("file %d records, link counters %d (want >= %d); output:\n%s", recs, links, 100*64, cli.out)
			}
			if (snap == "128") != (cut >= 100*64) {
				t.Errorf("%d of %d records cut at snap length %s", cut, recs, snap)
			}
			// pcap check passes either way: the cut records are
			// truncated by the capture, neither ok nor bad.
			code, out, errOut := clitest.RunIn(t, pcapcmd.Commands(), "pcap", "check", "-q", file)
			want := fmt.Sprintf("total: 1 files, %d frames, %d RoCEv2 packets, %d ok, 0 bad, 0 other frames skipped", recs, recs, recs-cut)
			if cut > 0 {
				want += fmt.Sprintf(", %d truncated by the capture (ICRC not checked)", cut)
			}
			if code != 0 || !strings.Contains(out, want+"\n") {
				t.Errorf("pcap check: exit %d (want 0), output lacks %q:\n%s%s", code, want, out, errOut)
			}
		})
	}
}

func TestPerfFlags(t *testing.T) {
	bad := []struct {
		args []string
		msg  string
	}{
		{[]string{"write-bw", "-s", "0"}, "-s 0"},
		{[]string{"write-bw", "-n", "2"}, "-n 2"},
		{[]string{"write-bw", "-m", "1000"}, "-m 1000"},
		{[]string{"atomic-bw", "-A", "SWAP"}, `-A "SWAP"`},
		{[]string{"write-lat", "-D", "2"}, "-D"},
		{[]string{"write-bw", "-D", "0"}, "-D 0: duration must be greater than 0"},
		{[]string{"write-bw", "-i", "2"}, "-i 2"},
		{[]string{"read-bw", "--bind", "nope"}, `--bind "nope"`},
		{[]string{"send-bw", "--frob"}, "flag provided but not defined"},
		{[]string{"send-bw", "a", "b"}, `unexpected argument "b"`},
		{[]string{"write-lat", "-b"}, "-b: bidirectional mode is for the bandwidth tests"},
		{[]string{"send-bw", "--bidirectional", "-D", "2"}, "-b with -D"},
		// perftest refuses another size for the atomics; rocev2d took 8.
		{[]string{"atomic-bw", "-s", "4096"}, "-s 4096: the message size of the atomic tests cannot be changed"},
		{[]string{"atomic-lat", "--size=-1"}, "-s -1: the message size of the atomic tests cannot be changed"},
		// The range first: -q 0 is no request for several QPs.
		{[]string{"read-lat", "-q", "0"}, "-q 0: number of QPs must be between 1 and"},
		// A usage error, said before anything opens.
		{[]string{"write-bw", "-R"}, "-R as a server needs --bind IP"},
		// Addresses as users type them.
		{[]string{"write-bw", "127.0.0.1:18515"}, `server "127.0.0.1:18515": give the address alone; -p sets the port`},
		{[]string{"read-lat", "fe80::1"}, "server fe80::1: a link-local address needs its zone"},
		{[]string{"send-bw", "--bind", "127.0.0.1:4791"}, "give the address alone (RoCEv2 always uses UDP port 4791)"},
	}
	for _, b := range bad {
		// Bounded: a command that takes bad flags for good ones starts a
		// server and waits for a client.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var o, e bytes.Buffer
		code := run(ctx, b.args, &o, &e)
		cancel()
		if code != cli.ExitUsage || !strings.Contains(e.String(), b.msg) {
			t.Errorf("%v: exit %d, stderr %q (stdout %q), want exit 2 naming %q", b.args, code, e.String(), o.String(), b.msg)
		}
	}
	c, err := parsePerfFlags(oob.WriteBW, []string{"--size=100", "-n", "7", "-F", "10.0.0.1", "--tx-depth", "3", "-u", "17", "-x", "3"})
	if err != nil {
		t.Fatal(err)
	}
	if c.size != 100 || c.iters != 7 || c.server != "10.0.0.1" || c.txDepth != 3 || c.qpTimeout != 17 || !c.cpuFreq || c.gidIdx != 3 {
		t.Errorf("parsed %+v", c)
	}
	c, err = parsePerfFlags(oob.ReadLat, nil)
	if err != nil || c.size != 2 || c.iters != 1000 || c.txDepth != 1 || c.role() != oob.Server {
		t.Errorf("lat defaults %+v %v", c, err)
	}
	for _, args := range [][]string{nil, {"-s", "8"}} {
		c, err = parsePerfFlags(oob.AtomicBW, args)
		if err != nil || c.size != 8 || len(c.sizes()) != 1 {
			t.Errorf("atomic size %v: %+v %v", args, c, err)
		}
	}
	c, _ = parsePerfFlags(oob.SendBW, []string{"-a"})
	if s := c.sizes(); len(s) != 23 || s[0] != 2 || s[22] != 1<<23 {
		t.Errorf("-a sizes %v", s)
	}
}

func TestPerfErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("uses loopback sockets")
	}
	port := freeTCPPort(t)
	t.Run("unreachable", func(t *testing.T) {
		start := time.Now()
		code, _, errOut := runIn(t, "write-bw", "-p", strconv.Itoa(port), "--connect-timeout", "300ms", "127.0.0.2")
		if code != cli.ExitFail || !strings.Contains(errOut, "server 127.0.0.2 on TCP port "+strconv.Itoa(port)) {
			t.Errorf("exit %d: %s", code, errOut)
		}
		if time.Since(start) > 5*time.Second {
			t.Errorf("took %v", time.Since(start))
		}
	})
	t.Run("port in use", func(t *testing.T) {
		ln, err := net.Listen("tcp", ":0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		p := ln.Addr().(*net.TCPAddr).Port
		code, _, errOut := runIn(t, "send-bw", "-p", strconv.Itoa(p))
		if code != cli.ExitFail || !strings.Contains(errOut, fmt.Sprintf("TCP port %d is in use", p)) {
			t.Errorf("exit %d: %s", code, errOut)
		}
	})
	// fakeServer accepts one connection and answers with reply(conn).
	fakeServer := func(t *testing.T, reply func(net.Conn)) int {
		ln, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
			reply(conn)
		}()
		return ln.Addr().(*net.TCPAddr).Port
	}
	t.Run("incompatible version", func(t *testing.T) {
		p := fakeServer(t, func(c net.Conn) {
			buf := make([]byte, oob.VersionSize)
			c.Read(buf)
			v := make([]byte, oob.VersionSize)
			oob.EncodeVersion(v, "6.30")
			c.Write(v)
			time.Sleep(time.Second)
		})
		code, _, errOut := runIn(t, "write-bw", "-p", strconv.Itoa(p), "--bind", "127.0.0.1", "127.0.0.2")
		if code != cli.ExitFail || !strings.Contains(errOut, "incompatible perftest version") {
			t.Errorf("exit %d: %s", code, errOut)
		}
	})
	t.Run("malformed", func(t *testing.T) {
		p := fakeServer(t, func(c net.Conn) {
			buf := make([]byte, oob.VersionSize)
			c.Read(buf)
			c.Write([]byte("hello, world!!!!"))
			time.Sleep(time.Second)
		})
		code, _, errOut := runIn(t, "write-bw", "-p", strconv.Itoa(p), "--bind", "127.0.0.1", "127.0.0.2")
		if code != cli.ExitFail || !strings.Contains(errOut, "malformed out-of-band message") {
			t.Errorf("exit %d: %s", code, errOut)
		}
	})
	t.Run("remote access error", func(t *testing.T) {
		// The server announces a wrong rkey: the client's WRITEs are
		// NAKed and its completion carries the status string.
		perfTweakLocal = func(d *oob.PerfDest) {
			if d.VAddr != 0 && d.QPN != 0 {
				d.RKey ^= 0x5a5a00
			}
		}
		defer func() { perfTweakLocal = nil }()
		srv, client := runPerfPair(t, "write-bw", "-n", "5", "-s", "64", "--timeout", "20s")
		if client.code != cli.ExitFail || !strings.Contains(client.errOut, "remote access error") {
			t.Errorf("client exit %d:\n%s%s", client.code, client.out, client.errOut)
		}
		if srv.code != cli.ExitFail {
			t.Errorf("server exit %d:\n%s%s", srv.code, srv.out, srv.errOut)
		}
	})
}

// TestPerfBadPcapAtStart: a server whose --pcap cannot be written says so
// at start-up, before any client connects (it said so only to the first
// client), with the usage status 2 as every command's bad --pcap; a
// writable --pcap leaves no file behind the check.
func TestPerfBadPcapAtStart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	bad := filepath.Join(t.TempDir(), "no-such-dir", "x.pcap")
	var o, e bytes.Buffer
	code := run(ctx, []string{"write-bw", "-p", strconv.Itoa(freeTCPPort(t)), "--pcap", bad}, &o, &e)
	if code != cli.ExitUsage || !strings.Contains(e.String(), "--pcap "+bad+": open") || ctx.Err() != nil {
		t.Fatalf("exit %d, ctx %v, stderr %q", code, ctx.Err(), e.String())
	}
	good := filepath.Join(t.TempDir(), "y.pcap")
	if err := cli.CheckCapturePath(good); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(good); !os.IsNotExist(err) {
		t.Fatalf("the check left %s: %v", good, err)
	}
}
