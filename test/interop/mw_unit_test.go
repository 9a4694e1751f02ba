//go:build linux

package interop

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// mwPair returns two sides of an -o mw run connected to each other over
// an in-memory network and a pipe: owner (the windows) and user (the
// requester), as runImm would set them up, with window length n.
func mwPair(t *testing.T, ctx context.Context, n int) (owner, user *mwSide, ownerOut, userOut *strings.Builder) {
	t.Helper()
	net0 := memnet.NewMemNetwork(memnet.Faults{})
	addrs := []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")}
	ca, cb := net.Pipe()
	t.Cleanup(func() { ca.Close(); cb.Close() })
	sides := make([]*mwSide, 2)
	outs := []*strings.Builder{{}, {}}
	qps := make([]*transport.QP, 2)
	for i, a := range addrs {
		link, err := net0.Link(a)
		if err != nil {
			t.Fatal(err)
		}
		dev, err := transport.NewDevice(link, transport.DeviceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dev.Close() })
		pd, _ := dev.AllocPD()
		buf := make([]byte, n*mwSlots)
		mr, err := pd.RegisterMR(buf, memreg.AccessLocalWrite|memreg.AccessRemoteWrite|memreg.AccessRemoteRead|memreg.AccessMWBind)
		if err != nil {
			t.Fatal(err)
		}
		cq, _ := dev.CreateCQ(2*mwSlots + 4)
		qp, err := dev.CreateQP(pd, transport.QPInitAttr{Type: transport.QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: mwSlots, MaxRecvWR: mwSlots})
		if err != nil {
			t.Fatal(err)
		}
		if err := qp.Init(mwRights); err != nil {
			t.Fatal(err)
		}
		qps[i] = qp
		conn := ca
		if i == 1 {
			conn = cb
		}
		sides[i] = &mwSide{ctx: ctx, qp: qp, cq: cq, pd: pd, mr: mr, buf: buf, n: n, conn: conn, out: outs[i]}
	}
	for i, qp := range qps {
		if err := qp.Connect(transport.ConnParams{Peer: addrs[1-i], DestQPN: qps[1-i].QPN(), RQPSN: 0x100, SQPSN: 0x100,
			PathMTU: transport.MTU1024, Access: mwRights, MaxRdAtomic: 1, MaxDestRdAtomic: 1}); err != nil {
			t.Fatal(err)
		}
	}
	return sides[0], sides[1], outs[0], outs[1]
}

// TestMWExchange runs the rocev2 side of rv2imm -o mw against itself:
// a type 1 window bound with QP.BindMW and a type 2 window bound with a
// BIND_MW work request, READ and WRITE through both, LOCAL_INV and a
// rebind, a SEND with Invalidate, and the WRITE after it refused with the
// remote access NAK (the user's QP and the owner's go to ERR). Both sides
// must end without problems and print their result lines.
func TestMWExchange(t *testing.T) {
	for _, n := range []int{64, 4096} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		owner, user, oo, uo := mwPair(t, ctx, n)
		errc := make(chan error, 1)
		go func() { errc <- owner.owner() }()
		uerr := user.user()
		oerr := <-errc
		if uerr != nil || oerr != nil || len(owner.problems)+len(user.problems) > 0 {
			t.Fatalf("n=%d: user %v %q\n%s\nowner %v %q\n%s", n, uerr, user.problems, uo, oerr, owner.problems, oo)
		}
		for _, o := range []string{oo.String(), uo.String()} {
			if !reMWResult.MatchString(o) {
				t.Errorf("n=%d: no result line:\n%s", n, o)
			}
		}
		if !strings.Contains(uo.String(), "WRITE through the invalidated rkey") || !strings.Contains(uo.String(), "remote access error") {
			t.Errorf("n=%d: user output:\n%s", n, uo)
		}
		if owner.qp.State() != transport.QPSErr || user.qp.State() != transport.QPSErr {
			t.Errorf("n=%d: QP states %v / %v after the remote access error, want ERR on both", n, owner.qp.State(), user.qp.State())
		}
	}
}
