package oob

import (
	"bytes"
	"context"
	"errors"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"
)

var pingpongGoldens = []string{"rc_send_64", "rc_send_4096", "uc_send_4096", "ud_send_512", "host_ud_interop"}

// "  local address:  LID 0x0000, QPN 0x000012, PSN 0x7c2ea4, GID ::ffff:192.0.2.2"
// (ud_pingpong prints "PSN 0x716616: GID").
var ppAddrRE = regexp.MustCompile(`(local|remote) address:\s+LID 0x([0-9a-f]+), QPN 0x([0-9a-f]+), PSN 0x([0-9a-f]+)[,:] GID (\S+)`)

// serverAddrs returns the server's own and the client's address as the
// golden server printed them.
func pingpongAddrs(t *testing.T, g golden) (server, client PingpongDest) {
	t.Helper()
	out := g.section("server output")
	ms := ppAddrRE.FindAllStringSubmatch(out, -1)
	if len(ms) != 2 {
		t.Fatalf("%s: found %d address lines in server output", g.name, len(ms))
	}
	for _, m := range ms {
		d := PingpongDest{LID: uint16(mustHex(t, m[2])), QPN: uint32(mustHex(t, m[3])),
			PSN: uint32(mustHex(t, m[4])), GID: ipGID(t, m[5])}
		if m[1] == "local" {
			server = d
		} else {
			client = d
		}
	}
	return server, client
}

func TestPingpongGoldenMessages(t *testing.T) {
	for _, name := range pingpongGoldens {
		t.Run(name, func(t *testing.T) {
			g := loadGolden(t, name)
			wantServer, wantClient := pingpongAddrs(t, g)
			c, s := g.dir(true), g.dir(false)
			if len(c) != 2 || len(s) != 1 {
				t.Fatalf("got %d client and %d server payloads, want 2 and 1", len(c), len(s))
			}
			for _, tc := range []struct {
				who  string
				raw  []byte
				want PingpongDest
			}{{"client", c[0].data, wantClient}, {"server", s[0].data, wantServer}} {
				got, err := ParsePingpongDest(tc.raw)
				if err != nil {
					t.Fatalf("%s message: %v", tc.who, err)
				}
				if got != tc.want {
					t.Errorf("%s message parses to %v, tool printed %v", tc.who, got, tc.want)
				}
				if m := tc.want.Marshal(); !bytes.Equal(m, tc.raw) {
					t.Errorf("%s Marshal = %q, golden %q", tc.who, m, tc.raw)
				}
			}
			if !bytes.Equal(c[1].data, doneMsg[:]) {
				t.Errorf("last client payload %q, want done\\0", c[1].data)
			}
		})
	}
}

// TestPingpongLoopback runs PingpongClient against PingpongServer over TCP
// with each golden's values and checks both byte streams against the capture.
func TestPingpongLoopback(t *testing.T) {
	for _, name := range pingpongGoldens {
		t.Run(name, func(t *testing.T) {
			g := loadGolden(t, name)
			srvDest, cliDest := pingpongAddrs(t, g)
			cc, sc := loopback(t)
			rc, rs := &recConn{Conn: cc}, &recConn{Conn: sc}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			type out struct {
				d   PingpongDest
				err error
			}
			ch := make(chan out, 1)
			go func() {
				d, err := PingpongServer(ctx, rs, func(remote PingpongDest) (PingpongDest, error) {
					if remote != cliDest {
						t.Errorf("server's localFunc got %v, want %v", remote, cliDest)
					}
					return srvDest, nil
				})
				ch <- out{d, err}
			}()
			got, err := PingpongClient(ctx, rc, cliDest)
			if err != nil {
				t.Fatalf("client: %v", err)
			}
			so := <-ch
			if so.err != nil {
				t.Fatalf("server: %v", so.err)
			}
			if got != srvDest || so.d != cliDest {
				t.Errorf("client got %v (want %v); server got %v (want %v)", got, srvDest, so.d, cliDest)
			}
			if w := g.stream(true); !bytes.Equal(rc.bytes(), w) {
				t.Errorf("client stream\n got %q\nwant %q", rc.bytes(), w)
			}
			if w := g.stream(false); !bytes.Equal(rs.bytes(), w) {
				t.Errorf("server stream\n got %q\nwant %q", rs.bytes(), w)
			}
			// One Write per message, as the tools read each with one read(2).
			if w := []int{52, 5}; !equalInts(rc.writes(), w) {
				t.Errorf("client writes %v, want %v", rc.writes(), w)
			}
		})
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestParsePingpongDest(t *testing.T) {
	good := []byte("0000:000012:76a9a2:00000000000000000000ffffc0000203\x00")
	want := PingpongDest{QPN: 0x12, PSN: 0x76a9a2, GID: [16]byte{10: 0xff, 11: 0xff, 12: 0xc0, 13: 0, 14: 2, 15: 3}}
	if d, err := ParsePingpongDest(good); err != nil || d != want {
		t.Fatalf("ParsePingpongDest(good) = %v, %v", d, err)
	}
	upper := []byte("00AB:0000FF:76A9A2:00000000000000000000FFFFC0000203\x00")
	if d, err := ParsePingpongDest(upper); err != nil || d.LID != 0xab || d.QPN != 0xff {
		t.Fatalf("upper case: %v, %v", d, err)
	}
	mut := func(off int, c byte) []byte { b := bytes.Clone(good); b[off] = c; return b }
	for _, tc := range []struct {
		name  string
		in    []byte
		field string
	}{
		{"empty", nil, "length"},
		{"short", good[:51], "length"},
		{"long", append(bytes.Clone(good), 0), "length"},
		{"lid hex", mut(2, 'g'), "lid"},
		{"qpn hex", mut(6, 'x'), "qpn"},
		{"psn hex", mut(17, ' '), "psn"},
		{"gid hex", mut(40, 'z'), "gid"},
		{"qpn sep", mut(4, '-'), "qpn separator"},
		{"gid sep", mut(18, 0), "gid separator"},
		{"no nul", mut(51, '3'), "terminator"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParsePingpongDest(tc.in)
			var pe *ParseError
			if !errors.As(err, &pe) || !errors.Is(err, ErrMalformed) {
				t.Fatalf("err = %v, want *ParseError matching ErrMalformed", err)
			}
			if pe.Field != tc.field {
				t.Errorf("field %q, want %q (%v)", pe.Field, tc.field, err)
			}
		})
	}
	if err := (PingpongDest{QPN: 1 << 24}).Validate(); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "qpn") {
		t.Errorf("Validate(qpn 2^24) = %v", err)
	}
}

// pipePair returns a synchronous in-memory connection pair.
func pipePair(t *testing.T) (a, b net.Conn) {
	a, b = net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestPingpongErrors(t *testing.T) {
	good := PingpongDest{QPN: 0x12, PSN: 0x123456}
	ctx := context.Background()

	t.Run("server reply truncated", func(t *testing.T) {
		c, s := pipePair(t)
		go func() {
			buf := make([]byte, PingpongDestSize)
			readAll(s, buf)
			s.Write(good.Marshal()[:30])
			s.Close()
		}()
		_, err := PingpongClient(ctx, c, good)
		wantStepErr(t, err, PingpongStepServerDest, "read", ErrPeerClosed)
		if !strings.Contains(err.Error(), "after 30 of 52 bytes") {
			t.Errorf("error %q does not say how much arrived", err)
		}
	})
	t.Run("server reply bad hex", func(t *testing.T) {
		c, s := pipePair(t)
		go func() {
			buf := make([]byte, PingpongDestSize)
			readAll(s, buf)
			m := good.Marshal()
			m[8] = 'q'
			s.Write(m)
		}()
		_, err := PingpongClient(ctx, c, good)
		wantStepErr(t, err, PingpongStepServerDest, "parse", ErrMalformed)
		if !strings.Contains(err.Error(), "qpn") {
			t.Errorf("error %q does not name the field", err)
		}
	})
	t.Run("client closes early", func(t *testing.T) {
		c, s := pipePair(t)
		c.Close()
		_, err := PingpongServer(ctx, s, func(PingpongDest) (PingpongDest, error) { return good, nil })
		wantStepErr(t, err, PingpongStepClientDest, "read", ErrPeerClosed)
	})
	t.Run("client sends no done", func(t *testing.T) {
		c, s := pipePair(t)
		go func() {
			c.Write(good.Marshal())
			buf := make([]byte, PingpongDestSize)
			readAll(c, buf)
			c.Write([]byte("nope\x00"))
		}()
		_, err := PingpongServer(ctx, s, func(PingpongDest) (PingpongDest, error) { return good, nil })
		wantStepErr(t, err, PingpongStepDone, "parse", ErrMalformed)
	})
	t.Run("connect fails", func(t *testing.T) {
		c, s := pipePair(t)
		go c.Write(good.Marshal())
		boom := errors.New("boom")
		_, err := PingpongServer(ctx, s, func(PingpongDest) (PingpongDest, error) { return good, boom })
		wantStepErr(t, err, PingpongStepConnect, "local", boom)
	})
	t.Run("deadline", func(t *testing.T) {
		c, _ := pipePair(t)
		dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := PingpongClient(dctx, c, good) // nobody reads: the write blocks
		wantStepErr(t, err, PingpongStepClientDest, "write", context.DeadlineExceeded)
	})
	t.Run("cancel", func(t *testing.T) {
		c, s := pipePair(t)
		go readAll(s, make([]byte, PingpongDestSize))
		cctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(30*time.Millisecond, cancel)
		_, err := PingpongClient(cctx, c, good)
		wantStepErr(t, err, PingpongStepServerDest, "read", context.Canceled)
	})
	t.Run("invalid local", func(t *testing.T) {
		c, _ := pipePair(t)
		_, err := PingpongClient(ctx, c, PingpongDest{PSN: 1 << 24})
		wantStepErr(t, err, PingpongStepClientDest, "check", ErrMalformed)
	})
}

func readAll(c net.Conn, b []byte) error {
	for n := 0; n < len(b); {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return err
		}
	}
	return nil
}

// wantStepErr asserts err is a *StepError for step/op whose chain matches target.
func wantStepErr(t *testing.T, err error, step, op string, target error) {
	t.Helper()
	var se *StepError
	if !errors.As(err, &se) {
		t.Fatalf("err = %v (%T), want *StepError", err, err)
	}
	if se.Step != step || se.Op != op {
		t.Errorf("step %q op %q, want step %q op %q (%v)", se.Step, se.Op, step, op, err)
	}
	if !errors.Is(err, target) {
		t.Errorf("err = %v, does not match %v", err, target)
	}
	if !strings.Contains(err.Error(), step) {
		t.Errorf("error text %q does not name the step", err)
	}
}
