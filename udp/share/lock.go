//go:build linux

package share

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/gorocev2/rocev2/internal/netns"
	"golang.org/x/sys/unix"
)

// addrLock is an address's lock, held by one process at a time while it
// changes the group (joins, leaves, leases, listens, sweeps). It is two
// locks taken in this order:
//
//   - the lock file in Options.LockDir (flock), which /proc/locks names
//     the holder of, and which builds before this one take alone;
//   - a name in the abstract socket space of the group's network
//     namespace ("@rocev2-share/" and the group's key), bound by a Unix
//     socket of the holder. Every process of the namespace sees it,
//     whatever its mount namespace: processes on the host's network with
//     a /run of their own (containers) each locked a file nobody else
//     saw, and two joining at once took the same slot. The kernel frees
//     the name when the holder's socket closes, so a holder that dies
//     leaves no stale lock.
//
// Like the UDP port itself (bound without SO_REUSEPORT, it keeps the group
// from forming at all), the name can be held by any process of the
// namespace; a holder that keeps it past LockWait is named in the error.
type addrLock struct {
	f    *os.File
	sock int // the socket holding the name; -1 when it could not be had
}

// Close releases both locks.
func (l *addrLock) Close() {
	if l == nil {
		return
	}
	if l.sock >= 0 {
		unix.Close(l.sock)
		l.sock = -1
	}
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

// file is the lock file (for removeLock), nil when l is.
func (l *addrLock) file() *os.File {
	if l == nil {
		return nil
	}
	return l.f
}

// abstractLockName is the name of key's lock in the abstract socket space
// ('@' is its leading NUL for x/sys/unix).
func abstractLockName(key string) string { return "@rocev2-share/" + key }

// lockAddr takes the lock of the group key (lock file path), waiting at
// most LockWait for each of its two parts. inNetns, when not nil, runs a
// function in the group's network namespace (the calling thread may be in
// another one).
func lockAddr(path, key string, inNetns func(func() error) error) (*addrLock, error) {
	f, err := flock(path)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(LockWait)
	pause := 100 * time.Microsecond
	var pid int32 // the holder, when a try could tell
	for {
		sock, holder, err := tryAbstract(key, inNetns)
		if err != nil || holder == nil {
			return &addrLock{f: f, sock: sock}, nil
		}
		if holder.Pid > 0 {
			pid = holder.Pid
		}
		if time.Now().After(deadline) {
			f.Close()
			by := ""
			if pid > 0 {
				by = fmt.Sprintf(" by process %d", pid)
			}
			return nil, fmt.Errorf("%w: %s (abstract socket, the network namespace's lock) held%s for more than %v (a stopped or hung member of the group?)", ErrLockTimeout, abstractLockName(key), by, LockWait)
		}
		time.Sleep(pause)
		pause = min(2*pause, 10*time.Millisecond)
	}
}

// tryLockAddr is lockAddr without waiting: nil, nil when another process
// holds either part.
func tryLockAddr(path, key string, inNetns func(func() error) error) (*addrLock, error) {
	f, err := tryFlock(path)
	if err != nil || f == nil {
		return nil, err
	}
	sock, holder, err := tryAbstract(key, inNetns)
	if err == nil && holder != nil {
		f.Close()
		return nil, nil
	}
	return &addrLock{f: f, sock: sock}, nil
}

// tryAbstract binds key's abstract lock name. It returns the socket
// holding it, or the credentials of the process that holds it (Pid 0 when
// that process is not visible from here), or an error when the name cannot
// be used at all (the socket fails: the caller goes on with the lock file
// alone, as before the name existed).
func tryAbstract(key string, inNetns func(func() error) error) (int, *unix.Ucred, error) {
	sock := -1
	mk := func() (err error) {
		sock, err = unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
		return err
	}
	var err error
	if inNetns != nil {
		err = inNetns(mk)
	} else {
		err = mk()
	}
	if err != nil {
		return -1, nil, err
	}
	name := &unix.SockaddrUnix{Name: abstractLockName(key)}
	err = unix.Bind(sock, name)
	if err == nil {
		// Listening lets a waiter ask who holds it (SO_PEERCRED).
		unix.Listen(sock, 1)
		return sock, nil, nil
	}
	if !errors.Is(err, unix.EADDRINUSE) {
		unix.Close(sock)
		return -1, nil, err
	}
	// Held. Ask who holds it (SO_PEERCRED) on a connection from the same
	// socket, unbound and unconnected still, for the error that names the
	// holder; a holder between its bind and its listen, or with a full
	// queue, is not named.
	cred := &unix.Ucred{}
	if unix.Connect(sock, name) == nil {
		if c, err := unix.GetsockoptUcred(sock, unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			cred = c
		}
	}
	unix.Close(sock)
	return -1, cred, nil
}

// netnsRunner returns a function running its argument in the network
// namespace of the calling thread, opened now: at once when the thread it
// is called on is there, else through netns.Do (a thread switched in and
// back); nil when the namespace cannot be opened (the caller's threads
// are then taken to be in it). Close the returned file when done.
func netnsRunner() (func(func() error) error, *os.File) {
	ns, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, nil
	}
	var want unix.Stat_t
	if unix.Fstat(int(ns.Fd()), &want) != nil {
		ns.Close()
		return nil, nil
	}
	path := fmt.Sprintf("/proc/self/fd/%d", ns.Fd())
	return func(f func() error) error {
		runtime.LockOSThread() // the thread looked at is the one f runs on
		defer runtime.UnlockOSThread()
		var st unix.Stat_t
		if unix.Stat("/proc/thread-self/ns/net", &st) == nil && st.Ino == want.Ino && st.Dev == want.Dev {
			return f()
		}
		return netns.Do(path, f)
	}, ns
}
