package rdmacm

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/internal/cmjournal"
	"github.com/gorocev2/rocev2/transport"
)

// JournalEnv is the environment variable that places the connection
// journal (internal/cmjournal): a directory, or "off" for none. Unset, the
// journal is /run/rocev2-cm for root and $XDG_RUNTIME_DIR/rocev2-cm for
// other users (none without it), and off in test binaries, whose
// processes (and the children they start, which inherit the variable)
// would otherwise leave records of their addresses for each other.
//
// With the journal, a process killed with connections established does
// not leave its peers waiting for good: the next connection manager on
// its address (a restarted process, or another member of a shared
// address within journalRescan) sends each connection's DREQ, once, as
// Linux's kernel does for a killed process's cm_ids (Stats.DREQForDead).
const JournalEnv = cmjournal.Env

func init() {
	if testing.Testing() && os.Getenv(JournalEnv) == "" {
		os.Setenv(JournalEnv, "off")
	}
}

// journalRescan is how often a manager on a shared address looks for
// members that died: the others can speak for them at once.
const journalRescan = 2 * time.Second

// deadDREPWindow is how long a dead connection's DREQ waits for its DREP
// (which is then counted as DREPForDead, not Unknown).
const deadDREPWindow = 10 * time.Second

// openJournal opens the manager's journal: none on a simulated network,
// whose peers are in this process, or when it cannot be opened (Journal
// says why).
func (m *Manager) openJournal() {
	if m.dev.Simulated() {
		return
	}
	root := cmjournal.Root()
	j, err := cmjournal.Open(root, m.dev.Addr())
	if err != nil {
		m.journalErr = fmt.Errorf("rdmacm: connection journal %q: %w", root, err)
		return
	}
	m.jr = j
}

// replayLoop sends the DREQs of the dead owners' connections: once at
// start (a restarted process speaks for its killed predecessor), then,
// on a shared address, every journalRescan (members speak for members).
func (m *Manager) replayLoop() {
	m.replayDead()
	close(m.replayed)
	m.jr.SweepOtherScopes()
	if _, mask := m.dev.CommIDTag(); mask == 0 {
		return
	}
	t := time.NewTicker(journalRescan)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.replayDead()
		}
	}
}

// replayDead takes the dead owners' records and sends one DREQ for each:
// not sent again (the process that owned it is gone, as the kernel's is
// when it sends them for a killed process), its DREP counted if it comes.
// They go replayBatch at a time, replayPause apart, so that a killed
// server's thousands of connections do not leave as one burst.
func (m *Manager) replayDead() {
	recs := m.jr.TakeDead()
	for len(recs) > 0 {
		n := min(len(recs), replayBatch)
		if !m.replayBatchOf(recs[:n]) {
			return
		}
		recs = recs[n:]
		if len(recs) > 0 {
			select {
			case <-m.stop:
				return
			case <-time.After(replayPause):
			}
		}
	}
}

const (
	replayBatch = 32
	replayPause = time.Millisecond
)

// replayBatchOf sends the DREQs of recs; false once the manager is
// closed.
func (m *Manager) replayBatchOf(recs []cmjournal.Record) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	now := time.Now()
	for id, at := range m.deadSent {
		if now.Sub(at.at) > deadDREPWindow {
			delete(m.deadSent, id)
		}
	}
	for _, r := range recs {
		var out [transport.MADSize]byte
		h := cm.NewHeader(0, uint64(random32())<<32|uint64(random32()))
		dreq := &cm.DREQFields{LocalCommID: r.LocalID, RemoteCommID: r.RemoteID, RemoteQPN: r.RemoteQPN}
		if cm.Encode(out[:], &h, dreq) != nil {
			continue
		}
		m.st.madsOut.Add(1)
		m.st.dreqForDead.Add(1)
		m.agent.Send(r.Peer, 1, r.TOS, out[:])
		m.jr.Sent(r)
		m.deadSent[r.LocalID] = deadSent{remote: r.RemoteID, at: now}
	}
	return true
}

// deadSent is a dead connection's DREQ waiting for its DREP.
type deadSent struct {
	remote uint32
	at     time.Time
}

// onDeadDREPLocked reports whether a DREP for no known connection answers
// a dead connection's DREQ (and counts it). Called with m.mu held.
func (m *Manager) onDeadDREPLocked(f *cm.DREPFields) bool {
	d, ok := m.deadSent[f.RemoteCommID]
	if !ok || d.remote != f.LocalCommID {
		return false
	}
	delete(m.deadSent, f.RemoteCommID)
	m.st.drepForDead.Add(1)
	return true
}

// journalLocked records the established connection. Called with m.mu
// held.
func (c *Conn) journalLocked() {
	j := c.m.jr
	if j == nil || c.journaled {
		return
	}
	err := j.Add(cmjournal.Record{LocalID: c.localID, RemoteID: c.remoteID, RemoteQPN: c.params.DestQPN,
		TOS: c.opts.TrafficClass, Peer: c.peer})
	c.journaled = err == nil
}

// unjournalLocked removes the connection's record: it ended, or its peer
// was told. Called with m.mu held.
func (c *Conn) unjournalLocked() {
	if !c.journaled {
		return
	}
	c.journaled = false
	c.m.jr.Remove(c.localID)
}

// Journal reports the directory where the manager records its
// established connections (JournalEnv), or why it keeps no journal: off,
// a simulated network, a directory it cannot use.
func (m *Manager) Journal() (string, error) {
	if m.jr == nil {
		if m.journalErr == nil {
			return "", errSimulated
		}
		return "", m.journalErr
	}
	return m.jr.Dir(), nil
}

// Replayed returns a channel closed when the manager's first look at its
// address's dead processes is done: the DREQs of their recorded
// connections handed to the network (Stats.DREQForDead). It is never
// closed for a manager without a journal.
func (m *Manager) Replayed() <-chan struct{} { return m.replayed }

// journalHook is SetJournalHook's function.
var journalHook atomic.Pointer[func(dir, root string, addr netip.Addr) func()]

// SetJournalHook registers f, called when a connection manager with a
// journal starts (before its loops), with the journal's owner directory,
// its root (JournalEnv) and the manager's address; the function f returns
// (nil for none) is called when the manager has shut down and removed its
// journal. Package rdmacm/guardian starts its guardian process with it;
// nil unregisters.
func SetJournalHook(f func(dir, root string, addr netip.Addr) (done func())) {
	if f == nil {
		journalHook.Store(nil)
		return
	}
	journalHook.Store(&f)
}

var errSimulated = errors.New("rdmacm: no connection journal on a simulated network")
