//go:build linux

package udp

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// socketNetns is the network namespace of a link's socket, kept so that the
// send-only sockets a SocketLink opens later (SourcePorts) are created in
// the same namespace even when Send runs on a thread of another one — a
// program that opened the link from a thread it had moved into a namespace
// (setns) sends from ordinary goroutines afterwards.
type socketNetns struct {
	fd  int    // from ioctl SIOCGSKNS on the link's socket
	ino uint64 // its inode: namespaces compare equal by inode
}

// socketNetnsOf returns the namespace of socket fd, or nil when it cannot
// be had (SIOCGSKNS needs CAP_NET_ADMIN; without it the process cannot
// switch namespaces either, so every thread is in the socket's namespace).
func socketNetnsOf(fd int) *socketNetns {
	nsfd, err := unix.IoctlRetInt(fd, unix.SIOCGSKNS)
	if err != nil {
		return nil
	}
	unix.CloseOnExec(nsfd)
	var st unix.Stat_t
	if err := unix.Fstat(nsfd, &st); err != nil {
		unix.Close(nsfd)
		return nil
	}
	return &socketNetns{fd: nsfd, ino: st.Ino}
}

// close releases the namespace handle.
func (n *socketNetns) close() {
	if n != nil && n.fd >= 0 {
		unix.Close(n.fd)
		n.fd = -1
	}
}

// run calls f on an OS thread in namespace n: the current one when it is
// there already, else the current thread switched into n and back.
func (n *socketNetns) run(f func() error) error {
	if n == nil {
		return f()
	}
	runtime.LockOSThread()
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err == nil && st.Ino == n.ino {
		defer runtime.UnlockOSThread()
		return f()
	}
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open own network namespace: %w", err)
	}
	defer orig.Close()
	if err := unix.Setns(n.fd, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter the link's network namespace: %w", err)
	}
	ferr := f()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// Leave the thread locked: it exits with the goroutine instead of
		// running other goroutines in the wrong namespace.
		return ferr
	}
	runtime.UnlockOSThread()
	return ferr
}
