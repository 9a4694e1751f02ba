package transport

import "testing"

// checkRoles fails t unless the requester, completer and responder of qp
// (embedded by value in it) point back at qp: every role method reaches
// the shared QP state through that pointer.
func checkRoles(t *testing.T, step string, qp *QP) {
	t.Helper()
	qp.mu.Lock()
	defer qp.mu.Unlock()
	for _, r := range []struct {
		role string
		qp   *QP
	}{{"requester", qp.req.qp}, {"completer", qp.comp.qp}, {"responder", qp.resp.qp}} {
		if r.qp != qp {
			t.Fatalf("%s: the %s of qp %#x points at %p, want the QP %p", step, r.role, qp.qpn, r.qp, qp)
		}
	}
}

// TestRolesStayWithTheirQP: a QP's roles keep their QP through every reset
// of their state (CreateQP, RTR/RTS, ERR, RESET and a new connection), and
// the reconnected QPs carry traffic, which runs through each role.
func TestRolesStayWithTheirQP(t *testing.T) {
	o := pairOpts{retry: 7}
	a, b, _ := newPair(t, o)
	o.defaults()
	for _, s := range []*side{a, b} {
		checkRoles(t, "connected", s.qp)
	}
	writeN(t, a, b, 4, 3000)
	for _, s := range []*side{a, b} {
		for _, st := range []QPState{QPSErr, QPSReset} {
			if err := s.qp.Modify(&QPAttr{State: st}, AttrState); err != nil {
				t.Fatal(err)
			}
			checkRoles(t, st.String(), s.qp)
		}
	}
	connect(t, a, b, addrB, 100, 200, &o)
	connect(t, b, a, addrA, 200, 100, &o)
	for _, s := range []*side{a, b} {
		checkRoles(t, "reconnected", s.qp)
	}
	writeN(t, a, b, 4, 3000)
	a.qp.mu.Lock()
	next := a.qp.req.nextPSN()
	a.qp.mu.Unlock()
	if want := uint32(100 + 4*3); uint32(next) != want {
		t.Fatalf("requester's next PSN %v after 4 WRITEs of 3 packets from 100, want %d", next, want)
	}
}

// TestGSIRolesPointAtQP1: the GSI's QP1, built outside CreateQP, has its
// roles pointing at it too, so that a role method reached through it
// (a timer, a settle) finds its QP.
func TestGSIRolesPointAtQP1(t *testing.T) {
	a, _, _ := newPair(t, pairOpts{})
	g, err := a.dev.GSI()
	if err != nil {
		t.Fatal(err)
	}
	checkRoles(t, "QP1", g.qp)
	g.qp.mu.Lock()
	out := g.qp.comp.outstanding()
	g.qp.mu.Unlock()
	if out {
		t.Fatal("an idle QP1 reports outstanding requests")
	}
}
