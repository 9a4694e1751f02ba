//go:build linux

package guardian

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/internal/netns"
	"github.com/gorocev2/rocev2/rdmacm"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

// guardianChildEnv selects TestGuardianChild's role ("kill", "clean",
// "live"); guardianPeerEnv and guardianLocalEnv its addresses.
const (
	guardianChildEnv = "ROCEV2_TEST_GUARDIAN_CHILD"
	guardianPeerEnv  = "ROCEV2_TEST_GUARDIAN_PEER"
	guardianLocalEnv = "ROCEV2_TEST_GUARDIAN_LOCAL"
)

// TestChild is the process TestGuardian starts (in its own
// network namespace): a manager with a guardian and one connection to the
// test's peer, which it then leaves as its role says.
func TestChild(t *testing.T) {
	mode := os.Getenv(guardianChildEnv)
	if mode == "" {
		t.Skip("the child process of TestGuardian")
	}
	Enable(true)
	l, err := udp.ListenSocket(netip.MustParseAddr(os.Getenv(guardianLocalEnv)), &udp.SocketOptions{Share: udp.ShareOff})
	if err != nil {
		t.Fatal(err)
	}
	dev, err := transport.NewDevice(l, transport.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	opts := fast
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rdmacm.Dial(ctx, dev, netip.AddrPortFrom(netip.MustParseAddr(os.Getenv(guardianPeerEnv)), 4420), &opts); err != nil {
		t.Fatal(err)
	}
	m := rdmacm.ManagerOf(dev)
	pid, err := PID(m)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("established guardian %d\n", pid)
	dir, _ := m.Journal()
	mu.Lock()
	g := procs[dir]
	mu.Unlock()
	switch mode {
	case "clean":
		m.Close() // the farewell DREQ, the journal emptied, the pipe closed
	case "live":
		g.w.Close() // the guardian told its parent went; the lock still held
	}
	if mode != "kill" {
		<-g.done
		fmt.Printf("guardian exit %d\n", g.code)
	}
	if mode == "live" {
		io.Copy(io.Discard, os.Stdin) // until the test has looked
		m.Close()
		fmt.Println("closed")
	}
	time.Sleep(time.Minute) // until the test kills this process
}

// TestGuardian: a process whose manager has a guardian (Enable)
// and one established connection to a peer (keep-alive off, so that only
// a DREQ can end it) is killed with SIGKILL and not restarted: its
// guardian sends the DREQ the process could not, and the peer's Conn ends
// with rdmacm.ErrDisconnected (CausePeerDisconnect). A manager closed cleanly
// leaves its guardian nothing to send (exit 0, no stray DREQ at the
// peer); a guardian told its parent went while the parent's journal lock
// is held (the process lives) sends nothing (exit 4, the connection
// stays).
func TestGuardian(t *testing.T) {
	netns.Require(t)
	p := netns.TestPair(t, netns.PairConfig{Prefix: "rdmacm-gd", IfPrefix: "gd",
		AddrA: netip.MustParseAddr("192.0.2.1"), AddrB: netip.MustParseAddr("192.0.2.2"),
		MACA: "02:00:00:00:0d:01", MACB: "02:00:00:00:0d:02"})
	root := t.TempDir()
	l := netns.MustGet(t, p.NsB, func() (*udp.SocketLink, error) {
		return udp.ListenSocket(p.AddrB, &udp.SocketOptions{Share: udp.ShareOff})
	})
	db, err := transport.NewDevice(l, transport.DeviceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ln, err := rdmacm.Listen(db, 4420, &rdmacm.ListenOptions{Options: fast})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	acc := acceptAll(t, ln)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// child starts the child process in role mode and returns it, its
	// output and the peer's side of its connection.
	child := func(mode string) (*exec.Cmd, io.WriteCloser, *bufio.Scanner, *rdmacm.Conn) {
		cmd := exec.Command("ip", "netns", "exec", p.NsA, exe, "-test.run=^TestChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), guardianChildEnv+"="+mode, guardianPeerEnv+"="+p.AddrB.String(),
			guardianLocalEnv+"="+p.AddrA.String(), rdmacm.JournalEnv+"="+root)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		sc := bufio.NewScanner(out)
		if !scanFor(sc, "established guardian ") {
			t.Fatalf("%s child: no connection", mode)
		}
		select {
		case c := <-acc:
			return cmd, in, sc, c
		case <-time.After(10 * time.Second):
			t.Fatalf("%s child: the peer accepted nothing", mode)
		}
		return nil, nil, nil, nil
	}
	guardianExit := func(mode string, sc *bufio.Scanner) string {
		if !scanFor(sc, "guardian exit ") {
			t.Fatalf("%s child: its guardian's exit not reported", mode)
		}
		return strings.TrimPrefix(sc.Text(), "guardian exit ")
	}

	// live: the guardian sees its pipe end while the owner lives.
	cmd, in, sc, srv := child("live")
	if code := guardianExit("live", sc); code != fmt.Sprint(ExitAlive) {
		t.Errorf("live owner: guardian exit %s, want %d (owner alive, nothing sent)", code, ExitAlive)
	}
	select {
	case <-srv.Done():
		t.Errorf("live owner: the peer's connection ended: %v", srv.Err())
	case <-time.After(100 * time.Millisecond):
	}
	in.Close() // the child closes its manager (the peer told) and exits
	if !scanFor(sc, "closed") {
		t.Fatal("live child: did not close")
	}
	<-srv.Done()
	cmd.Process.Kill()
	cmd.Wait()

	// clean: Manager.Close tells the peer; the guardian finds nothing.
	cmd, _, sc, srv = child("clean")
	if code := guardianExit("clean", sc); code != fmt.Sprint(ExitNothing) {
		t.Errorf("clean close: guardian exit %s, want %d (nothing to send)", code, ExitNothing)
	}
	<-srv.Done()
	cmd.Process.Kill()
	cmd.Wait()
	stray := rdmacm.StatsOf(db).StrayDREQ

	// kill: SIGKILL with the connection established, no restart.
	cmd, _, _, srv = child("kill")
	cmd.Process.Kill()
	cmd.Wait()
	select {
	case <-srv.Done():
	case <-time.After(Limit):
		t.Fatal("the killed process's guardian did not send its DREQ (keep-alive is off: the connection would stay)")
	}
	if !errors.Is(srv.Err(), rdmacm.ErrDisconnected) {
		t.Errorf("killed process: the peer's connection ended with %v, want rdmacm.ErrDisconnected", srv.Err())
	}
	// The guardian's own counter, in its log: one DREQ for the dead
	// (DREQForDead). (Its socket joins the address's sharing group where
	// the host allows it, and then the DREP is steered to the dead
	// member: not counted.)
	var log []byte
	for end := time.Now().Add(Limit); time.Now().Before(end) && !strings.Contains(string(log), "sent 1 DREQs"); time.Sleep(10 * time.Millisecond) {
		log, _ = os.ReadFile(filepath.Join(root, LogName))
	}
	if !strings.Contains(string(log), "sent 1 DREQs for the dead process") {
		t.Errorf("guardian log:\n%s", log)
	}
	s := rdmacm.StatsOf(db)
	if s.Ended[rdmacm.CausePeerDisconnect] != 3 || s.StrayDREQ != stray || stray != 0 {
		t.Errorf("peer: Ended[CausePeerDisconnect] %d (want 3: two closes' and the guardian's), StrayDREQ %d then %d (want 0)",
			s.Ended[rdmacm.CausePeerDisconnect], stray, s.StrayDREQ)
	}
}

// scanFor reads lines until one starts with prefix (false at the end).
func scanFor(sc *bufio.Scanner, prefix string) bool {
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), prefix) {
			return true
		}
	}
	return false
}

// fast: quick CM retries, keep-alive off (only a DREQ can end a
// connection).
var fast = rdmacm.Options{ResponseTimeout: 20 * time.Millisecond, MaxRetries: 15, KeepAlive: -1}

// acceptAll accepts every connection of l into the returned channel
// until the test ends.
func acceptAll(t *testing.T, l *rdmacm.Listener) <-chan *rdmacm.Conn {
	ch := make(chan *rdmacm.Conn, 8)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		for {
			c, err := l.Accept(ctx)
			if err != nil {
				return
			}
			ch <- c
		}
	}()
	return ch
}
