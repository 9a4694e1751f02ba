//go:build linux

package cmjournal

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// recordMax is the largest record file read.
const recordMax = 128

// journalStaleScope is how long an owner of another scope (another boot,
// a namespace gone, an address not used since) must have been found dead
// before a starting manager removes it: until then a manager of that
// scope may still speak for it.
const journalStaleScope = 24 * time.Hour

// deadSince is the file a sweep leaves in an owner directory of another
// scope when it first finds the owner dead: its time starts
// journalStaleScope.
const deadSince = "dead-since"

// Journal is one connection manager's journal: its owner directory,
// locked while it lives.
type Journal struct {
	root  string
	scope string // <root>/<scope>
	dir   string // <root>/<scope>/<owner>
	lock  *os.File
	mu    sync.Mutex // orders add and remove against close
	shut  bool
}

// Root returns where the journal lives: $ROCEV2_CM_JOURNAL (Env; "off":
// nowhere), else /run/rocev2-cm for root, $XDG_RUNTIME_DIR/rocev2-cm for
// another user, and nowhere without either (never a world-writable
// directory such as /tmp).
func Root() string {
	switch v := os.Getenv(Env); v {
	case "off":
		return ""
	case "":
	default:
		return v
	}
	if os.Geteuid() == 0 {
		return "/run/rocev2-cm"
	}
	if x := os.Getenv("XDG_RUNTIME_DIR"); x != "" && filepath.IsAbs(x) {
		return filepath.Join(x, "rocev2-cm")
	}
	return ""
}

// netnsID names the calling thread's network namespace: its cookie
// (SO_NETNS_COOKIE, Linux 5.14, never reused while the system runs) or,
// on an older kernel, its nsfs inode number.
func netnsID() (string, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err == nil {
		c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, soNetnsCookie)
		unix.Close(fd)
		if err == nil {
			return "c" + strconv.FormatUint(c, 16), nil
		}
	}
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return "", err
	}
	return "i" + strconv.FormatUint(st.Ino, 10), nil
}

// soNetnsCookie is SO_NETNS_COOKIE (include/uapi/asm-generic/socket.h).
const soNetnsCookie = 71

// privateDir makes dir (mode 0700) unless it exists, and checks that it
// is a directory, not a symlink, owned by the effective user, with none
// of the mode bits in closed set.
func privateDir(dir string, closed uint32) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return err
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("%s is not a directory", dir)
	case int(st.Uid) != os.Geteuid():
		return fmt.Errorf("%s belongs to uid %d, not to this process's %d", dir, st.Uid, os.Geteuid())
	case st.Mode&closed != 0:
		return fmt.Errorf("%s is open to other users (mode %#o)", dir, st.Mode&0o777)
	}
	return nil
}

// Open opens a connection manager's journal for its address addr under
// root: its owner directory made and locked. On error there is no
// journal (the caller goes on without one).
func Open(root string, addr netip.Addr) (*Journal, error) {
	if root == "" {
		return nil, fmt.Errorf("none (%s=off, or no directory for uid %d)", Env, os.Geteuid())
	}
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("%s=%q is neither off nor an absolute directory", Env, root)
	}
	ns, err := netnsID()
	if err != nil {
		return nil, err
	}
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil || len(boot) < 8 {
		return nil, fmt.Errorf("no boot ID: %v", err)
	}
	if err := os.MkdirAll(filepath.Dir(root), 0o755); err != nil {
		return nil, err
	}
	// The scope: this boot (a namespace cookie or inode number repeats
	// after a reboot, and /run may be on disk), this network namespace,
	// this address.
	j := &Journal{root: root, scope: filepath.Join(root, string(boot[:8])+"-"+ns+"_"+addr.String())}
	// The root may be readable by others (a directory the user named);
	// below it everything is the user's alone.
	if err := privateDir(root, 0o022); err != nil {
		return nil, err
	}
	if err := privateDir(j.scope, 0o077); err != nil {
		return nil, err
	}
	// The owner directory is made under a hidden name, locked, then
	// renamed: a scanner never sees an owner without its lock held.
	var rb [8]byte
	rand.Read(rb[:])
	name := hex.EncodeToString(rb[:])
	tmp := filepath.Join(j.scope, ".new-"+name)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(tmp, "lock"), os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err == nil {
		if err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
		}
	}
	if err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	j.dir, j.lock = filepath.Join(j.scope, name), f
	if err := os.Rename(tmp, j.dir); err != nil {
		f.Close()
		os.RemoveAll(tmp)
		return nil, err
	}
	return j, nil
}

// Dir returns the journal's owner directory.
func (j *Journal) Dir() string { return j.dir }

// Add records an established connection.
func (j *Journal) Add(r Record) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.shut {
		return errors.New("journal closed")
	}
	f, err := os.OpenFile(filepath.Join(j.dir, r.name()), os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(r.encode())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(filepath.Join(j.dir, r.name()))
	}
	return err
}

// Remove deletes an ended connection's record.
func (j *Journal) Remove(localID uint32) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if !j.shut {
		os.Remove(filepath.Join(j.dir, Record{LocalID: localID}.name()))
	}
}

// Close removes the owner directory (its connections ended or were told)
// and drops its lock.
func (j *Journal) Close() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.shut {
		return
	}
	j.shut = true
	// Records taken from dead owners and not sent yet (the manager
	// closed during their replay) stay, with the lock file: the next
	// manager of the address takes them as this dead owner's.
	if ents, err := os.ReadDir(j.dir); err == nil {
		pending := false
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), takenPrefix) {
				pending = true
			} else if e.Name() != "lock" {
				os.Remove(filepath.Join(j.dir, e.Name()))
			}
		}
		if pending {
			j.lock.Close()
			return
		}
	}
	os.RemoveAll(j.dir)
	j.lock.Close()
}

// takenPrefix starts the names of records taken from a dead owner, in the
// taker's directory until their DREQ is sent (Sent).
const takenPrefix = "taken-"

// Sent removes a record TakeDead returned: its DREQ went out.
func (j *Journal) Sent(r Record) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if !j.shut && r.file != "" {
		os.Remove(r.file)
	}
}

// TakeDead returns the records of the dead owners of the journal's scope:
// each owner whose lock this manager can take is dead (its process exited
// without closing its manager), and taking the lock makes this manager the
// one that speaks for it. The records move into this journal's directory
// until Sent removes each (a manager that closes before sending them all
// leaves the rest to the next one) and the dead owner's directory goes.
func (j *Journal) TakeDead() []Record {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.shut {
		return nil
	}
	var recs []Record
	ents, err := os.ReadDir(j.scope)
	if err != nil {
		return nil
	}
	own := filepath.Base(j.dir)
	for _, e := range ents {
		name := e.Name()
		if name == own || !e.IsDir() {
			continue
		}
		dir := filepath.Join(j.scope, name)
		if strings.HasPrefix(name, ".new-") {
			// A manager killed while it made its directory, or one
			// making it now (its lock held, or just created).
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Minute {
				if f, dead := lockIfDead(dir); dead {
					os.RemoveAll(dir)
					f.Close()
				}
			}
			continue
		}
		recs = j.takeOwner(dir, recs)
	}
	return recs
}

// lockIfDead takes the lock of owner directory dir if its owner is dead
// (the returned file holds it; the caller closes it) and reports whether
// it did. An owner directory without a lock file counts as dead once it
// is a minute old (an owner makes its lock before its directory shows).
func lockIfDead(dir string) (*os.File, bool) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		var st unix.Stat_t
		if errors.Is(err, os.ErrNotExist) && unix.Lstat(dir, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR &&
			time.Since(time.Unix(st.Mtim.Unix())) > time.Minute {
			f, err := os.Open(os.DevNull)
			return f, err == nil
		}
		return nil, false
	}
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		f.Close()
		return nil, false // alive
	}
	return f, true
}

// takeOwner takes the owner directory dir if its owner is dead: its
// records move into j's directory (appended to recs) and dir is removed.
// A live owner's directory is left alone. Called with j.mu held.
func (j *Journal) takeOwner(dir string, recs []Record) []Record {
	f, dead := lockIfDead(dir)
	if !dead {
		return recs
	}
	defer f.Close()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, ".cm") {
			continue
		}
		r, err := readRecord(filepath.Join(dir, name))
		// The name must be the record's own, or a taken one's.
		if err != nil || name != r.name() && !(strings.HasPrefix(name, takenPrefix) && strings.HasSuffix(name, "-"+r.name())) {
			continue
		}
		var rb [4]byte
		rand.Read(rb[:])
		to := filepath.Join(j.dir, takenPrefix+hex.EncodeToString(rb[:])+"-"+r.name())
		if os.Rename(filepath.Join(dir, name), to) == nil {
			r.file = to
			recs = append(recs, r)
		}
	}
	os.RemoveAll(dir)
	return recs
}

// readRecord reads one record file: a regular file (no symlink, no
// FIFO) of at most recordMax bytes.
func readRecord(path string) (Record, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return Record{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Record{}, err
	}
	if !st.Mode().IsRegular() || st.Size() > recordMax {
		return Record{}, errors.New("not a record file")
	}
	b, err := io.ReadAll(io.LimitReader(f, recordMax+1))
	if err != nil {
		return Record{}, err
	}
	return parseRecord(b)
}

// SweepOtherScopes removes the owners of other scopes (other boots,
// namespaces gone, addresses no longer used) found dead journalStaleScope
// ago or more — the first sweep that finds one dead marks it (deadSince);
// until the mark is that old a manager of its scope may still speak for
// it — and scopes left empty.
func (j *Journal) SweepOtherScopes() {
	scopes, err := os.ReadDir(j.root)
	if err != nil {
		return
	}
	for _, s := range scopes {
		dir := filepath.Join(j.root, s.Name())
		if dir == j.scope || !s.IsDir() {
			continue
		}
		owners, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		left := len(owners)
		for _, o := range owners {
			if !o.IsDir() {
				continue
			}
			odir := filepath.Join(dir, o.Name())
			f, dead := lockIfDead(odir)
			if !dead {
				continue
			}
			mark := filepath.Join(odir, deadSince)
			var st unix.Stat_t
			switch err := unix.Lstat(mark, &st); {
			case errors.Is(err, os.ErrNotExist):
				if m, err := os.OpenFile(mark, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600); err == nil {
					m.Close()
				}
			case err == nil && time.Since(time.Unix(st.Mtim.Unix())) >= journalStaleScope:
				os.RemoveAll(odir)
				left--
			}
			f.Close()
		}
		if left == 0 {
			if info, err := s.Info(); err == nil && time.Since(info.ModTime()) > time.Minute {
				os.Remove(dir) // fails (and does nothing) if an owner came in
			}
		}
	}
}

// Abandon drops the lock and leaves the records, as a killed process
// does: the next journal of the address takes them (tests stand for a
// kill with it).
func (j *Journal) Abandon() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if !j.shut {
		j.shut = true
		j.lock.Close()
	}
}

// Owner states, as OwnerState reports them.
const (
	// OwnerGone: no owner directory, or one without records (its
	// manager closed cleanly).
	OwnerGone = iota
	// OwnerAlive: the owner's lock is held (its process lives).
	OwnerAlive
	// OwnerDead: the lock is free and records remain: somebody must
	// send their DREQs.
	OwnerDead
)

// OwnerState reports whether the owner directory dir (Dir of a journal)
// is gone or empty, alive (its lock held), or dead with records left. It
// holds the dead owner's lock only while it looks.
func OwnerState(dir string) int {
	f, dead := lockIfDead(dir)
	if !dead {
		if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
			return OwnerGone
		}
		return OwnerAlive
	}
	defer f.Close()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".cm") {
			return OwnerDead
		}
	}
	return OwnerGone
}

// RootDir returns the root the journal lives under.
func (j *Journal) RootDir() string { return j.root }
