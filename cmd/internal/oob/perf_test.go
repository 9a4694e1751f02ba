package oob

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// perfGoldens maps each perftest capture to the program that produced it.
var perfGoldens = []struct {
	name string
	test PerfTest
}{
	{"rc_write_64", WriteBW},
	{"rc_write_4096", WriteBW},
	{"rc_read_64", ReadBW},
	{"rc_read_4096", ReadBW},
	{"rc_send_bw_64", SendBW},
	{"rc_atomic_cswap", AtomicBW},
	{"rc_atomic_fadd", AtomicBW},
}

// " local address: LID 0000 QPN 0x0015 PSN 0x94b760 RKey 0x000654 VAddr 0x0055d90dddb000\n GID: 00:...:255:255:192:00:02:02"
// read/atomic add "OUT 0x80"; send and atomic print no RKey/VAddr.
var perfAddrRE = regexp.MustCompile(`(local|remote) address: LID ([0-9a-f]+) QPN 0x([0-9a-f]+) PSN 0x([0-9a-f]+)(?: OUT 0x([0-9a-f]+))?(?: RKey 0x([0-9a-f]+) VAddr 0x([0-9a-f]+))?\s*\n GID: ([0-9:]+)`)

// printed is what a perftest printed about one side's QP.
type printed struct {
	d                   PerfDest
	hasOut, hasRKeyAddr bool
}

func perfAddrs(t *testing.T, out string) (local, remote printed) {
	t.Helper()
	ms := perfAddrRE.FindAllStringSubmatch(out, -1)
	if len(ms) != 2 {
		t.Fatalf("found %d address blocks in tool output", len(ms))
	}
	for _, m := range ms {
		var p printed
		p.d.LID = uint16(mustHex(t, m[2]))
		p.d.QPN = uint32(mustHex(t, m[3]))
		p.d.PSN = uint32(mustHex(t, m[4]))
		if m[5] != "" {
			p.hasOut = true
			p.d.OutReads = uint16(mustHex(t, m[5]))
		}
		if m[6] != "" {
			p.hasRKeyAddr = true
			p.d.RKey = uint32(mustHex(t, m[6]))
			p.d.VAddr = mustHex(t, m[7])
		}
		// perftest prints GID bytes with "%02d".
		parts := strings.Split(m[8], ":")
		if len(parts) != 16 {
			t.Fatalf("GID %q has %d parts", m[8], len(parts))
		}
		for i, s := range parts {
			v, err := strconv.Atoi(s)
			if err != nil || v > 255 {
				t.Fatalf("GID byte %q", s)
			}
			p.d.GID[i] = byte(v)
		}
		if m[1] == "local" {
			local = p
		} else {
			remote = p
		}
	}
	return local, remote
}

// checkPrinted compares parsed QP data with the fields the tool printed.
func checkPrinted(t *testing.T, who string, got PerfDest, p printed) {
	t.Helper()
	want := got
	want.LID, want.QPN, want.PSN, want.GID = p.d.LID, p.d.QPN, p.d.PSN, p.d.GID
	if p.hasOut {
		want.OutReads = p.d.OutReads
	}
	if p.hasRKeyAddr {
		want.RKey, want.VAddr = p.d.RKey, p.d.VAddr
	}
	if got != want {
		t.Errorf("%s: message parses to %v, tool printed %v", who, got, want)
	}
}

// wireSizes expands a plan into the sizes of the individual writes one side
// makes (the report is five separate 8-byte writes).
func wireSizes(plan []Step) []int {
	var n []int
	for _, s := range plan {
		switch {
		case s == StepReport:
			n = append(n, 8, 8, 8, 8, 8)
		case s.WireBytes() > 0:
			n = append(n, s.WireBytes())
		}
	}
	return n
}

func segSizes(segs []segment) []int {
	n := make([]int, len(segs))
	for i, s := range segs {
		n[i] = len(s.data)
	}
	return n
}

// goldenPerf extracts the values of a perftest capture.
type goldenPerf struct {
	g                        golden
	client, server           PerfDest
	clientRep, serverRep     Report
	hasReport                bool
	clientParams, serverPar  Params
	clientVer, serverVersion string
}

func loadPerfGolden(t *testing.T, name string) goldenPerf {
	t.Helper()
	gp := goldenPerf{g: loadGolden(t, name)}
	c, s := gp.g.dir(true), gp.g.dir(false)
	var err error
	// version, cycle, cache, mtu, dest
	gp.clientVer, _, err = ParseVersion(c[0].data)
	if err != nil {
		t.Fatal(err)
	}
	gp.serverVersion, _, err = ParseVersion(s[0].data)
	if err != nil {
		t.Fatal(err)
	}
	params := func(seg []segment) Params {
		m, err := ParseMTU(seg[3].data)
		if err != nil {
			t.Fatal(err)
		}
		return Params{CycleBuffer: be32(seg[1].data), CacheLine: be32(seg[2].data), MTU: m}
	}
	gp.clientParams, gp.serverPar = params(c), params(s)
	if gp.client, err = ParsePerfDest(c[4].data); err != nil {
		t.Fatalf("client qp data: %v", err)
	}
	if gp.server, err = ParsePerfDest(s[4].data); err != nil {
		t.Fatalf("server qp data: %v", err)
	}
	rep := func(seg []segment) (Report, bool) {
		var b []byte
		for _, x := range seg {
			if len(x.data) == 8 {
				b = append(b, x.data...)
			}
		}
		if len(b) == 0 {
			return Report{}, false
		}
		r, err := ParseReport(b)
		if err != nil {
			t.Fatal(err)
		}
		return r, true
	}
	gp.clientRep, gp.hasReport = rep(c)
	gp.serverRep, _ = rep(s)
	return gp
}

func be32(b []byte) uint32 {
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func TestPerfGoldenMessages(t *testing.T) {
	for _, pg := range perfGoldens {
		t.Run(pg.name, func(t *testing.T) {
			gp := loadPerfGolden(t, pg.name)
			g := gp.g
			// What each tool printed about itself and its peer.
			sLocal, sRemote := perfAddrs(t, g.section("server output"))
			cLocal, cRemote := perfAddrs(t, g.section("client output"))
			checkPrinted(t, "client msg vs server's remote", gp.client, sRemote)
			checkPrinted(t, "client msg vs client's local", gp.client, cLocal)
			checkPrinted(t, "server msg vs server's local", gp.server, sLocal)
			checkPrinted(t, "server msg vs client's remote", gp.server, cRemote)

			if gp.clientVer != PerfVersion || gp.serverVersion != PerfVersion {
				t.Errorf("versions %q/%q, want %q", gp.clientVer, gp.serverVersion, PerfVersion)
			}
			var vb [VersionSize]byte
			EncodeVersion(vb[:], PerfVersion)
			if !bytes.Equal(vb[:], g.dir(true)[0].data) {
				t.Errorf("EncodeVersion = %x, golden %x", vb, g.dir(true)[0].data)
			}
			if gp.clientParams != DefaultParams || gp.serverPar != DefaultParams {
				t.Errorf("params %+v / %+v, want %+v", gp.clientParams, gp.serverPar, DefaultParams)
			}

			// Every 108-byte message of each side re-encodes to the golden bytes.
			for _, fromClient := range []bool{true, false} {
				want := gp.server
				if fromClient {
					want = gp.client
				}
				for _, s := range g.dir(fromClient) {
					if len(s.data) != PerfDestSize {
						continue
					}
					d, err := ParsePerfDest(s.data)
					if err != nil {
						t.Fatalf("frame %d: %v", s.frame, err)
					}
					if d != want {
						t.Errorf("frame %d: %v, want %v", s.frame, d, want)
					}
					if m := d.Marshal(); !bytes.Equal(m, s.data) {
						t.Errorf("frame %d: Marshal\n got %q\nwant %q", s.frame, m, s.data)
					}
				}
			}

			// The sequence of writes matches Plan for both roles.
			for _, role := range []Role{Client, Server} {
				plan, err := Plan(pg.test, role, 1)
				if err != nil {
					t.Fatal(err)
				}
				if got, want := wireSizes(plan), segSizes(g.dir(role == Client)); !equalInts(got, want) {
					t.Errorf("%v plan %v writes %v, golden %v", role, plan, got, want)
				}
			}

			// The client's report is what both tools printed as the result.
			if pg.test.IsBW() && pg.test != SendBW {
				if !gp.hasReport {
					t.Fatal("no report in capture")
				}
				r := gp.clientRep
				line := fmt.Sprintf("%-10d %-10d       %-7.2f            %-7.2f\t\t   %-7.6f", r.Size, r.Iters, r.BWPeak, r.BWAvg, r.MsgRate)
				for _, out := range []string{"server output", "client output"} {
					if !strings.Contains(squash(g.section(out)), squash(line)) {
						t.Errorf("%s does not show the client's report %q", out, squash(line))
					}
				}
				var b [ReportSize]byte
				r.Encode(b[:])
				var wb []byte
				for _, s := range g.dir(true) {
					if len(s.data) == 8 {
						wb = append(wb, s.data...)
					}
				}
				if !bytes.Equal(b[:], wb) {
					t.Errorf("Report.Encode = %x, golden %x", b, wb)
				}
			}
			last := func(fromClient bool) []byte { d := g.dir(fromClient); return d[len(d)-1].data }
			if !bytes.Equal(last(true), doneMsg[:]) || !bytes.Equal(last(false), doneMsg[:]) {
				t.Errorf("last payloads %q / %q, want done\\0", last(true), last(false))
			}
		})
	}
}

// squash collapses runs of white space.
func squash(s string) string { return strings.Join(strings.Fields(s), " ") }

// runPerfPair runs both roles of test over a connected pair and returns the
// results and the bytes each side wrote.
func runPerfPair(t *testing.T, test PerfTest, sizes int, cc, sc *recConn, cli, srv PerfDest, cliRep, srvRep Report) (cr, sr Result) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type out struct {
		r   Result
		err error
	}
	run := func(conn *recConn, role Role, local, peer PerfDest, rep Report, ch chan<- out) {
		plan, err := Plan(test, role, sizes)
		if err != nil {
			ch <- out{err: err}
			return
		}
		var connected bool
		traffic := 0
		hooks := Hooks{
			Connect: func(_ context.Context, remote PerfDest, p Params) error {
				if remote != peer {
					return fmt.Errorf("connect got %v, want %v", remote, peer)
				}
				if p != DefaultParams {
					return fmt.Errorf("negotiated %+v", p)
				}
				connected = true
				return nil
			},
			Prepare: func(_ context.Context, i int) error {
				if !connected {
					return errors.New("prepare before connect")
				}
				if i != traffic {
					return fmt.Errorf("prepare %d before traffic %d", i, traffic)
				}
				return nil
			},
			Traffic: func(_ context.Context, i int) (Report, error) {
				if i != traffic {
					return Report{}, fmt.Errorf("traffic %d, want %d", i, traffic)
				}
				traffic++
				return rep, nil
			},
		}
		if role == Server {
			hooks.Report = func() Report { return rep }
		}
		s := NewPerfSession(conn, role)
		r, err := s.Run(ctx, plan, DefaultParams, local, hooks)
		if err == nil && !connected {
			err = errors.New("Connect hook never ran")
		}
		ch <- out{r, err}
	}
	cch, sch := make(chan out, 1), make(chan out, 1)
	go run(sc, Server, srv, cli, srvRep, sch)
	go run(cc, Client, cli, srv, cliRep, cch)
	co, so := <-cch, <-sch
	if co.err != nil || so.err != nil {
		t.Fatalf("client: %v; server: %v", co.err, so.err)
	}
	for _, r := range []Result{co.r, so.r} {
		if r.PeerVersion != PerfVersion || r.RemoteParams != DefaultParams || r.Negotiated != DefaultParams {
			t.Errorf("result %+v", r)
		}
	}
	if co.r.Remote != srv || so.r.Remote != cli {
		t.Errorf("client saw %v, server saw %v", co.r.Remote, so.r.Remote)
	}
	return co.r, so.r
}

// TestPerfLoopbackGolden runs both roles over loopback TCP with each
// capture's values and asserts that each side's byte stream equals the
// golden's, write for write.
func TestPerfLoopbackGolden(t *testing.T) {
	for _, pg := range perfGoldens {
		t.Run(pg.name, func(t *testing.T) {
			gp := loadPerfGolden(t, pg.name)
			c, s := loopback(t)
			rc, rs := &recConn{Conn: c}, &recConn{Conn: s}
			cr, sr := runPerfPair(t, pg.test, 1, rc, rs, gp.client, gp.server, gp.clientRep, gp.serverRep)
			if w := gp.g.stream(true); !bytes.Equal(rc.bytes(), w) {
				t.Errorf("client stream differs from golden\n got %x\nwant %x", rc.bytes(), w)
			}
			if w := gp.g.stream(false); !bytes.Equal(rs.bytes(), w) {
				t.Errorf("server stream differs from golden\n got %x\nwant %x", rs.bytes(), w)
			}
			if got, want := rc.writes(), segSizes(gp.g.dir(true)); !equalInts(got, want) {
				t.Errorf("client writes %v, golden segments %v", got, want)
			}
			if got, want := rs.writes(), segSizes(gp.g.dir(false)); !equalInts(got, want) {
				t.Errorf("server writes %v, golden segments %v", got, want)
			}
			if gp.hasReport {
				if !sr.HasReport || !sameReport(sr.RemoteReport, gp.clientRep) || !sameReport(cr.RemoteReport, gp.serverRep) {
					t.Errorf("reports: server got %+v, client got %+v", sr.RemoteReport, cr.RemoteReport)
				}
			} else if sr.HasReport || cr.HasReport {
				t.Error("report exchanged in a test without one")
			}
		})
	}
}

// sameReport compares bit patterns (the server's report is garbage, may be NaN).
func sameReport(a, b Report) bool {
	var x, y [ReportSize]byte
	a.Encode(x[:])
	b.Encode(y[:])
	return x == y
}

// TestPerfAllTests runs every test kind, both over loopback TCP and over a
// synchronous net.Pipe, with one and with several sizes, and checks that the
// writes follow Plan.
func TestPerfAllTests(t *testing.T) {
	cli := PerfDest{LID: 0, OutReads: 1, QPN: 0x11, PSN: 0xabcdef, RKey: 0x1234, VAddr: 0x7f0000001000, GID: ipGID(t, "::ffff:127.0.0.1")}
	srv := PerfDest{LID: 0, OutReads: 1, QPN: 0x22, PSN: 0x123456, RKey: 0x5678, VAddr: 0x7f0000002000, GID: ipGID(t, "::ffff:127.0.0.2")}
	rep := Report{Size: 65536, Iters: 1000, BWPeak: 1234.5, BWAvg: 1200.25, MsgRate: 0.0192}
	for test := WriteBW; test <= AtomicLat; test++ {
		for _, sizes := range []int{1, 3} {
			for _, transport := range []string{"tcp", "pipe"} {
				t.Run(fmt.Sprintf("%v/sizes=%d/%s", test, sizes, transport), func(t *testing.T) {
					var c, s *recConn
					if transport == "tcp" {
						a, b := loopback(t)
						c, s = &recConn{Conn: a}, &recConn{Conn: b}
					} else {
						a, b := pipePair(t)
						c, s = &recConn{Conn: a}, &recConn{Conn: b}
					}
					cr, sr := runPerfPair(t, test, sizes, c, s, cli, srv, rep, Report{})
					for _, role := range []Role{Client, Server} {
						plan, _ := Plan(test, role, sizes)
						conn := c
						if role == Server {
							conn = s
						}
						if got, want := conn.writes(), wireSizes(plan); !equalInts(got, want) {
							t.Errorf("%v writes %v, plan %v wants %v", role, got, plan, want)
						}
					}
					hasRep := test.IsBW() && test != SendBW
					if sr.HasReport != hasRep || (hasRep && sr.RemoteReport != rep) {
						t.Errorf("server report %v %+v", sr.HasReport, sr.RemoteReport)
					}
					if cr.LocalReport != rep {
						t.Errorf("client local report %+v", cr.LocalReport)
					}
				})
			}
		}
	}
}

func TestPlanShapes(t *testing.T) {
	// Wire steps are identical for both roles (lock-step), and every plan
	// starts with the same setup.
	for test := WriteBW; test <= AtomicLat; test++ {
		for _, sizes := range []int{1, 2, 5} {
			c, _ := Plan(test, Client, sizes)
			s, _ := Plan(test, Server, sizes)
			if !equalInts(wireSizes(c), wireSizes(s)) {
				t.Errorf("%v sizes=%d: client wire %v != server wire %v", test, sizes, c, s)
			}
			head := []Step{StepVersion, StepCycleBuffer, StepCacheLine, StepMTU, StepDest}
			for i, st := range head {
				if c[i] != st {
					t.Errorf("%v: plan starts %v", test, c[:5])
					break
				}
			}
			n := 0
			for _, st := range c {
				if st == StepTraffic {
					n++
				}
			}
			if n != sizes {
				t.Errorf("%v client: %d traffic steps, want %d", test, n, sizes)
			}
		}
	}
	for _, bad := range []struct {
		test  PerfTest
		role  Role
		sizes int
	}{{0, Client, 1}, {AtomicLat + 1, Client, 1}, {WriteBW, 0, 1}, {WriteBW, Client, 0}} {
		if _, err := Plan(bad.test, bad.role, bad.sizes); err == nil {
			t.Errorf("Plan(%v, %v, %d) succeeded", bad.test, bad.role, bad.sizes)
		}
	}
	// write_lat 4.5 never says done.
	p, _ := Plan(WriteLat, Client, 1)
	if p[len(p)-1] == StepDone {
		t.Error("write-lat plan ends with done")
	}
}

func TestParsePerfDest(t *testing.T) {
	good := []byte("0000:0001:000015:c8a712:00000607:000055b5fdeb5000:00:00:00:00:00:00:00:00:00:00:ff:ff:c0:00:02:03:00000000:\x00")
	want := PerfDest{OutReads: 1, QPN: 0x15, PSN: 0xc8a712, RKey: 0x607, VAddr: 0x55b5fdeb5000,
		GID: [16]byte{10: 0xff, 11: 0xff, 12: 0xc0, 14: 2, 15: 3}}
	if d, err := ParsePerfDest(good); err != nil || d != want {
		t.Fatalf("ParsePerfDest = %v, %v", d, err)
	}
	full := PerfDest{LID: 0xffff, OutReads: 0xffff, QPN: 0xffffff, PSN: 0xffffff, RKey: 0xffffffff, VAddr: ^uint64(0), SRQN: 0xffffffff}
	for i := range full.GID {
		full.GID[i] = byte(0xf0 + i)
	}
	if d, err := ParsePerfDest(full.Marshal()); err != nil || d != full {
		t.Fatalf("round trip of max values: %v, %v", d, err)
	}
	mut := func(off int, c byte) []byte { b := bytes.Clone(good); b[off] = c; return b }
	for _, tc := range []struct {
		name  string
		in    []byte
		field string
	}{
		{"empty", nil, "length"},
		{"truncated", good[:107], "length"},
		{"lid hex", mut(0, 'g'), "lid"},
		{"out_reads hex", mut(6, 'g'), "out_reads"},
		{"qpn hex", mut(12, 'G'), "qpn"},
		{"psn hex", mut(20, '-'), "psn"},
		{"rkey hex", mut(30, 'k'), "rkey"},
		{"vaddr hex", mut(40, 'x'), "vaddr"},
		{"gid hex", mut(50+3*12, 'z'), "gid[12]"},
		{"srqn hex", mut(100, ' '), "srqn"},
		{"vaddr separator", mut(49, ';'), "vaddr separator"},
		{"gid separator", mut(50+3*15+2, '.'), "gid[15] separator"},
		{"terminator", mut(107, ':'), "terminator"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParsePerfDest(tc.in)
			var pe *ParseError
			if !errors.As(err, &pe) || !errors.Is(err, ErrMalformed) {
				t.Fatalf("err = %v, want *ParseError matching ErrMalformed", err)
			}
			if pe.Field != tc.field {
				t.Errorf("field %q, want %q (%v)", pe.Field, tc.field, err)
			}
		})
	}
}

func TestVersionAndMTU(t *testing.T) {
	for _, tc := range []struct {
		in     string
		v      string
		f      float64
		bad    bool
		compat bool
	}{
		{"6.06", "6.06", 6.06, false, true},
		{"5.70", "5.70", 5.70, false, true},
		{"6.27", "6.27", 6.27, false, true},
		{"6.28", "6.28", 6.28, false, false},
		{"25.04.0-0.84", "25.04.0-0.84", 25.04, false, false},
		{"5.6", "5.6", 5.6, false, false},
		{"", "", 0, true, false},
		{"abc", "abc", 0, true, false},
	} {
		var b [VersionSize]byte
		EncodeVersion(b[:], tc.in)
		v, f, err := ParseVersion(b[:])
		if (err != nil) != tc.bad || v != tc.v || (!tc.bad && f != tc.f) {
			t.Errorf("ParseVersion(%q) = %q, %v, %v", tc.in, v, f, err)
			continue
		}
		if tc.bad {
			continue
		}
		if err := CheckPeerVersion(v, f); (err == nil) != tc.compat || (err != nil && !errors.Is(err, ErrIncompatibleVersion)) {
			t.Errorf("CheckPeerVersion(%q) = %v", v, err)
		}
	}
	if _, _, err := ParseVersion(make([]byte, 15)); !errors.Is(err, ErrMalformed) {
		t.Errorf("short version: %v", err)
	}
	for m := MTU256; m <= MTU4096; m++ {
		got, err := ParseMTU([]byte{'0' + byte(m), 0})
		if err != nil || got != m {
			t.Errorf("ParseMTU(%d) = %v, %v", m, got, err)
		}
		if n, ok := MTUFromBytes(m.Bytes()); !ok || n != m {
			t.Errorf("MTUFromBytes(%d) = %v %v", m.Bytes(), n, ok)
		}
	}
	if MTU1024.Bytes() != 1024 || MTU(0).Bytes() != 0 {
		t.Error("MTU.Bytes")
	}
	for _, b := range [][]byte{{'0', 0}, {'6', 0}, {'x', 0}, {'3', '3'}, {'3'}} {
		if _, err := ParseMTU(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("ParseMTU(%q) = %v", b, err)
		}
	}
	n := DefaultParams.Negotiate(Params{CycleBuffer: 65536, CacheLine: 128, MTU: MTU512})
	if n != (Params{CycleBuffer: 65536, CacheLine: 128, MTU: MTU512}) {
		t.Errorf("Negotiate = %+v", n)
	}
	if n := DefaultParams.Negotiate(Params{MTU: MTU4096}); n.MTU != MTU1024 {
		t.Errorf("Negotiate keeps smaller local MTU: %+v", n)
	}
}
