package rdmacm

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestBacklogShedRule: which request a full backlog gives up for a new
// REQ. The requests held are set up in order (answered ones: taken by
// Next, their QP set up and their REP sent; sent again: the same REQ
// twice), then the new REQ arrives. Each answered request that is still
// held then completes with its requester's RTU.
//
// Before, a new REQ from the address holding the most shed that
// address's oldest request even when it was answered (REJ no resources
// of its REP): a client that reconnects in a loop had the attempt about
// to complete failed by its next one ("same source answered",
// "reconnect"). And when the address's requests were all sent again, the
// victim was another address's answered request ("same source sent
// again", "heavier source sent again"): a flood that sends each REQ twice
// pushed out others' requests. Now the new REQ is dropped unanswered
// (BacklogDropped) when its own address holds the most and has nothing
// unanswered to give up; its requester sends it again and gets in once
// there is room, marked as sent again.
func TestBacklogShedRule(t *testing.T) {
	a := netip.MustParseAddr("198.51.100.50")
	b := netip.MustParseAddr("198.51.100.51")
	c := netip.MustParseAddr("198.51.100.52")
	type req struct {
		src      netip.Addr
		id       uint32
		answered bool // taken by Next and replied to (REP sent)
		again    bool // its REQ sent twice
	}
	rows := []struct {
		name    string
		backlog int
		held    []req // in arrival order; answered ones first
		new     req
		// want: the request shed (zero: none), whether the new one is
		// admitted, REJs "no resources" sent.
		shed    req
		admit   bool
		rejs    int
		dropped int // BacklogDropped
	}{
		{name: "reconnect", backlog: 1,
			held: []req{{src: a, id: 1, answered: true}}, new: req{src: a, id: 2},
			admit: false, dropped: 1},
		{name: "same source answered", backlog: 3,
			held: []req{{src: a, id: 1, answered: true}, {src: a, id: 2, answered: true}, {src: b, id: 1, answered: true}},
			new:  req{src: a, id: 3}, admit: false, dropped: 1},
		{name: "same source unanswered", backlog: 3,
			held: []req{{src: a, id: 1, answered: true}, {src: b, id: 1, answered: true}, {src: a, id: 2}},
			new:  req{src: a, id: 3}, shed: req{src: a, id: 2}, admit: true},
		{name: "heavier source answered", backlog: 3,
			held: []req{{src: a, id: 1, answered: true}, {src: a, id: 2, answered: true}, {src: b, id: 1, answered: true}},
			new:  req{src: c, id: 1}, shed: req{src: a, id: 1}, admit: true, rejs: 1},
		{name: "every source holds one", backlog: 2,
			held: []req{{src: a, id: 1, answered: true}, {src: b, id: 1}},
			new:  req{src: c, id: 1}, shed: req{src: a, id: 1}, admit: true, rejs: 1},
		{name: "same source sent again", backlog: 2,
			held: []req{{src: b, id: 1, answered: true}, {src: a, id: 1, again: true}},
			new:  req{src: a, id: 2}, admit: false, dropped: 1},
		{name: "heavier source sent again", backlog: 3,
			held: []req{{src: b, id: 1, answered: true}, {src: a, id: 1, answered: true, again: true}, {src: a, id: 2, again: true}},
			new:  req{src: c, id: 1}, shed: req{src: a, id: 2}, admit: true},
	}
	for i, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			n := memnet.NewMemNetwork(memnet.Faults{})
			db := newDev(t, n, addrB, nil)
			port := uint16(7400 + i)
			l, err := Listen(db, port, &ListenOptions{Options: fast, Backlog: row.backlog, HalfOpenTimeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			peers := map[netip.Addr]*forgedPeer{}
			peer := func(src netip.Addr) *forgedPeer {
				if peers[src] == nil {
					peers[src] = newForgedPeer(t, db, src, port)
					peers[src].direct = true // handled before send returns
				}
				return peers[src]
			}
			mb := peer(a).mb
			conn := func(r req) *Conn {
				mb.mu.Lock()
				defer mb.mu.Unlock()
				if c := mb.remote[remoteKey{r.src, r.id}]; c != nil && c.life.half {
					return c
				}
				return nil
			}
			isShed := func(r req) bool { return r.src == row.shed.src && r.id == row.shed.id }
			name := func(r req) string { return fmt.Sprintf("%v's request %d", r.src, r.id) }
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // Next: what waits in the queue, no more
			for _, r := range row.held {
				p := peer(r.src)
				p.req(t, r.id)
				if r.answered {
					q, err := l.Next(ctx)
					if err != nil || q.c.peer != r.src || q.c.remoteID != r.id {
						t.Fatalf("Next: %v, %v; want %s (answered ones go first in the row)", q, err, name(r))
					}
					if _, err := q.reply(&fast); err != nil {
						t.Fatalf("reply to %s: %v", name(r), err)
					}
				}
				if r.again {
					p.req(t, r.id)
				}
			}
			before := StatsOf(db)
			peer(row.new.src).req(t, row.new.id)
			s := StatsOf(db)

			for _, r := range row.held {
				gone := conn(r) == nil
				if want := isShed(r); gone != want {
					t.Errorf("%s: shed %v, want %v", name(r), gone, want)
				}
			}
			if got := conn(row.new) != nil; got != row.admit {
				t.Errorf("the new REQ (%s) admitted: %v, want %v", name(row.new), got, row.admit)
			}
			shed := 0
			if row.shed != (req{}) {
				shed = 1
			}
			if d := s.Shed - before.Shed; d != uint64(shed) {
				t.Errorf("Shed %+d, want %+d", d, shed)
			}
			if d := s.RejSent[cm.RejNoResources] - before.RejSent[cm.RejNoResources]; d != uint64(row.rejs) {
				t.Errorf("REJs no resources sent: %d, want %d", d, row.rejs)
			}
			if d := s.BacklogDropped - before.BacklogDropped; d != uint64(row.dropped) {
				t.Errorf("BacklogDropped %+d, want %+d", d, row.dropped)
			}

			// The answered requests still held complete: the RTU
			// establishes each.
			for _, p := range peers {
				p.answerREPs(t)
			}
			for _, r := range row.held {
				if !r.answered || isShed(r) {
					continue
				}
				if _, ok := peer(r.src).established()[r.id]; !ok {
					t.Errorf("%s: not established by its RTU (%+v)", name(r), StatsOf(db))
				}
			}
			if row.admit {
				return
			}
			// The dropped REQ, sent again now that there is room, gets
			// in, as a request whose requester is there.
			peer(row.new.src).req(t, row.new.id)
			if c := conn(row.new); c == nil || !c.life.retried {
				t.Errorf("the dropped REQ sent again: held %v, marked as sent again %v", c != nil, c != nil && c.life.retried)
			}
		})
	}
}
