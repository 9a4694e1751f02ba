//go:build linux

package guardian

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorocev2/rocev2/internal/cmjournal"
	"github.com/gorocev2/rocev2/rdmacm"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

// Env is the environment variable that makes a process a guardian: set
// only by the manager that starts one ("parent PID,address,journal owner
// directory"); this package's init handles it and exits.
const Env = "ROCEV2_CM_GUARDIAN"

// Limit bounds a guardian's work once its parent is gone; DREPWait is how
// long it waits for the DREPs of the DREQs it sent (not sent again either
// way).
const (
	Limit    = 10 * time.Second
	DREPWait = time.Second
)

// exitWait bounds how long a guardian whose pipe ended while its
// parent's journal lock is still held waits for the parent to finish
// exiting (to be reparented) before it takes the parent for alive.
const exitWait = time.Second

// sharedFlush is how long a guardian on a shared address, which gets no
// DREP, keeps its socket after its DREQs were handed to it.
const sharedFlush = 100 * time.Millisecond

// A guardian's exit status says what it did.
const (
	ExitNothing = 0 // the parent's journal held no record: nothing to send
	ExitFailed  = 1 // its own work failed, or took longer than Limit
	ExitAlive   = 4 // the parent's journal lock is held: it lives; nothing sent
	ExitSent    = 5 // it sent the dead parent's DREQs
)

var enabled atomic.Bool

// deathSignal is the guardian's PR_SET_PDEATHSIG: one whose default
// action is to be ignored, since its parent may die before the guardian
// handles it (the pipe's end of file says so then).
const deathSignal = syscall.SIGWINCH

// Enable turns the guardian on (or off) for the connection managers
// started after it: each that keeps a journal starts one guardian process.
func Enable(on bool) {
	if on && enabled.CompareAndSwap(false, true) {
		rdmacm.SetJournalHook(start)
	} else if !on && enabled.CompareAndSwap(true, false) {
		rdmacm.SetJournalHook(nil)
	}
}

// proc is a running guardian, seen from its parent.
type proc struct {
	pid  int
	w    *os.File      // the parent's end of the pipe
	done chan struct{} // closed when it exited
	code int           // its exit status, once done
}

var (
	mu    sync.Mutex
	procs = map[string]*proc{} // by journal owner directory
	errs  = map[string]error{}
)

// PID returns the process ID of the guardian of the manager m, or 0 and
// why it has none.
func PID(m *rdmacm.Manager) (int, error) {
	dir, err := m.Journal()
	if err != nil {
		return 0, err
	}
	mu.Lock()
	defer mu.Unlock()
	if p := procs[dir]; p != nil {
		return p.pid, nil
	}
	if err := errs[dir]; err != nil {
		return 0, err
	}
	return 0, errNone
}

type errString string

func (e errString) Error() string { return string(e) }

const errNone = errString("guardian: none (not enabled when the manager started, or a guardian's own manager)")

// inGuardian: this process is a guardian; its manager starts none.
var inGuardian bool

// start is rdmacm's journal hook: it starts the guardian of the manager
// whose journal is dir, and returns what stops it (the manager's journal
// closed: the guardian finds nothing and exits).
func start(dir, root string, addr netip.Addr) func() {
	if inGuardian {
		return nil
	}
	p, err := spawn(dir, root, addr)
	mu.Lock()
	defer mu.Unlock()
	if err != nil {
		errs[dir] = errString("guardian: " + err.Error())
		return func() {
			mu.Lock()
			delete(errs, dir)
			mu.Unlock()
		}
	}
	procs[dir] = p
	return func() {
		p.w.Close()
		mu.Lock()
		delete(procs, dir)
		mu.Unlock()
	}
}

func spawn(dir, root string, addr netip.Addr) (*proc, error) {
	exe, err := os.Executable()
	if err != nil {
		exe = "rocev2-guardian"
	}
	r, w, err := os.Pipe() // both close-on-exec; r becomes the child's fd 3
	if err != nil {
		return nil, err
	}
	defer r.Close()
	// /proc/self/exe: the running binary even when its file was removed
	// or replaced (go run's, an upgrade).
	cmd := &exec.Cmd{Path: "/proc/self/exe", Args: []string{exe}}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, Env+"=") && !strings.HasPrefix(kv, rdmacm.JournalEnv+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, rdmacm.JournalEnv+"="+root, Env+"="+strconv.Itoa(os.Getpid())+","+addr.String()+","+dir)
	cmd.ExtraFiles = []*os.File{r}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: deathSignal}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, err
	}
	p := &proc{pid: cmd.Process.Pid, w: w, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		p.code = cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	return p, nil
}

func init() {
	spec, ok := os.LookupEnv(Env)
	if !ok {
		return
	}
	os.Unsetenv(Env)
	os.Exit(run(spec))
}

// logMax bounds the guardian log (LogName): a longer one starts again.
const logMax = 64 << 10

// LogName is the file under the journal's root where guardians that had
// something to do (send, or fail) append one line each: when, whose,
// what.
const LogName = "guardian.log"

// logLine appends a line to the guardian log of the journal root (the
// parent's, JournalEnv); best effort.
func logLine(format string, args ...any) {
	root := os.Getenv(rdmacm.JournalEnv)
	if !filepath.IsAbs(root) {
		return
	}
	name := filepath.Join(root, LogName)
	flags := os.O_WRONLY | os.O_CREATE | os.O_APPEND | syscall.O_NOFOLLOW | syscall.O_CLOEXEC
	if st, err := os.Lstat(name); err == nil && st.Size() > logMax {
		flags |= os.O_TRUNC
	}
	f, err := os.OpenFile(name, flags, 0o600)
	if err != nil {
		return
	}
	fmt.Fprintf(f, "%s guardian %d of %d: %s\n", time.Now().UTC().Format(time.RFC3339Nano), os.Getpid(), parentPID, fmt.Sprintf(format, args...))
	f.Close()
}

var parentPID int

// run is a guardian's life: spec is "parent PID,address,owner
// directory", fd 3 the pipe from its parent. It returns the exit status.
func run(spec string) int {
	inGuardian = true
	f := strings.SplitN(spec, ",", 3)
	if len(f) != 3 {
		return ExitFailed
	}
	ppid, err1 := strconv.Atoi(f[0])
	parentPID = ppid
	addr, err2 := netip.ParseAddr(f[1])
	dir := f[2]
	if err1 != nil || err2 != nil || !filepath.IsAbs(dir) {
		return ExitFailed
	}
	// A Ctrl-C or hang-up meant for the parent is not the guardian's;
	// SIGTERM (a shutdown) still ends it.
	signal.Ignore(syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGPIPE)
	death := make(chan os.Signal, 1)
	signal.Notify(death, deathSignal)
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
			// PR_SET_PDEATHSIG fires also when the parent's thread that
			// started the guardian exits: only a new parent means the
			// process went.
			gone = os.Getppid() != ppid
		}
	}
	pipe.Close()
	state := cmjournal.OwnerState(dir)
	if state == cmjournal.OwnerAlive {
		// A dying process closes its descriptors in their order: the
		// pipe's end of file may come while its journal lock is still
		// held. It is reparented only after all are closed: wait for
		// that (a parent that lives on and closed the pipe is not).
		for end := time.Now().Add(exitWait); os.Getppid() == ppid && time.Now().Before(end); {
			time.Sleep(5 * time.Millisecond)
		}
		if os.Getppid() != ppid {
			state = cmjournal.OwnerState(dir)
		}
	}
	switch state {
	case cmjournal.OwnerAlive:
		logLine("%v: the journal's owner lives (its lock is held): nothing sent", addr)
		return ExitAlive
	case cmjournal.OwnerGone:
		return ExitNothing
	}
	time.AfterFunc(Limit, func() {
		logLine("%v: not done within %v", addr, Limit)
		os.Exit(ExitFailed)
	})
	link, err := udp.ListenSocket(addr, nil)
	if err != nil {
		logLine("%v", err)
		return ExitFailed
	}
	dev, err := transport.NewDevice(link, transport.DeviceConfig{})
	if err != nil {
		link.Close()
		logLine("%v: %v", addr, err)
		return ExitFailed
	}
	defer dev.Close()
	m, err := rdmacm.NewManager(dev)
	if err != nil {
		logLine("%v: %v", addr, err)
		return ExitFailed
	}
	if _, err := m.Journal(); err != nil {
		logLine("%v: %v", addr, err)
		return ExitFailed
	}
	<-m.Replayed()
	wait := DREPWait
	if link.Shared() {
		// On a shared address the DREPs name the dead process's
		// communication IDs, which the steering program hands to that
		// gone member: none comes back. Only let the DREQs leave.
		wait = sharedFlush
	}
	for end := time.Now().Add(wait); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if s := m.Stats(); s.DREPForDead >= s.DREQForDead {
			break
		}
	}
	st := m.Stats()
	if st.DREQForDead == 0 {
		logLine("%v: nothing left to send (another manager of the address spoke first)", addr)
		return ExitNothing
	}
	logLine("%v: sent %d DREQs for the dead process, %d DREPs back", addr, st.DREQForDead, st.DREPForDead)
	return ExitSent
}
