package oob

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// fakeServer plays a perftest server by hand on conn: a correct setup up to
// (not including) the QP data, then script.
func fakeServer(t *testing.T, conn net.Conn, version string, script func(net.Conn)) {
	t.Helper()
	go func() {
		defer conn.Close()
		var in [VersionSize]byte
		if readAll(conn, in[:]) != nil {
			return
		}
		var v [VersionSize]byte
		EncodeVersion(v[:], version)
		if _, err := conn.Write(v[:]); err != nil {
			return
		}
		if version != PerfVersion {
			// A real 4.5 server would go on; the client must stop here.
			readAll(conn, make([]byte, 4))
			return
		}
		for _, m := range [][]byte{{0, 0, 0x10, 0}, {0, 0, 0, 0x40}, {'3', 0}} {
			if readAll(conn, make([]byte, len(m))) != nil {
				return
			}
			if _, err := conn.Write(m); err != nil {
				return
			}
		}
		script(conn)
	}()
}

var testDest = PerfDest{OutReads: 1, QPN: 0x15, PSN: 0xc8a712, RKey: 0x607, VAddr: 0x55b5fdeb5000,
	GID: [16]byte{10: 0xff, 11: 0xff, 12: 0xc0, 14: 2, 15: 3}}

func runClientPlan(ctx context.Context, conn net.Conn, test PerfTest) (Result, error) {
	plan, err := Plan(test, Client, 1)
	if err != nil {
		return Result{}, err
	}
	return NewPerfSession(conn, Client).Run(ctx, plan, DefaultParams, testDest, Hooks{})
}

func TestPerfErrors(t *testing.T) {
	ctx := context.Background()
	for _, tr := range []string{"pipe", "tcp"} {
		pair := func(t *testing.T) (net.Conn, net.Conn) {
			if tr == "tcp" {
				return loopback(t)
			}
			return pipePair(t)
		}
		t.Run(tr, func(t *testing.T) {
			t.Run("truncated qp data", func(t *testing.T) {
				c, s := pair(t)
				fakeServer(t, s, PerfVersion, func(s net.Conn) {
					readAll(s, make([]byte, PerfDestSize))
					s.Write(testDest.Marshal()[:50])
				})
				_, err := runClientPlan(ctx, c, WriteBW)
				wantStepErr(t, err, PerfStepDest, "read", ErrPeerClosed)
				if !strings.Contains(err.Error(), "after 50 of 108 bytes") {
					t.Errorf("error %q does not say how much arrived", err)
				}
			})
			t.Run("bad hex in qp data", func(t *testing.T) {
				c, s := pair(t)
				fakeServer(t, s, PerfVersion, func(s net.Conn) {
					readAll(s, make([]byte, PerfDestSize))
					m := testDest.Marshal()
					m[27] = 'x' // inside rkey
					s.Write(m)
				})
				_, err := runClientPlan(ctx, c, WriteBW)
				wantStepErr(t, err, PerfStepDest, "parse", ErrMalformed)
				var pe *ParseError
				if !errors.As(err, &pe) || pe.Field != "rkey" {
					t.Errorf("err %v does not name field rkey", err)
				}
			})
			t.Run("bad sync", func(t *testing.T) {
				c, s := pair(t)
				fakeServer(t, s, PerfVersion, func(s net.Conn) {
					readAll(s, make([]byte, PerfDestSize))
					s.Write(testDest.Marshal())
					readAll(s, make([]byte, PerfDestSize))
					s.Write(bytes.Repeat([]byte{'z'}, PerfDestSize))
				})
				// write_bw's first exchange after connect is the second
				// round of QP data.
				_, err := runClientPlan(ctx, c, WriteBW)
				wantStepErr(t, err, PerfStepDestRound, "parse", ErrMalformed)
			})
			for _, v := range []string{"6.28", "7.1", "5.5"} {
				t.Run("incompatible version "+v, func(t *testing.T) {
					c, s := pair(t)
					fakeServer(t, s, v, nil)
					_, err := runClientPlan(ctx, c, ReadBW)
					wantStepErr(t, err, PerfStepVersion, "check", ErrIncompatibleVersion)
					if !strings.Contains(err.Error(), v) {
						t.Errorf("error %q does not quote the peer's version", err)
					}
				})
			}
			t.Run("garbage version", func(t *testing.T) {
				c, s := pair(t)
				fakeServer(t, s, "hello", nil)
				_, err := runClientPlan(ctx, c, ReadBW)
				wantStepErr(t, err, PerfStepVersion, "parse", ErrMalformed)
			})
			t.Run("peer closes at once", func(t *testing.T) {
				c, s := pair(t)
				go func() { readAll(s, make([]byte, VersionSize)); s.Close() }()
				_, err := runClientPlan(ctx, c, SendBW)
				wantStepErr(t, err, PerfStepVersion, "read", ErrPeerClosed)
			})
			t.Run("server: client closes after params", func(t *testing.T) {
				c, s := pair(t)
				go func() {
					cs := NewPerfSession(c, Client)
					cs.Handshake(ctx)
					cs.ExchangeParams(ctx, DefaultParams)
					c.Close()
				}()
				plan, _ := Plan(WriteBW, Server, 1)
				_, err := NewPerfSession(s, Server).Run(ctx, plan, DefaultParams, testDest, Hooks{})
				wantStepErr(t, err, PerfStepDest, "read", ErrPeerClosed)
			})
			t.Run("peer sends bad mtu", func(t *testing.T) {
				c, s := pair(t)
				go func() {
					var v [VersionSize]byte
					readAll(s, v[:])
					s.Write(v[:])
					for _, m := range [][]byte{{0, 0, 0x10, 0}, {0, 0, 0, 0x40}, {'9', 0}} {
						readAll(s, make([]byte, len(m)))
						s.Write(m)
					}
				}()
				_, err := runClientPlan(ctx, c, WriteBW)
				wantStepErr(t, err, PerfStepMTU, "parse", ErrMalformed)
			})
			t.Run("deadline exceeded", func(t *testing.T) {
				c, s := pair(t)
				fakeServer(t, s, PerfVersion, func(s net.Conn) {
					readAll(s, make([]byte, PerfDestSize))
					time.Sleep(2 * time.Second) // never answers in time
				})
				dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				defer cancel()
				start := time.Now()
				_, err := runClientPlan(dctx, c, WriteLat)
				wantStepErr(t, err, PerfStepDest, "read", context.DeadlineExceeded)
				if d := time.Since(start); d > time.Second {
					t.Errorf("took %v to time out", d)
				}
			})
			t.Run("canceled", func(t *testing.T) {
				c, s := pair(t)
				fakeServer(t, s, PerfVersion, func(s net.Conn) {
					readAll(s, make([]byte, PerfDestSize))
					time.Sleep(2 * time.Second)
				})
				cctx, cancel := context.WithCancel(ctx)
				time.AfterFunc(100*time.Millisecond, cancel)
				_, err := runClientPlan(cctx, c, WriteLat)
				wantStepErr(t, err, PerfStepDest, "read", context.Canceled)
			})
			t.Run("hook error", func(t *testing.T) {
				c, s := pair(t)
				fakeServer(t, s, PerfVersion, func(s net.Conn) {
					readAll(s, make([]byte, PerfDestSize))
					s.Write(testDest.Marshal())
				})
				plan, _ := Plan(WriteBW, Client, 1)
				boom := errors.New("modify QP to RTR failed")
				_, err := NewPerfSession(c, Client).Run(ctx, plan, DefaultParams, testDest, Hooks{
					Connect: func(context.Context, PerfDest, Params) error { return boom },
				})
				wantStepErr(t, err, "connect", "local", boom)
			})
			t.Run("bad done", func(t *testing.T) {
				c, s := pair(t)
				go func() {
					readAll(s, make([]byte, 5))
					s.Write([]byte("DONE\x00"))
				}()
				err := NewPerfSession(c, Client).Done(ctx)
				wantStepErr(t, err, PerfStepDone, "parse", ErrMalformed)
			})
			t.Run("no done", func(t *testing.T) {
				c, s := pair(t)
				go func() { readAll(s, make([]byte, 5)); s.Close() }()
				err := NewPerfSession(c, Client).Done(ctx)
				wantStepErr(t, err, PerfStepDone, "read", ErrPeerClosed)
			})
		})
	}
}

// TestPerfDoneAgainstTool mimics the real tool's goodbye: write "done\0" and
// close at once without reading ours. Done must succeed.
func TestPerfDoneAgainstTool(t *testing.T) {
	for _, role := range []Role{Client, Server} {
		t.Run(role.String(), func(t *testing.T) {
			c, s := loopback(t)
			go func() { s.Write(doneMsg[:]); s.Close() }()
			if err := NewPerfSession(c, role).Done(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestSyncBeforeDest(t *testing.T) {
	c, _ := pipePair(t)
	err := NewPerfSession(c, Client).Sync(context.Background())
	var se *StepError
	if !errors.As(err, &se) || se.Step != PerfStepSync {
		t.Fatalf("Sync before ExchangeDest: %v", err)
	}
}

func TestInvalidLocal(t *testing.T) {
	c, _ := pipePair(t)
	s := NewPerfSession(c, Client)
	if _, err := s.ExchangeDest(context.Background(), PerfDest{QPN: 1 << 24}); !errors.Is(err, ErrMalformed) {
		t.Errorf("ExchangeDest(qpn 2^24) = %v", err)
	}
	if _, err := s.ExchangeParams(context.Background(), Params{MTU: 7}); !errors.Is(err, ErrMalformed) {
		t.Errorf("ExchangeParams(mtu 7) = %v", err)
	}
	plan, _ := Plan(SendLat, Client, 1)
	if _, err := s.Run(context.Background(), plan, Params{}, testDest, Hooks{}); !errors.Is(err, ErrMalformed) {
		t.Errorf("Run(mtu 0) = %v", err)
	}
	if _, err := s.Run(context.Background(), plan, DefaultParams, PerfDest{PSN: 1 << 24}, Hooks{}); !errors.Is(err, ErrMalformed) {
		t.Errorf("Run(psn 2^24) = %v", err)
	}
}

func ExamplePerfSession_Run() {
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	ctx := context.Background()
	srvDest := PerfDest{OutReads: 1, QPN: 0x15, PSN: 0x94b760, RKey: 0x654, VAddr: 0x55d90dddb000}
	cliDest := PerfDest{OutReads: 1, QPN: 0x15, PSN: 0xc8a712, RKey: 0x607, VAddr: 0x55b5fdeb5000}

	done := make(chan Result)
	go func() {
		plan, _ := Plan(WriteBW, Server, 1)
		r, err := NewPerfSession(server, Server).Run(ctx, plan, DefaultParams, srvDest, Hooks{})
		if err != nil {
			panic(err)
		}
		done <- r
	}()
	plan, _ := Plan(WriteBW, Client, 1)
	_, err := NewPerfSession(client, Client).Run(ctx, plan, DefaultParams, cliDest, Hooks{
		Connect: func(_ context.Context, remote PerfDest, p Params) error {
			fmt.Printf("client connects to QPN %#x PSN %#x, MTU %d\n", remote.QPN, remote.PSN, p.MTU.Bytes())
			return nil
		},
		Traffic: func(context.Context, int) (Report, error) {
			return Report{Size: 64, Iters: 5, BWPeak: 0.08, BWAvg: 0.07, MsgRate: 0.001218}, nil
		},
	})
	if err != nil {
		panic(err)
	}
	r := <-done
	fmt.Printf("server prints: %d %d %.2f %.2f %.6f\n", r.RemoteReport.Size, r.RemoteReport.Iters,
		r.RemoteReport.BWPeak, r.RemoteReport.BWAvg, r.RemoteReport.MsgRate)
	fmt.Println(plan)
	// Output:
	// client connects to QPN 0x15 PSN 0x94b760, MTU 1024
	// server prints: 64 5 0.08 0.07 0.001218
	// [version cycle buffer cache line mtu qp data connect qp data (second round) sync prepare traffic sync report sync done]
}

// TestStepTimeout: a passive server with a short StepTimeout still waits as
// long as the client's data phase takes, but a silent peer at any other step
// fails within StepTimeout.
func TestStepTimeout(t *testing.T) {
	ctx := context.Background()
	t.Run("passive server waits for traffic", func(t *testing.T) {
		c, s := loopback(t)
		errc := make(chan error, 1)
		go func() {
			plan, _ := Plan(WriteBW, Server, 1)
			ss := NewPerfSession(s, Server)
			ss.StepTimeout = 100 * time.Millisecond
			_, err := ss.Run(ctx, plan, DefaultParams, testDest, Hooks{})
			errc <- err
		}()
		plan, _ := Plan(WriteBW, Client, 1)
		cs := NewPerfSession(c, Client)
		cs.StepTimeout = 100 * time.Millisecond
		_, err := cs.Run(ctx, plan, DefaultParams, testDest, Hooks{
			Traffic: func(context.Context, int) (Report, error) {
				time.Sleep(400 * time.Millisecond)
				return Report{Size: 1}, nil
			},
		})
		if err != nil {
			t.Fatalf("client: %v", err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("server: %v", err)
		}
	})
	t.Run("silent peer", func(t *testing.T) {
		c, s := loopback(t)
		fakeServer(t, s, PerfVersion, func(s net.Conn) {
			readAll(s, make([]byte, PerfDestSize))
			time.Sleep(time.Second)
		})
		plan, _ := Plan(ReadLat, Client, 1)
		cs := NewPerfSession(c, Client)
		cs.StepTimeout = 100 * time.Millisecond
		_, err := cs.Run(ctx, plan, DefaultParams, testDest, Hooks{})
		wantStepErr(t, err, PerfStepDest, "read", context.DeadlineExceeded)
		if !strings.Contains(err.Error(), "no reply within 100ms") {
			t.Errorf("error %q does not state the step timeout", err)
		}
	})
}
