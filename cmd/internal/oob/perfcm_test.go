package oob

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// perftestCMDest is the QP data message ib_write_bw -R (perftest
// 4.5+0.17, Debian 12, server on rxe) sent in the interop lab
// (ib_write_bw_R_4096_rocev2d_client.pcap, frame 37: a 56-byte SEND on its
// exchange's QP). Its QPN 0x18 is the one the tool's REP named; rocev2d's
// RDMA WRITEs then went to QP 0x18 with RETH rkey 0x9d5, VA 0x559ea5692000.
const perftestCMDest = "00000000" + "00000001" + "00000018" + "007dba4c" + "000009d5" + "00000000" +
	"0000559ea5692000" + "00000000000000000000ffffc0000202" + "00000000" + "00000001"

func TestParsePerfDestCMGolden(t *testing.T) {
	b, _ := hex.DecodeString(perftestCMDest)
	d, err := ParsePerfDestCM(b)
	if err != nil {
		t.Fatal(err)
	}
	want := PerfDest{OutReads: 1, QPN: 0x18, PSN: 0x7dba4c, RKey: 0x9d5, VAddr: 0x559ea5692000,
		GID: [16]byte{10: 0xff, 11: 0xff, 12: 192, 14: 2, 15: 2}}
	if d != want {
		t.Fatalf("parsed %v, want %v", d, want)
	}
	// Re-encoded: the same bytes but gid_index (rocev2d sends 0; perftest
	// reads neither it nor srqn).
	m := d.MarshalCM()
	if !bytes.Equal(m[:52], b[:52]) || len(m) != PerfDestCMSize {
		t.Fatalf("MarshalCM\n got %x\nwant %x", m, b)
	}
	// The padding is whatever was on perftest's stack: ignored.
	b[21], b[23] = 0xaa, 0x55
	if d2, err := ParsePerfDestCM(b); err != nil || d2 != want {
		t.Fatalf("with padding: %v %v", d2, err)
	}
	if emptyCM(b) || !emptyCM(make([]byte, PerfDestCMSize)) {
		t.Error("emptyCM")
	}
	pad := make([]byte, PerfDestCMSize)
	pad[20] = 1
	if !emptyCM(pad) {
		t.Error("emptyCM looks at the padding")
	}
}

func TestParsePerfDestCMErrors(t *testing.T) {
	good, _ := hex.DecodeString(perftestCMDest)
	mut := func(off int, v byte) []byte { b := bytes.Clone(good); b[off] = v; return b }
	for _, tc := range []struct {
		in    []byte
		field string
	}{
		{nil, "length"},
		{good[:55], "length"},
		{append(bytes.Clone(good), 0), "length"},
		{mut(1, 1), "lid"},
		{mut(5, 1), "out_reads"},
		{mut(8, 1), "qpn"},
		{mut(12, 1), "psn"},
	} {
		_, err := ParsePerfDestCM(tc.in)
		var pe *ParseError
		if !errors.As(err, &pe) || !errors.Is(err, ErrMalformed) || pe.Field != tc.field {
			t.Errorf("%x: %v, want a ParseError for %s", tc.in, err, tc.field)
		}
	}
}

func FuzzParsePerfDestCM(f *testing.F) {
	b, _ := hex.DecodeString(perftestCMDest)
	f.Add(b)
	f.Add(make([]byte, PerfDestCMSize))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParsePerfDestCM(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not match ErrMalformed", err)
			}
			return
		}
		// Accepted input re-encodes to itself but for padding and gid_index.
		m := d.MarshalCM()
		if !bytes.Equal(m[:20], b[:20]) || !bytes.Equal(m[24:52], b[24:52]) {
			t.Fatalf("MarshalCM(Parse(%x)) = %x", b, m)
		}
	})
}

func TestPlanRDMACM(t *testing.T) {
	for test := WriteBW; test <= AtomicLat; test++ {
		for _, sizes := range []int{1, 3} {
			for _, role := range []Role{Client, Server} {
				tcp, _ := Plan(test, role, sizes)
				p, err := PlanRDMACM(test, role, sizes)
				if err != nil {
					t.Fatal(err)
				}
				head := []Step{StepVersion, StepCycleBuffer, StepCacheLine, StepMTU, StepCMSync, StepCMConnect, StepCMSync, StepDest}
				if len(p) < len(head) || fmt.Sprint(p[:len(head)]) != fmt.Sprint(head) {
					t.Errorf("%v %v: plan starts %v", test, role, p)
				}
				// The rest is the TCP plan without done.
				var rest []Step
				for _, st := range tcp[4:] {
					if st != StepDone {
						rest = append(rest, st)
					}
				}
				if fmt.Sprint(p[7:]) != fmt.Sprint(rest) {
					t.Errorf("%v %v: %v, want the TCP plan's %v", test, role, p[7:], rest)
				}
			}
		}
	}
	if _, err := PlanRDMACM(0, Client, 1); err == nil {
		t.Error("PlanRDMACM of no test")
	}
	if StepCMSync.WireBytesRDMACM() != 56 || StepDest.WireBytesRDMACM() != 56 || StepSync.WireBytesRDMACM() != 56 ||
		StepDone.WireBytesRDMACM() != 0 || StepCMConnect.WireBytesRDMACM() != 0 || StepMTU.WireBytesRDMACM() != 2 ||
		StepVersion.WireBytesRDMACM() != 16 || StepReport.WireBytesRDMACM() != 40 {
		t.Error("WireBytesRDMACM")
	}
}

// TestPerfRDMACMPair runs both roles of every test with PlanRDMACM over a
// synchronous pipe (one message per Write, as the SENDs of perftest -R's
// exchange): the writes follow the plan, the QP data is binary, the local
// data CMConnect returns replaces the one given to Run.
func TestPerfRDMACMPair(t *testing.T) {
	cli := PerfDest{OutReads: 1, QPN: 0x11, PSN: 0xabcdef, RKey: 0x1234, VAddr: 0x7f0000001000, GID: ipGID(t, "::ffff:127.0.0.1")}
	srv := PerfDest{OutReads: 1, QPN: 0x22, PSN: 0x123456, RKey: 0x5678, VAddr: 0x7f0000002000, GID: ipGID(t, "::ffff:127.0.0.2")}
	for test := WriteBW; test <= AtomicLat; test++ {
		t.Run(test.String(), func(t *testing.T) {
			a, b := pipePair(t)
			c, s := &recConn{Conn: a}, &recConn{Conn: b}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			type out struct {
				r   Result
				err error
			}
			run := func(conn *recConn, role Role, local, peer PerfDest, ch chan<- out) {
				plan, _ := PlanRDMACM(test, role, 1)
				cmConnected := false
				hooks := Hooks{
					CMConnect: func(_ context.Context, p Params) (PerfDest, error) {
						cmConnected = true
						return local, nil
					},
					Connect: func(_ context.Context, remote PerfDest, p Params) error {
						if !cmConnected {
							return errors.New("connect before the rdma_cm connection")
						}
						if remote != peer {
							return fmt.Errorf("remote %v, want %v", remote, peer)
						}
						return nil
					},
				}
				// Run starts with an empty local: perftest fills my_dest
				// only after the CM connection.
				r, err := NewPerfSessionRDMACM(conn, role).Run(ctx, plan, DefaultParams, PerfDest{}, hooks)
				ch <- out{r, err}
			}
			cch, sch := make(chan out, 1), make(chan out, 1)
			go run(s, Server, srv, cli, sch)
			go run(c, Client, cli, srv, cch)
			co, so := <-cch, <-sch
			if co.err != nil || so.err != nil {
				t.Fatalf("client: %v; server: %v", co.err, so.err)
			}
			for _, role := range []Role{Client, Server} {
				plan, _ := PlanRDMACM(test, role, 1)
				var want []int
				for _, st := range plan {
					if n := st.WireBytesRDMACM(); n > 0 {
						if st == StepReport {
							want = append(want, 8, 8, 8, 8, 8)
						} else {
							want = append(want, n)
						}
					}
				}
				conn := c
				if role == Server {
					conn = s
				}
				if got := conn.writes(); !equalInts(got, want) {
					t.Errorf("%v writes %v, want %v", role, got, want)
				}
			}
			// The first QP data message after the syncs is the client's.
			w := c.bytes()
			off := 16 + 4 + 4 + 2 + 56 + 56
			if !bytes.Equal(w[16+4+4+2:off], make([]byte, 112)) || !bytes.Equal(w[off:off+56], cli.MarshalCM()) {
				t.Errorf("client stream %x", w[:off+56])
			}
		})
	}
}

// TestPerfRDMACMModes: what a peer in another mode sends is named as such.
func TestPerfRDMACMModes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dest := PerfDest{OutReads: 1, QPN: 0x33, PSN: 1, RKey: 2, VAddr: 3}
	// A -z peer sends its QP data where -R sends the empty sync.
	a, b := pipePair(t)
	go func() {
		b.Read(make([]byte, 64))
		b.Write(make([]byte, PerfDestCMSize))
		b.Read(make([]byte, 64))
		b.Write(dest.MarshalCM())
	}()
	s := NewPerfSessionRDMACM(a, Client)
	if err := s.CMSync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.CMSync(ctx); !errors.Is(err, ErrModeMismatch) || !strings.Contains(err.Error(), "-z") {
		t.Errorf("QP data in the sync: %v", err)
	}
	// An empty message where QP data belongs.
	a, b = pipePair(t)
	go func() { b.Read(make([]byte, 64)); b.Write(make([]byte, PerfDestCMSize)) }()
	s = NewPerfSessionRDMACM(a, Client)
	if _, err := s.ExchangeDest(ctx, dest); !errors.Is(err, ErrModeMismatch) {
		t.Errorf("empty QP data: %v", err)
	}
	// Over TCP there is no rdma_cm sync, and over rdma_cm no done.
	if err := NewPerfSession(a, Client).CMSync(ctx); err == nil {
		t.Error("CMSync over TCP")
	}
	if err := NewPerfSessionRDMACM(a, Client).Done(ctx); err == nil {
		t.Error("Done over rdma_cm")
	}
	// A rocev2d -R server answers a TCP client with RDMACMVersion.
	a, b = pipePair(t)
	go func() {
		v := make([]byte, VersionSize)
		EncodeVersion(v, RDMACMVersion)
		b.Read(make([]byte, VersionSize))
		b.Write(v)
	}()
	if _, err := NewPerfSession(a, Client).Handshake(ctx); !errors.Is(err, ErrModeMismatch) || !strings.Contains(err.Error(), "add -R") {
		t.Errorf("handshake with a -R server: %v", err)
	}
}
