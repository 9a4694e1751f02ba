package oob

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// srqDests returns n distinct addresses with IPv4-mapped GID ip.
func srqDests(n int, qpn0, psn0 uint32, ip byte) []PingpongDest {
	d := make([]PingpongDest, n)
	for i := range d {
		d[i] = PingpongDest{QPN: qpn0 + uint32(i), PSN: (psn0 + uint32(i)*0x10101) & 0xffffff,
			GID: [16]byte{10: 0xff, 11: 0xff, 12: 192, 13: 0, 14: 2, 15: ip}}
	}
	return d
}

// TestSRQPingpongLoopback runs SRQPingpongClient against
// SRQPingpongServer over TCP: each side writes ibv_srq_pingpong's 256
// messages (its QPs, then zero entries, exactly as the tool's zeroed
// my_dest array prints), gets the peer's 256 back, and the client ends
// with "done\0".
func TestSRQPingpongLoopback(t *testing.T) {
	cliDest, srvDest := srqDests(16, 0x11, 0xabcdef, 2), srqDests(3, 0x40, 0x000ffe, 1)
	cc, sc := loopback(t)
	rc, rs := &recConn{Conn: cc}, &recConn{Conn: sc}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	type out struct {
		d   []PingpongDest
		err error
	}
	ch := make(chan out, 1)
	go func() {
		d, err := SRQPingpongServer(ctx, rs, func(remote []PingpongDest) ([]PingpongDest, error) {
			if n := SRQPingpongUsed(remote); n != len(cliDest) {
				t.Errorf("server's localFunc sees %d client QPs, want %d", n, len(cliDest))
			}
			return srvDest, nil
		})
		ch <- out{d, err}
	}()
	got, err := SRQPingpongClient(ctx, rc, cliDest)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	so := <-ch
	if so.err != nil {
		t.Fatalf("server: %v", so.err)
	}
	if len(got) != SRQPingpongMaxQP || len(so.d) != SRQPingpongMaxQP {
		t.Fatalf("client got %d entries, server %d, want %d each", len(got), len(so.d), SRQPingpongMaxQP)
	}
	if SRQPingpongUsed(got) != len(srvDest) || SRQPingpongUsed(so.d) != len(cliDest) {
		t.Fatalf("used: client sees %d, server %d", SRQPingpongUsed(got), SRQPingpongUsed(so.d))
	}
	for i := range srvDest {
		if got[i] != srvDest[i] {
			t.Errorf("client entry %d = %v, want %v", i, got[i], srvDest[i])
		}
	}
	for i := range cliDest {
		if so.d[i] != cliDest[i] {
			t.Errorf("server entry %d = %v, want %v", i, so.d[i], cliDest[i])
		}
	}
	// The byte streams: 256 messages of 52 bytes, the unused ones as
	// the tool's sprintf of a zeroed pingpong_dest prints them.
	zero := "0000:000000:000000:00000000000000000000000000000000\x00"
	check := func(who string, stream []byte, used []PingpongDest, tail []byte) {
		t.Helper()
		if want := SRQPingpongMaxQP*PingpongDestSize + len(tail); len(stream) != want {
			t.Fatalf("%s wrote %d bytes, want %d", who, len(stream), want)
		}
		for i := 0; i < SRQPingpongMaxQP; i++ {
			m := string(stream[i*PingpongDestSize : (i+1)*PingpongDestSize])
			want := zero
			if i < len(used) {
				want = string(used[i].Marshal())
			}
			if m != want {
				t.Fatalf("%s message %d = %q, want %q", who, i, m, want)
			}
		}
		if !bytes.Equal(stream[SRQPingpongMaxQP*PingpongDestSize:], tail) {
			t.Errorf("%s ends with %q, want %q", who, stream[SRQPingpongMaxQP*PingpongDestSize:], tail)
		}
	}
	check("client", rc.bytes(), cliDest, doneMsg[:])
	check("server", rs.bytes(), srvDest, nil)
	if !strings.HasPrefix(string(rc.bytes()), "0000:000011:abcdef:00000000000000000000ffffc0000202\x00") {
		t.Errorf("client's first message %q", rc.bytes()[:PingpongDestSize])
	}
	// "done" alone: the tool's server reads it with one read(2) of up
	// to 52 bytes and wants exactly 5.
	if w := rc.writes(); len(w) != 2 || w[1] != len(doneMsg) {
		t.Errorf("client writes %v, want [13312 5]", w)
	}
}

func TestSRQPingpongErrors(t *testing.T) {
	ctx := context.Background()
	good := srqDests(2, 0x20, 0x100, 1)
	t.Run("too many QPs", func(t *testing.T) {
		c, _ := pipePair(t)
		_, err := SRQPingpongClient(ctx, c, srqDests(SRQPingpongMaxQP+1, 1, 1, 1))
		wantStepErr(t, err, PingpongStepClientDest, "check", ErrMalformed)
	})
	t.Run("invalid entry", func(t *testing.T) {
		c, _ := pipePair(t)
		bad := append([]PingpongDest(nil), good...)
		bad[1].PSN = 1 << 24
		_, err := SRQPingpongClient(ctx, c, bad)
		wantStepErr(t, err, PingpongStepClientDest, "check", ErrMalformed)
		if !strings.Contains(err.Error(), "entry 1") {
			t.Errorf("error %q does not name the entry", err)
		}
	})
	t.Run("server sends only num_qp entries", func(t *testing.T) {
		// A peer that wrote one message per QP (not the tool's 256)
		// and closed: the client reports how far it got.
		c, s := pipePair(t)
		go func() {
			readAll(s, make([]byte, SRQPingpongMaxQP*PingpongDestSize))
			s.Write(append(good[0].Marshal(), good[1].Marshal()...))
			s.Close()
		}()
		_, err := SRQPingpongClient(ctx, c, good)
		wantStepErr(t, err, PingpongStepServerDest, "read", ErrPeerClosed)
		if !strings.Contains(err.Error(), "after 104 of 13312 bytes") {
			t.Errorf("error %q does not say how much arrived", err)
		}
	})
	t.Run("bad entry from the peer", func(t *testing.T) {
		c, s := pipePair(t)
		go func() {
			b, _ := srqPingpongBlock(good)
			b[7*PingpongDestSize+3] = 'x'
			s.Write(b)
		}()
		_, err := SRQPingpongServer(ctx, c, func([]PingpongDest) ([]PingpongDest, error) { return good, nil })
		wantStepErr(t, err, PingpongStepClientDest, "parse", ErrMalformed)
		if !strings.Contains(err.Error(), "entry 7") || !strings.Contains(err.Error(), "lid") {
			t.Errorf("error %q does not name entry and field", err)
		}
	})
	t.Run("connect fails", func(t *testing.T) {
		c, s := pipePair(t)
		go func() {
			b, _ := srqPingpongBlock(good)
			c.Write(b)
		}()
		boom := errors.New("boom")
		_, err := SRQPingpongServer(ctx, s, func([]PingpongDest) ([]PingpongDest, error) { return nil, boom })
		wantStepErr(t, err, PingpongStepConnect, "local", boom)
	})
	t.Run("client sends no done", func(t *testing.T) {
		c, s := pipePair(t)
		go func() {
			b, _ := srqPingpongBlock(good)
			c.Write(b)
			readAll(c, make([]byte, len(b)))
			c.Write([]byte("nope\x00"))
		}()
		_, err := SRQPingpongServer(ctx, s, func([]PingpongDest) ([]PingpongDest, error) { return good, nil })
		wantStepErr(t, err, PingpongStepDone, "parse", ErrMalformed)
	})
	t.Run("cancel", func(t *testing.T) {
		c, s := pipePair(t)
		go readAll(s, make([]byte, SRQPingpongMaxQP*PingpongDestSize))
		cctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(30*time.Millisecond, cancel)
		_, err := SRQPingpongClient(cctx, c, good)
		wantStepErr(t, err, PingpongStepServerDest, "read", context.Canceled)
	})
}

func TestSRQPingpongUsed(t *testing.T) {
	d := srqDests(5, 1, 1, 1)
	if n := SRQPingpongUsed(d); n != 5 {
		t.Errorf("all used: %d", n)
	}
	d[3].QPN = 0
	if n := SRQPingpongUsed(d); n != 3 {
		t.Errorf("QPN 0 at 3: %d", n)
	}
	if n := SRQPingpongUsed(nil); n != 0 {
		t.Errorf("nil: %d", n)
	}
}
