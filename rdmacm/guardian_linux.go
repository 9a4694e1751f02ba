//go:build linux

package rdmacm

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorocev2/rocev2/internal/cmjournal"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

// GuardianEnv is the environment variable that makes a process started
// from a binary linking this package a guardian (SetGuardian) instead of
// running its main: the package's init handles it and exits. It is set
// only by the manager that starts the guardian.
const GuardianEnv = "ROCEV2_CM_GUARDIAN"

// Guardian exit statuses (what it did).
const (
	guardianNothing = 0 // the manager closed cleanly: no records left
	guardianFailed  = 1 // its own work failed (or took too long)
	guardianAlive   = 4 // the owner's lock is held: its process lives
	guardianSent    = 5 // it sent the dead owner's DREQs
)

// guardianLimit bounds a guardian's work once its parent is gone;
// guardianDREPWait is how long it waits for the DREPs of the DREQs it
// sent (they are not sent again either way).
const (
	guardianLimit    = 10 * time.Second
	guardianDREPWait = time.Second
)

var guardianOn atomic.Bool

// inGuardian is set in a guardian process: its manager starts no
// guardian of its own.
var inGuardian bool

// SetGuardian turns the guardian on (or off) for the connection managers
// started after it. A manager with a connection journal (JournalEnv)
// then starts a guardian: a child process (this binary again, selected
// by GuardianEnv in this package's init) in its own process group that
// holds nothing but a pipe to its parent and waits, with no network
// activity, until the parent is gone (the pipe's end of file, or
// PR_SET_PDEATHSIG). If the parent died without closing the manager —
// killed with SIGKILL, crashed — its journal's lock is free and records
// remain: the guardian opens a socket on the manager's address and sends
// each recorded connection's DREQ, as the next manager on the address
// would (Stats.DREQForDead, paced the same), waits briefly for the DREPs
// and exits; within guardianLimit in any case. After a clean close it
// exits at once, and it never sends for a live owner (the journal's
// flock). Off by default; the rocev2d commands that run rdma_cm turn it
// on. Linux only (elsewhere it does nothing).
func SetGuardian(on bool) { guardianOn.Store(on) }

// guardian is a manager's guardian process, seen from the manager.
type guardian struct {
	pid  int
	w    *os.File      // the parent's end of the pipe: closed at shutdown
	done chan struct{} // closed when the guardian exited (Wait returned)
	code int           // its exit status, once done
}

// startGuardian starts m's guardian (SetGuardian); a failure leaves the
// manager without one (Guardian says why).
func (m *Manager) startGuardian() {
	if !guardianOn.Load() || inGuardian || m.jr == nil {
		return
	}
	g, err := spawnGuardian(m.jr, m.dev.Addr())
	if err != nil {
		m.guardianErr = fmt.Errorf("rdmacm: guardian: %w", err)
		return
	}
	m.guard = g
}

func spawnGuardian(j *cmjournal.Journal, addr netip.Addr) (*guardian, error) {
	exe, err := os.Executable()
	if err != nil {
		exe = "rocev2-guardian"
	}
	r, w, err := os.Pipe() // both close-on-exec; r is passed as fd 3
	if err != nil {
		return nil, err
	}
	defer r.Close()
	// /proc/self/exe: the running binary even when its file was removed
	// or replaced (go run, an upgrade).
	cmd := &exec.Cmd{Path: "/proc/self/exe", Args: []string{exe}}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, GuardianEnv+"=") && !strings.HasPrefix(kv, JournalEnv+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, JournalEnv+"="+j.RootDir(),
		GuardianEnv+"="+strconv.Itoa(os.Getpid())+","+addr.String()+","+j.Dir())
	cmd.ExtraFiles = []*os.File{r}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGUSR2}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, err
	}
	g := &guardian{pid: cmd.Process.Pid, w: w, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		g.code = cmd.ProcessState.ExitCode()
		close(g.done)
	}()
	return g, nil
}

// stopGuardian tells m's guardian that the manager is gone (its journal
// closed first: the guardian finds nothing to send and exits).
func (m *Manager) stopGuardian() {
	if m.guard != nil {
		m.guard.w.Close()
	}
}

// Guardian returns the process ID of the manager's guardian
// (SetGuardian), or 0 and why it has none.
func (m *Manager) Guardian() (int, error) {
	if m.guard != nil {
		return m.guard.pid, nil
	}
	if m.guardianErr != nil {
		return 0, m.guardianErr
	}
	return 0, errors.New("rdmacm: no guardian (SetGuardian off, no connection journal, or a guardian's own manager)")
}

func init() {
	spec, ok := os.LookupEnv(GuardianEnv)
	if !ok {
		return
	}
	os.Unsetenv(GuardianEnv)
	os.Exit(runGuardian(spec))
}

// runGuardian is a guardian's life: spec is "ppid,address,owner
// directory", fd 3 the pipe from its parent. It returns the exit status.
func runGuardian(spec string) int {
	inGuardian = true
	f := strings.SplitN(spec, ",", 3)
	if len(f) != 3 {
		return guardianFailed
	}
	ppid, err1 := strconv.Atoi(f[0])
	addr, err2 := netip.ParseAddr(f[1])
	dir := f[2]
	if err1 != nil || err2 != nil || !filepath.IsAbs(dir) {
		return guardianFailed
	}
	// A Ctrl-C or hang-up meant for the parent is not ours; SIGTERM
	// (a shutdown) still ends the guardian.
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGPIPE)
	death := make(chan os.Signal, 1)
	signal.Notify(death, syscall.SIGUSR2)
	pipe := os.NewFile(3, "guardian-pipe")
	eof := make(chan struct{})
	go func() {
		io.Copy(io.Discard, pipe)
		close(eof)
	}()
	for gone := false; !gone; {
		select {
		case <-eof:
			gone = true
		case <-death:
			// PR_SET_PDEATHSIG also fires when the parent's thread that
			// started us exits: only a new parent means the process went.
			gone = os.Getppid() != ppid
		}
	}
	pipe.Close()
	switch cmjournal.OwnerState(dir) {
	case cmjournal.OwnerAlive:
		return guardianAlive
	case cmjournal.OwnerGone:
		return guardianNothing
	}
	time.AfterFunc(guardianLimit, func() { os.Exit(guardianFailed) })
	link, err := udp.ListenSocket(addr, nil)
	if err != nil {
		return guardianFailed
	}
	dev, err := transport.NewDevice(link, transport.DeviceConfig{})
	if err != nil {
		link.Close()
		return guardianFailed
	}
	defer dev.Close()
	m, err := NewManager(dev)
	if err != nil || m.jr == nil {
		return guardianFailed
	}
	select {
	case <-m.replayed:
	case <-m.down:
		return guardianFailed
	}
	for end := time.Now().Add(guardianDREPWait); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		m.mu.Lock()
		n := len(m.deadSent)
		m.mu.Unlock()
		if n == 0 {
			break
		}
	}
	if m.Stats().DREQForDead == 0 {
		return guardianNothing // a restarted manager spoke first
	}
	return guardianSent
}
