//go:build linux

package share

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("loading BPF programs needs root (CI=true: not skipping)")
		}
		t.Skip("SKIPPED LOUDLY: loading BPF programs needs root")
	}
}

// testSock is a plain UDP socket of a member.
type testSock struct {
	fd int
	m  *Member
}

func join(t *testing.T, ap netip.AddrPort, o *Options) *testSock {
	t.Helper()
	s, err := tryJoin(ap, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.close() })
	return s
}

func (s *testSock) close() {
	if s.m != nil {
		s.m.Close()
		s.m = nil
	}
	if s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
}

// drain returns the datagrams waiting on s.
func (s *testSock) drain() [][]byte {
	var out [][]byte
	for {
		b := make([]byte, 512)
		n, _, err := unix.Recvfrom(s.fd, b, 0)
		if err != nil {
			return out
		}
		out = append(out, b[:n])
	}
}

// bthTo builds a RoCE-like datagram payload (BTH + 8 bytes) for qpn.
func bthTo(qpn uint32) []byte {
	b := make([]byte, 20)
	b[0] = 0x04
	b[5], b[6], b[7] = byte(qpn>>16), byte(qpn>>8), byte(qpn)
	return b
}

// cmMAD builds a UD datagram payload to QP1 carrying a CM MAD.
func cmMAD(attr uint16, id uint32, sid uint64) []byte {
	b := make([]byte, 12+8+256)
	b[0] = 0x64
	b[7] = 1
	mad := b[20:]
	mad[0], mad[1], mad[2], mad[3] = 1, 0x07, 2, 3
	binary.BigEndian.PutUint16(mad[16:], attr)
	d := mad[24:]
	switch attr {
	case attrREQ, attrSIDRREQ:
		binary.BigEndian.PutUint32(d[0:], id)
		binary.BigEndian.PutUint64(d[8:], sid)
	case attrSIDRREP:
		binary.BigEndian.PutUint32(d[0:], id)
	default:
		binary.BigEndian.PutUint32(d[0:], 0x1234)
		binary.BigEndian.PutUint32(d[4:], id)
	}
	return b
}

func TestSteering(t *testing.T) {
	needRoot(t)
	ap := netip.MustParseAddrPort("127.0.0.61:24791")
	o := &Options{TimeWait: 300 * time.Millisecond, LockDir: t.TempDir()}
	// A group left by an earlier run (its members dead) starts afresh.
	if ok, err := Remove(ap, ""); err == nil && !ok {
		t.Fatal("a live group holds the test's address")
	}
	t.Cleanup(func() { Remove(ap, "") })
	a := join(t, ap, o)
	b := join(t, ap, o)
	fa, _, err := a.m.LeaseQPNs()
	if err != nil {
		t.Fatal(err)
	}
	fb, _, err := b.m.LeaseQPNs()
	if err != nil {
		t.Fatal(err)
	}
	if fa == fb || fa < RangeSize || fb < RangeSize {
		t.Fatalf("ranges %#x %#x", fa, fb)
	}
	// The batch read of the range owners agrees with one lookup per range.
	owners, err := a.m.g.rangeOwners()
	if err != nil {
		t.Fatal(err)
	}
	for r := uint32(1); r < numRanges; r++ {
		var o uint32
		if err := a.m.g.ranges.Lookup(r, &o); err != nil {
			t.Fatal(err)
		}
		if o != owners[r] {
			t.Fatalf("range %d: batch owner %d, lookup %d", r, owners[r], o)
		}
	}
	if owners[fa/RangeSize] != uint32(a.m.Slot())+1 || owners[fb/RangeSize] != uint32(b.m.Slot())+1 {
		t.Fatalf("owners of %#x and %#x: %d %d, want slots %d %d (+1)", fa, fb, owners[fa/RangeSize], owners[fb/RangeSize], a.m.Slot(), b.m.Slot())
	}
	if !a.m.Owns(fa+5) || a.m.Owns(fb+5) || !b.m.Owns(fb) {
		t.Fatal("Owns disagrees with the leases")
	}
	if err := a.m.ClaimService(0x106_1234); err != nil {
		t.Fatal(err)
	}
	if err := b.m.ClaimService(0x106_1234); !errors.Is(err, ErrServiceInUse) {
		t.Fatalf("second claim: %v, want ErrServiceInUse", err)
	}
	tx, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(tx)
	to := &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	send := func(p []byte) {
		if err := unix.Sendto(tx, p, 0, to); err != nil {
			t.Fatal(err)
		}
	}
	const n = 50
	for i := 0; i < n; i++ {
		send(bthTo(fa + uint32(i)))
		send(bthTo(fb + uint32(i)))
	}
	send(bthTo(0x7f0000)) // unowned
	send(bthTo(0x7f0001)) // unowned
	tagA, _ := a.m.CommIDTag()
	tagB, _ := b.m.CommIDTag()
	send(cmMAD(attrREQ, 0x55, 0x106_1234)) // a's listener
	send(cmMAD(attrREP, tagB|0x42, 0))     // b's comm ID
	send(cmMAD(attrDREQ, tagA|0x43, 0))    // a's comm ID
	send(cmMAD(attrSIDRREP, tagB|0x44, 0)) // b's request ID
	send(cmMAD(attrRTU, 0x00000045, 0))    // untagged: dropped
	send(cmMAD(attrREQ, 0x56, 0x106_9999)) // nobody listens, no rejector: dropped
	time.Sleep(50 * time.Millisecond)
	ga, gb := a.drain(), b.drain()
	count := func(got [][]byte, first uint32) (own, cm, wrong int) {
		for _, p := range got {
			q := uint32(p[5])<<16 | uint32(p[6])<<8 | uint32(p[7])
			switch {
			case q == 1:
				cm++
			case q >= first && q < first+RangeSize:
				own++
			default:
				wrong++
			}
		}
		return
	}
	if own, cm, wrong := count(ga, fa); own != n || cm != 2 || wrong != 0 {
		t.Errorf("member a got own %d cm %d wrong %d, want %d 2 0", own, cm, wrong, n)
	}
	if own, cm, wrong := count(gb, fb); own != n || cm != 2 || wrong != 0 {
		t.Errorf("member b got own %d cm %d wrong %d, want %d 2 0", own, cm, wrong, n)
	}
	if s := a.m.Steered(); s != n+2 {
		t.Errorf("a steered %d, want %d", s, n+2)
	}
	c := a.m.Counters()
	if c.UnownedQPN != 2 || c.UnownedComm != 1 || c.NoListener != 1 {
		t.Errorf("counters %+v", c)
	}
	// A rejector takes REQs nobody listens for.
	if err := b.m.VolunteerRejector(); err != nil {
		t.Fatal(err)
	}
	send(cmMAD(attrREQ, 0x57, 0x106_9999))
	time.Sleep(20 * time.Millisecond)
	if got := b.drain(); len(got) != 1 {
		t.Errorf("rejector got %d datagrams, want 1", len(got))
	}
	// b leaves: its range's datagrams are dropped (never a's) until
	// TimeWait has passed, and its slot is not reused before.
	st, err := ReadStatus(ap, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Members) != 2 || len(st.Members[0].Services) != 1 {
		t.Errorf("status %+v", st)
	}
	b.close()
	send(bthTo(fb + 1))
	time.Sleep(20 * time.Millisecond)
	if got := a.drain(); len(got) != 0 {
		t.Errorf("a got %d datagrams of the departed member", len(got))
	}
	if c := a.m.Counters(); c.DeadOwner != 1 {
		t.Errorf("dead-owner drops %d, want 1", c.DeadOwner)
	}
	c2 := join(t, ap, o)
	if c2.m.Slot() == 1 {
		t.Errorf("slot of a member in TimeWait reused")
	}
	time.Sleep(o.TimeWait + 50*time.Millisecond)
	f3, _, err := c2.m.LeaseQPNs()
	if err != nil {
		t.Fatal(err)
	}
	_ = f3
	st, err = ReadStatus(ap, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Members {
		if m.Slot == 1 {
			t.Errorf("slot 1 still held after TimeWait: %+v", m)
		}
	}
}
