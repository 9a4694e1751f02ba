//go:build linux

// Package share_test runs many processes on one address (SocketOptions.Share):
// child processes (this test binary, re-executed) each open a shared link on
// the same 127.0.x.y:4791 and a device with a few RC QPs; the parent is the
// peer on another address, sends every QP its own data and checks the
// echo. Each child checks that every packet it received was for its QPs
// and that the steering program's count of packets handed to it equals
// what its link received.
package share_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/share"
)

const childEnv = "ROCEV2_SHARE_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv("CHILD_PRIVATE_BPFFS") != "" {
		// As `ip netns exec` does: a mount namespace of its own (made by
		// the parent) in which /sys/fs/bpf is not the host's bpffs.
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			fmt.Println("FAIL make / private:", err)
			os.Exit(1)
		}
		if err := unix.Mount("tmpfs", "/sys/fs/bpf", "tmpfs", 0, ""); err != nil {
			fmt.Println("FAIL hide /sys/fs/bpf:", err)
			os.Exit(1)
		}
	}
	switch os.Getenv(childEnv) {
	case "":
	case "nocaps":
		os.Exit(childNoCaps())
	case "cm":
		os.Exit(childCM())
	case "active":
		os.Exit(childActive())
	case "flood":
		os.Exit(childFlood())
	default:
		os.Exit(child())
	}
	os.Exit(m.Run())
}

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("sharing an address needs root (CAP_BPF, CAP_NET_ADMIN); CI=true: not skipping")
		}
		t.Skip("SKIPPED LOUDLY: sharing an address needs root (CAP_BPF, CAP_NET_ADMIN)")
	}
}

// testAddrs returns two loopback addresses unique to this process.
func testAddrs(n byte) []netip.Addr {
	id := os.Getpid()
	out := make([]netip.Addr, n)
	for i := range out {
		out[i] = netip.AddrFrom4([4]byte{127, byte(100 + i), byte(id >> 8), byte(id)})
	}
	return out
}

// Parameters of a run, passed to the children in the environment.
const (
	msgSize = 8 << 10 // 8 packets at MTU 1024
	qpsPer  = 4
)

// pattern fills b with the bytes of message j on QP q of child c.
func pattern(b []byte, c, q, j int) {
	for i := range b {
		b[i] = byte(c*31 + q*7 + j*3 + i + i>>8)
	}
}

func check(b []byte, c, q, j int) error {
	for i := range b {
		if want := byte(c*31 + q*7 + j*3 + i + i>>8); b[i] != want {
			return fmt.Errorf("child %d qp %d msg %d byte %d = %#x, want %#x", c, q, j, i, b[i], want)
		}
	}
	return nil
}

// side is one process's device with its QPs and memory.
type side struct {
	link *udp.SocketLink
	dev  *transport.Device
	pd   *memreg.PD
	cq   *transport.CQ
	qps  []*transport.QP
	buf  []byte
	mr   *memreg.MR
}

func newSide(addr netip.Addr, nqp, msgs int, o udp.SocketOptions) (*side, error) {
	l, err := udp.ListenSocket(addr, &o)
	if err != nil {
		return nil, err
	}
	dev, err := transport.NewDevice(l, transport.DeviceConfig{})
	if err != nil {
		l.Close()
		return nil, err
	}
	s := &side{link: l, dev: dev}
	if s.pd, err = dev.AllocPD(); err != nil {
		return s, err
	}
	if s.cq, err = dev.CreateCQ(nqp * msgs * 2); err != nil {
		return s, err
	}
	s.buf = make([]byte, nqp*msgs*msgSize*2)
	if s.mr, err = s.pd.RegisterMR(s.buf, memreg.AccessLocalWrite); err != nil {
		return s, err
	}
	for range nqp {
		qp, err := dev.CreateQP(s.pd, transport.QPInitAttr{Type: transport.QPTypeRC, SendCQ: s.cq, RecvCQ: s.cq,
			MaxSendWR: msgs, MaxRecvWR: msgs})
		if err != nil {
			return s, err
		}
		s.qps = append(s.qps, qp)
	}
	return s, nil
}

func (s *side) close() {
	if s.dev != nil {
		s.dev.Close()
	}
}

// recvSlot is where receive j of QP q lands; sendSlot the send buffer.
func (s *side) recvSlot(q, j, msgs int) int { return (q*msgs + j) * msgSize }
func (s *side) sendSlot(q, j, msgs int) int { return (len(s.qps)*msgs + q*msgs + j) * msgSize }

// testRetry tolerates a loaded machine (-race, 9 processes on 2 cores):
// local ACK timeout 17 (~0.5 s), 7 retries.
var testRetry = transport.Retry{Timeout: 17, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12}

func (s *side) connect(q int, peer netip.Addr, dest uint32) error {
	return s.qps[q].Connect(transport.ConnParams{Peer: peer, DestQPN: dest, SQPSN: 100, RQPSN: 100, PathMTU: transport.MTU1024, Retry: &testRetry})
}

func (s *side) postRecvs(q, msgs int) error {
	for j := range msgs {
		if err := s.qps[q].PostRecv(transport.RecvWR{WRID: uint64(q<<16 | j),
			SGEs: []memreg.SGE{s.mr.SGE(uint64(s.recvSlot(q, j, msgs)), msgSize)}}); err != nil {
			return err
		}
	}
	return nil
}

func (s *side) postSends(q, msgs int) error {
	for j := range msgs {
		if err := s.qps[q].PostSend(transport.SendWR{WRID: uint64(1<<32 | q<<16 | j), Opcode: transport.WRSend,
			Flags: transport.SendSignaled, SGEs: []memreg.SGE{s.mr.SGE(uint64(s.sendSlot(q, j, msgs)), msgSize)}}); err != nil {
			return err
		}
	}
	return nil
}

// wait waits for n completions and returns how many were receives.
func (s *side) wait(ctx context.Context, n int) (recvs int, err error) {
	wc := make([]transport.WC, 64)
	for got := 0; got < n; {
		k, err := s.cq.Wait(ctx, wc)
		if err != nil {
			return recvs, fmt.Errorf("after %d of %d completions: %w", got, n, err)
		}
		for _, w := range wc[:k] {
			if err := w.Err(); err != nil {
				return recvs, err
			}
			if w.WRID>>32 == 0 {
				recvs++
			}
		}
		got += k
	}
	return recvs, nil
}

// child is one sharing process: it prints its QPNs, reads the peer's,
// receives msgs messages per QP, checks them, echoes them and reports
// its counters.
func child() int {
	var s *side
	fail := func(f string, a ...any) int {
		msg := fmt.Sprintf(f, a...)
		if s != nil {
			ss := s.link.ShareStats()
			msg += fmt.Sprintf(" (steered %d rcvd %d misrouted %d unknownqp %d)", ss.Steered, s.link.Stats().RcvdPkts, ss.Misrouted, s.dev.Counters().UnknownQP)
		}
		fmt.Println("FAIL " + msg)
		return 1
	}
	idx, _ := strconv.Atoi(os.Getenv("CHILD_INDEX"))
	msgs, _ := strconv.Atoi(os.Getenv("CHILD_MSGS"))
	addr := netip.MustParseAddr(os.Getenv("CHILD_ADDR"))
	peer := netip.MustParseAddr(os.Getenv("CHILD_PEER"))
	mode := udp.ShareOn
	if os.Getenv("CHILD_NOSHARE") != "" {
		mode = udp.ShareOff
	}
	tw := 200 * time.Millisecond
	if v, err := time.ParseDuration(os.Getenv("CHILD_TIMEWAIT")); err == nil {
		tw = v
	}
	s0, err := newSide(addr, qpsPer, msgs, udp.SocketOptions{Share: mode, ShareTimeWait: tw})
	if err != nil {
		return fail("%v", err)
	}
	s = s0
	defer s.close()
	var line strings.Builder
	fmt.Fprint(&line, "QPN")
	for _, qp := range s.qps {
		fmt.Fprintf(&line, " %d", qp.QPN())
	}
	fmt.Println(line.String())
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() {
		return fail("no peer line")
	}
	f := strings.Fields(in.Text())
	if len(f) != qpsPer+1 || f[0] != "PEER" {
		return fail("peer line %q", in.Text())
	}
	for q := range s.qps {
		d, _ := strconv.Atoi(f[q+1])
		if err := s.connect(q, peer, uint32(d)); err != nil {
			return fail("connect: %v", err)
		}
		if err := s.postRecvs(q, msgs); err != nil {
			return fail("post recv: %v", err)
		}
	}
	fmt.Println("READY")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := s.wait(ctx, qpsPer*msgs); err != nil {
		return fail("receive: %v", err)
	}
	for q := range s.qps {
		for j := range msgs {
			o := s.recvSlot(q, j, msgs)
			if err := check(s.buf[o:o+msgSize], idx, q, j); err != nil {
				return fail("%v", err)
			}
			copy(s.buf[s.sendSlot(q, j, msgs):], s.buf[o:o+msgSize])
		}
		if err := s.postSends(q, msgs); err != nil {
			return fail("post send: %v", err)
		}
	}
	if _, err := s.wait(ctx, qpsPer*msgs); err != nil {
		return fail("echo: %v", err)
	}
	fmt.Println("SENT")
	// Wait for the parent's word: then no more packets come.
	if !in.Scan() || in.Text() != "REPORT" {
		return fail("no REPORT line")
	}
	ss := s.link.ShareStats()
	st := s.link.Stats()
	fmt.Printf("DONE steered=%d rcvd=%d misrouted=%d unknownqp=%d badicrc=%d slot=%d\n",
		ss.Steered, st.RcvdPkts, ss.Misrouted, s.dev.Counters().UnknownQP, st.DropBadICRC, ss.Slot)
	in.Scan() // EXIT or EOF
	return 0
}

// proc is a running child.
type proc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
	qpn []uint32
}

func startChild(t testing.TB, idx int, addr, peer netip.Addr, msgs int, noShare bool) *proc {
	t.Helper()
	return startChildMode(t, "data", idx, addr, peer, msgs, noShare)
}

// privateMounts starts the next children in mount namespaces of their own
// that do not see the host's bpffs (set by a test, not in parallel).
var privateMounts bool

func startChildMode(t testing.TB, mode string, idx int, addr, peer netip.Addr, msgs int, noShare bool) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, "CHILD_INDEX="+strconv.Itoa(idx), "CHILD_MSGS="+strconv.Itoa(msgs),
		"CHILD_ADDR="+addr.String(), "CHILD_PEER="+peer.String())
	if noShare {
		cmd.Env = append(cmd.Env, "CHILD_NOSHARE=1")
	}
	if privateMounts {
		cmd.Env = append(cmd.Env, "CHILD_PRIVATE_BPFFS=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	t.Cleanup(func() {
		p.in.Close()
		done := make(chan struct{})
		go func() { p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-done
		}
	})
	return p
}

// expect reads the child's next line, which must start with prefix.
func (p *proc) expect(t testing.TB, prefix string) []string {
	t.Helper()
	if !p.out.Scan() {
		t.Fatalf("child %d: no %s line (exited?)", p.cmd.Process.Pid, prefix)
	}
	f := strings.Fields(p.out.Text())
	if len(f) == 0 || f[0] != prefix {
		t.Fatalf("child %d: %q, want %s", p.cmd.Process.Pid, p.out.Text(), prefix)
	}
	return f[1:]
}

func (p *proc) say(t testing.TB, s string) {
	t.Helper()
	if _, err := io.WriteString(p.in, s+"\n"); err != nil {
		t.Fatal(err)
	}
}

// exchange runs the traffic of children procs with the parent side par:
// msgs messages to every child QP and the echo back, all data checked.
// It returns the time from the first send to the last echo.
func exchange(t testing.TB, par *side, procs []*proc, addrs []netip.Addr, msgs int) time.Duration {
	t.Helper()
	for c, p := range procs {
		f := p.expect(t, "QPN")
		if len(f) != qpsPer {
			t.Fatalf("child %d QPN line %v", c, f)
		}
		line := "PEER"
		for q := range qpsPer {
			n, _ := strconv.Atoi(f[q])
			p.qpn = append(p.qpn, uint32(n))
			pq := c*qpsPer + q
			line += " " + strconv.Itoa(int(par.qps[pq].QPN()))
			if err := par.connect(pq, addrs[c], uint32(n)); err != nil {
				t.Fatal(err)
			}
			if err := par.postRecvs(pq, msgs); err != nil {
				t.Fatal(err)
			}
		}
		p.say(t, line)
	}
	for _, p := range procs {
		p.expect(t, "READY")
	}
	start := time.Now()
	for c := range procs {
		for q := range qpsPer {
			pq := c*qpsPer + q
			for j := range msgs {
				pattern(par.buf[par.sendSlot(pq, j, msgs):][:msgSize], c, q, j)
			}
			if err := par.postSends(pq, msgs); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	recvs, err := par.wait(ctx, 2*len(procs)*qpsPer*msgs)
	if err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	if recvs != len(procs)*qpsPer*msgs {
		t.Fatalf("%d echoes, want %d", recvs, len(procs)*qpsPer*msgs)
	}
	for c := range procs {
		for q := range qpsPer {
			pq := c*qpsPer + q
			for j := range msgs {
				o := par.recvSlot(pq, j, msgs)
				if err := check(par.buf[o:o+msgSize], c, q, j); err != nil {
					t.Fatalf("echo: %v", err)
				}
			}
		}
	}
	for _, p := range procs {
		p.expect(t, "SENT")
	}
	return elapsed
}

// report collects the children's counters.
func report(t testing.TB, procs []*proc) []map[string]uint64 {
	t.Helper()
	var out []map[string]uint64
	for c, p := range procs {
		p.say(t, "REPORT")
		f := p.expect(t, "DONE")
		m := map[string]uint64{}
		for _, kv := range f {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseUint(v, 10, 64)
			m[k] = n
		}
		t.Logf("child %d: %v", c, f)
		out = append(out, m)
	}
	return out
}

// TestEightProcessesOneAddress: 8 processes x 4 QPs on one address.
func TestEightProcessesOneAddress(t *testing.T) {
	needRoot(t)
	const nproc = 8
	msgs := 16
	if testing.Short() {
		msgs = 4
	}
	a := testAddrs(2)
	shared, peer := a[0], a[1]
	par, err := newSide(peer, nproc*qpsPer, msgs, udp.SocketOptions{Share: udp.ShareOff})
	if err != nil {
		t.Fatal(err)
	}
	defer par.close()
	t.Cleanup(func() { share.Remove(netip.AddrPortFrom(shared, udp.Port), "") })
	var procs []*proc
	addrs := make([]netip.Addr, nproc)
	for c := range nproc {
		procs = append(procs, startChild(t, c, shared, peer, msgs, false))
		addrs[c] = shared
	}
	exchange(t, par, procs, addrs, msgs)

	// Packets to QPNs nobody owns: dropped and counted, exactly.
	const stray = 25
	sendStray(t, par.link, shared, stray)
	time.Sleep(100 * time.Millisecond)
	reps := report(t, procs)
	st, err := share.ReadStatus(netip.AddrPortFrom(shared, udp.Port), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Members) != nproc {
		t.Errorf("status lists %d members, want %d", len(st.Members), nproc)
	}
	if st.Counters.UnownedQPN != stray {
		t.Errorf("unowned-QPN drops %d, want %d", st.Counters.UnownedQPN, stray)
	}
	slots := map[uint64]bool{}
	for c, r := range reps {
		if r["misrouted"] != 0 || r["unknownqp"] != 0 || r["badicrc"] != 0 {
			t.Errorf("child %d received packets not for it: %v", c, r)
		}
		if r["steered"] != r["rcvd"] {
			t.Errorf("child %d: steered %d != received %d", c, r["steered"], r["rcvd"])
		}
		// At least every data packet: msgs messages x 8 packets per QP.
		if min := uint64(qpsPer * msgs * msgSize / 1024); r["rcvd"] < min {
			t.Errorf("child %d received %d packets, want >= %d", c, r["rcvd"], min)
		}
		slots[r["slot"]] = true
		for _, m := range st.Members {
			if uint64(m.Slot) == r["slot"] && m.Steered != r["steered"] {
				t.Errorf("child %d: status says steered %d, child %d", c, m.Steered, r["steered"])
			}
		}
	}
	if len(slots) != nproc {
		t.Errorf("children share slots: %v", slots)
	}
}

// sendStray sends n datagrams over l to QPNs in a range nobody leases.
func sendStray(t testing.TB, l *udp.SocketLink, dst netip.Addr, n int) {
	t.Helper()
	pkts := make([]udp.Packet, n)
	for i := range pkts {
		b := make([]byte, 12+4+4)
		b[0] = 0x04 // RC SEND only
		b[2], b[3] = 0xff, 0xff
		q := uint32(0xfff000 + i)
		b[5], b[6], b[7] = byte(q>>16), byte(q>>8), byte(q)
		pkts[i] = udp.Packet{Buf: b, Addr: dst}
	}
	if err := l.Send(pkts); err != nil {
		t.Fatal(err)
	}
}

// TestPrivateMountNamespaces: processes that do not see each other's pins
// (each in a mount namespace of its own, as `ip netns exec` makes them)
// still form one group: a newcomer finds the live group by its ident map.
func TestPrivateMountNamespaces(t *testing.T) {
	needRoot(t)
	a := testAddrs(18)
	shared, peer := a[16], a[17]
	par, err := newSide(peer, 3*qpsPer, 4, udp.SocketOptions{Share: udp.ShareOff})
	if err != nil {
		t.Fatal(err)
	}
	defer par.close()
	t.Cleanup(func() { share.Remove(netip.AddrPortFrom(shared, udp.Port), "") })
	privateMounts = true
	var procs []*proc
	for c := range 3 {
		procs = append(procs, startChild(t, c, shared, peer, 4, false))
	}
	privateMounts = false
	exchange(t, par, procs, []netip.Addr{shared, shared, shared}, 4)
	for c, r := range report(t, procs) {
		if r["misrouted"] != 0 || r["steered"] != r["rcvd"] || r["rcvd"] == 0 {
			t.Errorf("child %d: %v", c, r)
		}
	}
}
