//go:build linux

package rdmacm

import (
	"bufio"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

var jrAddr = netip.MustParseAddr("198.51.100.7")

func testRec(id uint32) journalRec {
	return journalRec{LocalID: id, RemoteID: 0xabcdef01, RemoteQPN: 0x123456, TOS: 104, Peer: netip.MustParseAddr("198.51.100.9")}
}

func mustJournal(t *testing.T, root string, a netip.Addr) *journal {
	t.Helper()
	j, err := openJournal(root, a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.close)
	return j
}

// die drops j's lock and leaves its records, as a killed process does.
func die(j *journal) {
	j.mu.Lock()
	j.shut = true
	j.lock.Close()
	j.mu.Unlock()
}

// TestJournalRecords: a record survives its encoding; malformed ones are
// refused.
func TestJournalRecords(t *testing.T) {
	r := testRec(0x80000001)
	got, err := parseJournalRec(r.encode())
	if err != nil || got != r {
		t.Fatalf("round trip: %+v %v, want %+v", got, err, r)
	}
	for _, bad := range []string{"", "rocev2-cm 2 80000001 abcdef01 123456 104 198.51.100.9",
		"rocev2-cm 1 80000001 abcdef01 1234567 104 198.51.100.9", "rocev2-cm 1 80000001 abcdef01 123456 300 198.51.100.9",
		"rocev2-cm 1 80000001 abcdef01 123456 104 nowhere", "rocev2-cm 1 80000001 abcdef01 123456 104"} {
		if _, err := parseJournalRec([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestJournalDeadOwner: a dead owner's records go to the next journal of
// its address, once; a live owner's and another address's stay.
func TestJournalDeadOwner(t *testing.T) {
	root := t.TempDir()
	dead := mustJournal(t, root, jrAddr)
	live := mustJournal(t, root, jrAddr)
	other := mustJournal(t, root, netip.MustParseAddr("198.51.100.8"))
	for _, j := range []*journal{dead, live, other} {
		if err := j.add(testRec(1)); err != nil {
			t.Fatal(err)
		}
	}
	dead.add(testRec(2))
	dead.add(testRec(3))
	dead.remove(3) // ended before the process died
	if err := dead.add(testRec(1)); err == nil {
		t.Error("a second record of one ID was written")
	}
	die(dead)
	other.close()
	next := mustJournal(t, root, jrAddr)
	recs := next.takeDead()
	if len(recs) != 2 || recs[0] != testRec(1) && recs[1] != testRec(1) {
		t.Fatalf("took %+v, want the dead owner's records 1 and 2", recs)
	}
	if _, err := os.Stat(dead.dir); !os.IsNotExist(err) {
		t.Errorf("the dead owner's directory is still there: %v", err)
	}
	if again := next.takeDead(); len(again) != 0 {
		t.Errorf("took %+v a second time", again)
	}
	if _, err := os.Stat(filepath.Join(live.dir, testRec(1).name())); err != nil {
		t.Errorf("the live owner's record: %v", err)
	}
}

// TestJournalOwnerInPIDNamespace: an owner in another PID namespace (its
// PIDs mean nothing here) is alive while its process runs and dead once
// it is killed: liveness is the lock, not a PID. Session 23's journal,
// which went by PID and start time, took such a live owner as dead and
// disconnected its connections.
func TestJournalOwnerInPIDNamespace(t *testing.T) {
	if os.Getenv("ROCEV2_JOURNAL_CHILD") != "" {
		j, err := openJournal(os.Getenv("ROCEV2_JOURNAL_CHILD"), jrAddr)
		if err != nil {
			os.Exit(3)
		}
		j.add(testRec(7))
		os.Stdout.WriteString("ready\n")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil || os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI must run this as root with unshare: %v", err)
		}
		t.Skipf("SKIPPED LOUDLY: needs root and unshare(1) for a PID namespace (%v, euid %d)", err, os.Geteuid())
	}
	root := t.TempDir()
	cmd := exec.Command(unshare, "--pid", "--fork", "--kill-child", os.Args[0], "-test.run=^TestJournalOwnerInPIDNamespace$")
	cmd.Env = append(os.Environ(), "ROCEV2_JOURNAL_CHILD="+root)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		t.Fatalf("child: %q %v", line, err)
	}
	j := mustJournal(t, root, jrAddr)
	if recs := j.takeDead(); len(recs) != 0 {
		t.Fatalf("took %+v of a live process in another PID namespace", recs)
	}
	cmd.Process.Signal(syscall.SIGKILL) // unshare; --kill-child kills the owner
	cmd.Wait()
	var recs []journalRec
	for end := time.Now().Add(5 * time.Second); len(recs) == 0 && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		recs = j.takeDead()
	}
	if len(recs) != 1 || recs[0] != testRec(7) {
		t.Fatalf("after the kill took %+v, want the killed owner's record", recs)
	}
}

// TestJournalHostileFiles: what another user or a broken file could put in
// the journal is not followed, read whole or waited for: symlinks, a FIFO,
// an oversized file, a record under another connection's name; and a
// journal directory that is not the user's alone is not used.
func TestJournalHostileFiles(t *testing.T) {
	root := t.TempDir()
	dead := mustJournal(t, root, jrAddr)
	dead.add(testRec(1))
	precious := filepath.Join(t.TempDir(), "precious")
	os.WriteFile(precious, []byte("keep me"), 0o600)
	os.Symlink(precious, filepath.Join(dead.dir, testRec(2).name()))
	if err := syscall.Mkfifo(filepath.Join(dead.dir, testRec(3).name()), 0o600); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dead.dir, testRec(4).name()), append(testRec(4).encode(), make([]byte, 4096)...), 0o600)
	os.WriteFile(filepath.Join(dead.dir, testRec(5).name()), testRec(6).encode(), 0o600)
	// A symlink where a live owner's record will go is not written through.
	live := mustJournal(t, root, jrAddr)
	os.Symlink(precious, filepath.Join(live.dir, testRec(9).name()))
	if err := live.add(testRec(9)); err == nil {
		t.Error("a record was written through a symlink")
	}
	die(dead)
	done := make(chan []journalRec, 1)
	go func() { done <- live.takeDead() }()
	select {
	case recs := <-done:
		if len(recs) != 1 || recs[0] != testRec(1) {
			t.Errorf("took %+v, want only the one sound record", recs)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("takeDead blocked (on the FIFO?)")
	}
	if b, _ := os.ReadFile(precious); string(b) != "keep me" {
		t.Errorf("the symlink's target became %q", b)
	}
	// Directories open to others, or not directories, are refused.
	open := t.TempDir()
	os.Chmod(open, 0o777)
	if _, err := openJournal(open, jrAddr); err == nil {
		t.Error("a world-writable journal root was used")
	}
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(t.TempDir(), link)
	if _, err := openJournal(link, jrAddr); err == nil {
		t.Error("a symlinked journal root was used")
	}
	if os.Geteuid() == 0 {
		foreign := t.TempDir()
		os.Chown(foreign, 65534, 65534)
		if _, err := openJournal(foreign, jrAddr); err == nil || !strings.Contains(err.Error(), "uid") {
			t.Errorf("a journal root of another user: %v", err)
		}
	}
}

// realLink hides that a memnet link is simulated (no Unwrap, no
// Simulated), so that a manager on it keeps a journal as on a socket.
type realLink struct{ udp.Link }

// TestJournalReplay: a process "killed" with an established connection
// (its manager's lock dropped, its records left) is spoken for by the
// next manager on its address: the peer gets the DREQ at once and answers
// it; without the journal it would wait for keep-alive.
func TestJournalReplay(t *testing.T) {
	t.Setenv(JournalEnv, t.TempDir())
	n := memnet.NewMemNetwork(memnet.Faults{})
	real := func(l udp.Link) udp.Link { return realLink{l} }
	db := newDev(t, n, addrB, nil)
	l, err := Listen(db, 4420, &ListenOptions{Options: fast})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := acceptAll(t, l)
	life1 := newDev(t, n, addrA, real)
	if _, err := Dial(ctxT(t, 5*time.Second), life1, netip.AddrPortFrom(addrB, 4420), &fast); err != nil {
		t.Fatal(err)
	}
	srv := <-acc
	m1 := managerOf(t, life1)
	if dir, err := m1.Journal(); err != nil || dir == "" {
		t.Fatalf("first life keeps no journal: %q %v", dir, err)
	}
	if _, err := managerOf(t, db).Journal(); err == nil {
		t.Error("a manager on a simulated network keeps a journal")
	}
	die(m1.jr) // SIGKILL: the lock goes, the records stay
	killDev(life1)
	select {
	case <-srv.Done():
		t.Fatalf("the server's connection ended before the restart: %v", srv.Err())
	case <-time.After(50 * time.Millisecond):
	}
	life2 := newDev(t, n, addrA, real)
	if _, err := NewManager(life2); err != nil {
		t.Fatal(err)
	}
	select {
	case <-srv.Done():
	case <-time.After(toldWithin):
		t.Fatal("the restart did not speak for the killed process's connection")
	}
	if !errors.Is(srv.Err(), ErrDisconnected) {
		t.Errorf("server connection ended with %v, want ErrDisconnected", srv.Err())
	}
	m2 := managerOf(t, life2)
	waitFor(t, toldWithin, func() bool { return m2.Stats().DREPForDead == 1 }, "the DREP of the dead connection's DREQ")
	if s := m2.Stats(); s.DREQForDead != 1 || s.Unknown != 0 || s.Retransmits != 0 {
		t.Errorf("restart: DREQForDead %d Unknown %d Retransmits %d, want 1, 0, 0", s.DREQForDead, s.Unknown, s.Retransmits)
	}
}
