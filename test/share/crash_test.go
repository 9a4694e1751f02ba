//go:build linux

package share_test

import (
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/share"
)

// qpnsOf reads a child's QPN line.
func qpnsOf(t testing.TB, p *proc) []uint32 {
	t.Helper()
	var out []uint32
	for _, f := range p.expect(t, "QPN") {
		n, _ := strconv.Atoi(f)
		out = append(out, uint32(n))
	}
	return out
}

func sameRange(a, b uint32) bool { return a/share.RangeSize == b/share.RangeSize }

// TestCrashedOwner: a process killed with SIGKILL keeps its QPN range
// for TimeWait: packets to it are dropped and counted (never delivered to
// the process that joins next), and only then does the range return.
func TestCrashedOwner(t *testing.T) {
	needRoot(t)
	a := testAddrs(8)
	shared, peer := a[6], a[7]
	ap := netip.AddrPortFrom(shared, udp.Port)
	t.Cleanup(func() { share.Remove(ap, "") })
	pl, err := udp.ListenSocket(peer, &udp.SocketOptions{Share: udp.ShareOff})
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()

	// TimeWait starts when a member finds the process dead; 1.5 s covers
	// the newcomer's start on a loaded machine.
	const tw = 1500 * time.Millisecond
	os.Setenv("CHILD_TIMEWAIT", tw.String())
	defer os.Unsetenv("CHILD_TIMEWAIT")
	x := startChild(t, 0, shared, peer, 1, false)
	xq := qpnsOf(t, x)
	x.cmd.Process.Kill()
	x.cmd.Wait()
	y := startChild(t, 1, shared, peer, 1, false) // joins at once: x is found dead
	yq := qpnsOf(t, y)
	for _, q := range yq {
		if sameRange(q, xq[0]) {
			t.Fatalf("the newcomer got QPN %#x in the range of the killed process (%#x) before TimeWait", q, xq[0])
		}
	}
	st, err := share.ReadStatus(ap, "")
	if err != nil {
		t.Fatal(err)
	}
	before := st.Counters.DeadOwner
	// Packets for the dead process's QPs: dropped, counted.
	pkts := make([]udp.Packet, 10)
	for i := range pkts {
		b := make([]byte, 20)
		b[0], b[2], b[3] = 0x04, 0xff, 0xff
		q := xq[i%len(xq)]
		b[5], b[6], b[7] = byte(q>>16), byte(q>>8), byte(q)
		pkts[i] = udp.Packet{Buf: b, Addr: shared}
	}
	if err := pl.Send(pkts); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if st, err = share.ReadStatus(ap, ""); err != nil {
		t.Fatal(err)
	}
	if got := st.Counters.DeadOwner - before; got != 10 {
		t.Errorf("%d packets for the dead owner dropped, want 10", got)
	}
	for _, m := range st.Members {
		if m.PID == uint32(y.cmd.Process.Pid) && m.Steered != 0 {
			t.Errorf("the newcomer was handed %d packets", m.Steered)
		}
		if m.PID == uint32(x.cmd.Process.Pid) && m.State != "timewait" {
			t.Errorf("killed member state %q, want timewait", m.State)
		}
	}
	// After TimeWait the range returns: the next process's join frees it
	// (a newcomer leases a random free range, so it need not be this one).
	time.Sleep(tw + 200*time.Millisecond)
	z := startChild(t, 2, shared, peer, 1, false)
	qpnsOf(t, z)
	if st, err = share.ReadStatus(ap, ""); err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Members {
		if m.PID == uint32(x.cmd.Process.Pid) {
			t.Errorf("the killed member still holds slot %d (%s) after its TimeWait", m.Slot, m.State)
		}
		for _, r := range m.Ranges {
			if m.PID != uint32(z.cmd.Process.Pid) && r[0] <= xq[0] && xq[0] <= r[1] {
				t.Errorf("after TimeWait the killed member's range %#x-%#x is still held (by pid %d)", r[0], r[1], m.PID)
			}
		}
	}
}
