//go:build linux

package cmjournal

import (
	"bufio"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

var jrAddr = netip.MustParseAddr("198.51.100.7")

func testRec(id uint32) Record {
	return Record{LocalID: id, RemoteID: 0xabcdef01, RemoteQPN: 0x123456, TOS: 104, Peer: netip.MustParseAddr("198.51.100.9")}
}

// same compares records but where TakeDead put them.
func same(a, b Record) bool {
	a.file, b.file = "", ""
	return a == b
}

func mustJournal(t *testing.T, root string, a netip.Addr) *Journal {
	t.Helper()
	j, err := Open(root, a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(j.Close)
	return j
}

// TestJournalRecords: a record survives its encoding; malformed ones are
// refused.
func TestJournalRecords(t *testing.T) {
	r := testRec(0x80000001)
	got, err := parseRecord(r.encode())
	if err != nil || got != r {
		t.Fatalf("round trip: %+v %v, want %+v", got, err, r)
	}
	for _, bad := range []string{"", "rocev2-cm 2 80000001 abcdef01 123456 104 198.51.100.9",
		"rocev2-cm 1 80000001 abcdef01 1234567 104 198.51.100.9", "rocev2-cm 1 80000001 abcdef01 123456 300 198.51.100.9",
		"rocev2-cm 1 80000001 abcdef01 123456 104 nowhere", "rocev2-cm 1 80000001 abcdef01 123456 104"} {
		if _, err := parseRecord([]byte(bad)); err == nil {
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
	for _, j := range []*Journal{dead, live, other} {
		if err := j.Add(testRec(1)); err != nil {
			t.Fatal(err)
		}
	}
	dead.Add(testRec(2))
	dead.Add(testRec(3))
	dead.Remove(3) // ended before the process died
	if err := dead.Add(testRec(1)); err == nil {
		t.Error("a second record of one ID was written")
	}
	dead.Abandon()
	other.Close()
	next := mustJournal(t, root, jrAddr)
	recs := next.TakeDead()
	if len(recs) != 2 || !same(recs[0], testRec(1)) && !same(recs[1], testRec(1)) {
		t.Fatalf("took %+v, want the dead owner's records 1 and 2", recs)
	}
	if _, err := os.Stat(dead.dir); !os.IsNotExist(err) {
		t.Errorf("the dead owner's directory is still there: %v", err)
	}
	if again := next.TakeDead(); len(again) != 0 {
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
		j, err := Open(os.Getenv("ROCEV2_JOURNAL_CHILD"), jrAddr)
		if err != nil {
			os.Exit(3)
		}
		j.Add(testRec(7))
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
	if recs := j.TakeDead(); len(recs) != 0 {
		t.Fatalf("took %+v of a live process in another PID namespace", recs)
	}
	cmd.Process.Signal(syscall.SIGKILL) // unshare; --kill-child kills the owner
	cmd.Wait()
	var recs []Record
	for end := time.Now().Add(5 * time.Second); len(recs) == 0 && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		recs = j.TakeDead()
	}
	if len(recs) != 1 || !same(recs[0], testRec(7)) {
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
	dead.Add(testRec(1))
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
	if err := live.Add(testRec(9)); err == nil {
		t.Error("a record was written through a symlink")
	}
	dead.Abandon()
	done := make(chan []Record, 1)
	go func() { done <- live.TakeDead() }()
	select {
	case recs := <-done:
		if len(recs) != 1 || !same(recs[0], testRec(1)) {
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
	if _, err := Open(open, jrAddr); err == nil {
		t.Error("a world-writable journal root was used")
	}
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(t.TempDir(), link)
	if _, err := Open(link, jrAddr); err == nil {
		t.Error("a symlinked journal root was used")
	}
	if os.Geteuid() == 0 {
		foreign := t.TempDir()
		os.Chown(foreign, 65534, 65534)
		if _, err := Open(foreign, jrAddr); err == nil || !strings.Contains(err.Error(), "uid") {
			t.Errorf("a journal root of another user: %v", err)
		}
	}
}

// TestJournalTakenUntilSent: records taken from a dead owner stay on disk
// until their DREQ is sent; a manager that closes before sending them all
// leaves the rest to the next (review24 B: they were deleted when taken).
func TestJournalTakenUntilSent(t *testing.T) {
	root := t.TempDir()
	dead := mustJournal(t, root, jrAddr)
	for id := uint32(1); id <= 3; id++ {
		dead.Add(testRec(id))
	}
	dead.Abandon()
	taker := mustJournal(t, root, jrAddr)
	recs := taker.TakeDead()
	if len(recs) != 3 {
		t.Fatalf("took %d records, want 3", len(recs))
	}
	taker.Sent(recs[0])
	if _, err := os.Stat(recs[0].file); !os.IsNotExist(err) {
		t.Errorf("a sent record is still there: %v", err)
	}
	taker.Close() // two left unsent
	next := mustJournal(t, root, jrAddr)
	left := next.TakeDead()
	if len(left) != 2 {
		t.Fatalf("the next manager took %+v, want the 2 unsent records", left)
	}
	for _, r := range left {
		next.Sent(r)
	}
	next.Close()
	if ents, _ := os.ReadDir(next.scope); len(ents) != 0 {
		t.Errorf("scope not empty after everything was sent and closed: %v", ents)
	}
}

// TestJournalSweepWaitsFromDeath: another scope's owner killed a moment
// ago is only marked by a sweep, however old its last change; it goes
// journalStaleScope after the mark (review24 C: it was removed at once
// when its connections had been stable for a day).
func TestJournalSweepWaitsFromDeath(t *testing.T) {
	root := t.TempDir()
	dead := mustJournal(t, root, netip.MustParseAddr("198.51.100.8"))
	dead.Add(testRec(1))
	old := time.Now().Add(-48 * time.Hour)
	os.Chtimes(dead.dir, old, old)
	dead.Abandon()
	sweeper := mustJournal(t, root, jrAddr)
	sweeper.SweepOtherScopes()
	mark := filepath.Join(dead.dir, deadSince)
	if _, err := os.Stat(filepath.Join(dead.dir, testRec(1).name())); err != nil {
		t.Fatalf("a sweep removed an owner killed a moment ago: %v", err)
	}
	if _, err := os.Stat(mark); err != nil {
		t.Fatalf("no %s mark: %v", deadSince, err)
	}
	sweeper.SweepOtherScopes()
	if _, err := os.Stat(dead.dir); err != nil {
		t.Fatalf("a second sweep removed it before its time: %v", err)
	}
	os.Chtimes(mark, old, old)
	sweeper.SweepOtherScopes()
	if _, err := os.Stat(dead.dir); !os.IsNotExist(err) {
		t.Errorf("an owner dead for 48 h was not swept: %v", err)
	}
	// A live owner of another scope is never touched.
	live := mustJournal(t, root, netip.MustParseAddr("198.51.100.10"))
	live.Add(testRec(2))
	os.Chtimes(live.dir, old, old)
	sweeper.SweepOtherScopes()
	sweeper.SweepOtherScopes()
	if _, err := os.Stat(filepath.Join(live.dir, deadSince)); !os.IsNotExist(err) {
		t.Errorf("a live owner was marked dead: %v", err)
	}
}

// TestJournalRootMustBeAbsolute: a ROCEV2_CM_JOURNAL that is neither off
// nor an absolute path is refused, not made into a directory.
func TestJournalRootMustBeAbsolute(t *testing.T) {
	for _, v := range []string{"0", "none", "rel/dir"} {
		if j, err := Open(v, jrAddr); err == nil || !strings.Contains(err.Error(), "absolute") {
			if j != nil {
				j.Close()
			}
			t.Errorf("root %q: %v", v, err)
		}
	}
}
