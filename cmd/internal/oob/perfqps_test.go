package oob

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"
)

// qpDests returns n QP data records of one side, QPNs base, base+1, ….
func qpDests(t *testing.T, n int, base uint32, ip string) []PerfDest {
	d := make([]PerfDest, n)
	for i := range d {
		d[i] = PerfDest{OutReads: 1, QPN: base + uint32(i), PSN: 0x1000 + uint32(i)*7, RKey: 0x77,
			VAddr: 0x7f0000000000 + uint64(i)<<16, GID: ipGID(t, ip)}
	}
	return d
}

type qpRun struct {
	res       Result
	connected []PerfDest
	err       error
}

// runQPSide runs one side's plan with the records locals on conn and
// closes conn when it is done, as rocev2d does.
func runQPSide(ctx context.Context, conn net.Conn, test PerfTest, role Role, locals []PerfDest) qpRun {
	defer conn.Close()
	var out qpRun
	plan, err := Plan(test, role, 1)
	if err != nil {
		return qpRun{err: err}
	}
	hooks := Hooks{ConnectQPs: func(_ context.Context, remotes []PerfDest, _ Params) error {
		out.connected = append([]PerfDest(nil), remotes...)
		return nil
	}}
	if role == Server {
		hooks.Report = func() Report { return Report{} }
	}
	out.res, out.err = NewPerfSession(conn, role).RunQPs(ctx, plan, DefaultParams, locals, hooks)
	return out
}

// TestPerfRunQPs runs every bandwidth test's exchange with 1, 2 and 8 QPs
// per side: each side connects its QPs to the peer's records in order,
// and writes the plan's messages plus one more QP data record per extra
// QP in each of the two rounds.
func TestPerfRunQPs(t *testing.T) {
	for _, test := range []PerfTest{WriteBW, ReadBW, SendBW, AtomicBW} {
		for _, n := range []int{1, 2, 8} {
			t.Run(fmt.Sprintf("%v/q%d", test, n), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				a, b := loopback(t)
				c, s := &recConn{Conn: a}, &recConn{Conn: b}
				cli, srv := qpDests(t, n, 0x100, "::ffff:127.0.0.1"), qpDests(t, n, 0x200, "::ffff:127.0.0.2")
				sch := make(chan qpRun, 1)
				go func() { sch <- runQPSide(ctx, s, test, Server, srv) }()
				cr := runQPSide(ctx, c, test, Client, cli)
				sr := <-sch
				if cr.err != nil || sr.err != nil {
					t.Fatalf("client: %v; server: %v", cr.err, sr.err)
				}
				for _, side := range []struct {
					name       string
					r          qpRun
					peer       []PerfDest
					conn       *recConn
					role       Role
					remoteWant PerfDest
				}{{"client", cr, srv, c, Client, srv[0]}, {"server", sr, cli, s, Server, cli[0]}} {
					if fmt.Sprint(side.r.connected) != fmt.Sprint(side.peer) || fmt.Sprint(side.r.res.Remotes) != fmt.Sprint(side.peer) {
						t.Errorf("%s connected %v, result %v; want %v", side.name, side.r.connected, side.r.res.Remotes, side.peer)
					}
					if side.r.res.Remote != side.remoteWant {
						t.Errorf("%s: Remote %v, want %v", side.name, side.r.res.Remote, side.remoteWant)
					}
					plan, _ := Plan(test, side.role, 1)
					want := wireSizes(plan)
					var got108, want108 int
					for _, w := range side.conn.writes() {
						if w == PerfDestSize {
							got108++
						}
					}
					for _, w := range want {
						if w == PerfDestSize {
							want108++
						}
					}
					if got108 != want108+2*(n-1) {
						t.Errorf("%s wrote %d QP data messages, want %d (%d in the plan + 2×%d)", side.name, got108, want108+2*(n-1), want108, n-1)
					}
				}
			})
		}
	}
}

// fakePerftestQPs plays perftest 4.5's side of the QP data exchange with
// n QPs (which checks nothing): both rounds of records and the barrier
// after RTR (send_bw: before the second round), then hangs up (as perftest
// does when a later exchange fails).
func fakePerftestQPs(ctx context.Context, conn net.Conn, test PerfTest, role Role, locals []PerfDest) error {
	defer conn.Close()
	s := NewPerfSession(conn, role)
	if _, err := s.Handshake(ctx); err != nil {
		return err
	}
	if _, err := s.ExchangeParams(ctx, DefaultParams); err != nil {
		return err
	}
	round := func() error {
		for _, l := range locals {
			if _, err := s.ExchangeDest(ctx, l); err != nil {
				return err
			}
		}
		return nil
	}
	sync := func() error {
		_, err := s.ExchangeDest(ctx, locals[0])
		return err
	}
	steps := []func() error{round, round, sync}
	if test == SendBW {
		steps = []func() error{round, sync, round}
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// TestPerfQPCountMismatch: sides with different -q fail in the QP data
// exchange with a QPCountError naming both counts. The side with more QPs
// always knows the peer's count; the side with fewer learns it from a
// perftest peer, which carries on, and a lower bound from a rocev2d peer,
// which hangs up as soon as it knows.
func TestPerfQPCountMismatch(t *testing.T) {
	type tc struct {
		test     PerfTest
		cli, srv int
		fake     string // "", "client" or "server": that side plays perftest
	}
	var tests []tc
	for _, test := range []PerfTest{WriteBW, SendBW} {
		for _, c := range []tc{
			{0, 1, 8, ""}, {0, 8, 1, ""}, {0, 2, 3, ""}, {0, 3, 2, ""},
			{0, 1, 8, "server"}, {0, 8, 1, "server"}, {0, 1, 8, "client"}, {0, 8, 1, "client"}, {0, 4, 16, "server"}, {0, 2, 3, "client"},
		} {
			c.test = test
			tests = append(tests, c)
		}
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%v/client%d_server%d_fake%s", tt.test, tt.cli, tt.srv, tt.fake), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, s := loopback(t)
			cli, srv := qpDests(t, tt.cli, 0x100, "::ffff:127.0.0.1"), qpDests(t, tt.srv, 0x200, "::ffff:127.0.0.2")
			errs := map[Role]chan error{Client: make(chan error, 1), Server: make(chan error, 1)}
			for _, side := range []struct {
				role   Role
				conn   net.Conn
				locals []PerfDest
			}{{Client, c, cli}, {Server, s, srv}} {
				go func() {
					if tt.fake == side.role.String() {
						errs[side.role] <- fakePerftestQPs(ctx, side.conn, tt.test, side.role, side.locals)
						return
					}
					errs[side.role] <- runQPSide(ctx, side.conn, tt.test, side.role, side.locals).err
				}()
			}
			cerr, serr := <-errs[Client], <-errs[Server]
			for _, side := range []struct {
				role         Role
				err          error
				local, other int
			}{{Client, cerr, tt.cli, tt.srv}, {Server, serr, tt.srv, tt.cli}} {
				if tt.fake == side.role.String() {
					if side.err == nil {
						t.Errorf("the fake perftest %v went through", side.role)
					}
					continue
				}
				var qe *QPCountError
				if !errors.As(side.err, &qe) || !errors.Is(side.err, ErrQPCountMismatch) {
					t.Fatalf("%v: %v, want a QPCountError", side.role, side.err)
				}
				exact := side.local > side.other || tt.fake != ""
				if qe.Local != side.local || qe.AtLeast == exact ||
					(exact && qe.Remote != side.other) || (!exact && (qe.Remote <= side.local || qe.Remote > side.other)) {
					t.Errorf("%v: %+v (%v), want local %d, peer %d (exact %v)", side.role, *qe, side.err, side.local, side.other, exact)
				}
				t.Logf("%v: %v", side.role, side.err)
			}
		})
	}
}

// TestPlanDestRound: the bandwidth plans hold one second round of QP data,
// right after connect (write/read/atomic-bw) or after one more barrier
// (send-bw), as perftest 4.5-0.17's *_bw.c; the latency plans none.
func TestPlanDestRound(t *testing.T) {
	for test := WriteBW; test <= AtomicLat; test++ {
		for _, role := range []Role{Client, Server} {
			p, err := Plan(test, role, 2)
			if err != nil {
				t.Fatal(err)
			}
			c := slices.Index(p, StepConnect)
			r := slices.Index(p, StepDestRound)
			want := c + 1
			if test == SendBW {
				want = c + 2
			}
			if !test.IsBW() {
				want = -1
			}
			if r != want || slices.Contains(p[r+1:], StepDestRound) {
				t.Errorf("%v %v: round at %d, want %d: %v", test, role, r, want, p)
			}
		}
	}
}
