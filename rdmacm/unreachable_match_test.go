package rdmacm

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestUnreachableMatchesTheBouncedMessage: an ICMP error ends a half-open
// connection only when the bounced datagram is the message that
// connection waits an answer to — its own REP (or REQ), named by its own
// communication ID — not any CM message with the same transaction ID to
// the same address. Every fresh rping client numbers its first
// transaction alike, so a passive connection shares its transaction ID
// with the connection of a killed client from the same address; the DREQ
// to the killed one, dropped by the client address's sharing group (an
// ICMP port unreachable), failed the restarted client's half-open
// connection (TestRpingKillRestart, about 1 run in 40, before).
func TestUnreachableMatchesTheBouncedMessage(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	m, err := managerFor(newDev(t, n, addrB, nil))
	if err != nil {
		t.Fatal(err)
	}
	const tid = 1<<32 | 1
	half := newConn(m, false, fast.withDefaults())
	m.mu.Lock()
	half.localID = m.newLocalID()
	other := half.localID + 1 // the killed client's connection
	half.remoteID, half.tid, half.peer, half.state = 0x0badcafe, tid, addrA, stREPSent
	m.conns[half.localID] = half
	m.mu.Unlock()

	bounce := func(attr cm.AttrID, local uint32, tid uint64) []byte {
		p := make([]byte, transport.MADOffset+transport.MADSize)
		mad := p[transport.MADOffset:]
		binary.BigEndian.PutUint64(mad[8:], tid)
		binary.BigEndian.PutUint16(mad[16:], uint16(attr))
		binary.BigEndian.PutUint32(mad[cm.HeaderSize:], local)
		return p
	}
	icmp := errors.New("ICMP port unreachable")
	ended := func() bool {
		select {
		case <-half.done:
			return true
		default:
			return false
		}
	}
	for _, tc := range []struct {
		name    string
		dst     netip.Addr
		payload []byte
	}{
		{"another connection's DREQ, same transaction ID", addrA, bounce(cm.AttrDREQ, other, tid)},
		{"another connection's REP, same transaction ID", addrA, bounce(cm.AttrREP, other, tid)},
		{"its own DREQ (not what it waits an answer to)", addrA, bounce(cm.AttrDREQ, half.localID, tid)},
		{"its REP, another transaction ID", addrA, bounce(cm.AttrREP, half.localID, tid+1)},
		{"its REP, to another address", addrB, bounce(cm.AttrREP, half.localID, tid)},
		{"a REQ with its ID (it is the passive side)", addrA, bounce(cm.AttrREQ, half.localID, tid)},
		{"too short", addrA, bounce(cm.AttrREP, half.localID, tid)[:transport.MADOffset+cm.HeaderSize+3]},
	} {
		m.onUnreachable(tc.dst, tc.payload, icmp)
		if ended() {
			t.Fatalf("%s: ended the half-open connection: %v", tc.name, half.err)
		}
	}
	m.onUnreachable(addrA, bounce(cm.AttrREP, half.localID, tid), icmp)
	if !ended() {
		t.Fatal("the bounce of its own REP did not end the half-open connection")
	}
	if !errors.Is(half.err, ErrUnreachable) || !errors.Is(half.err, icmp) {
		t.Errorf("err = %v, want ErrUnreachable wrapping the ICMP error", half.err)
	}
}
