//go:build linux

// Package load checks that a flow with no fault on its path survives a
// machine loaded with CPU-bound processes, with the library's defaults,
// and that the counters say why any retry happened (docs/LIVENESS.md).
package load

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

// spinEnv makes the test binary a CPU-bound child: it spins until killed.
// peerEnv makes it the flow's responder (runPeer) on the address it holds.
const (
	spinEnv = "ROCEV2_LOAD_SPIN"
	peerEnv = "ROCEV2_LOAD_PEER"
)

func TestMain(m *testing.M) {
	if a := os.Getenv(peerEnv); a != "" {
		if err := runPeer(netip.MustParseAddr(a)); err != nil {
			fmt.Fprintln(os.Stderr, "peer:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv(spinEnv) != "" {
		runtime.GOMAXPROCS(1)
		x := uint64(1)
		for {
			x = x*6364136223846793005 + 1442695040888963407
			if x == 0 {
				fmt.Println(x) // never; keeps the loop from being optimized out
			}
		}
	}
	os.Exit(m.Run())
}

// startSpinners starts n CPU-bound child processes (this binary with
// spinEnv) and kills them, by PID, at cleanup.
func startSpinners(t *testing.T, n int) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var procs []*os.Process
	t.Cleanup(func() {
		for _, p := range procs {
			p.Kill()
			p.Wait()
		}
	})
	for range n {
		c := exec.Command(exe, "-test.run=^$")
		c.Env = append(os.Environ(), spinEnv+"=1")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, c.Process)
	}
}

// end is one side of the flow: a device on its own SocketLink, one RC QP.
type end struct {
	link *udp.SocketLink
	dev  *transport.Device
	pd   *memreg.PD
	scq  *transport.CQ
	rcq  *transport.CQ
	qp   *transport.QP
}

const (
	msgSize = 64 << 10 // bytes per work request
	slots   = 32       // message slots in each buffer
	depth   = 16       // work requests outstanding
)

// newEnd opens a SocketLink and a device on addr, both with their
// defaults, and an RC QP.
func newEnd(addr netip.Addr) (*end, error) {
	l, err := udp.ListenSocket(addr, nil) // the default socket options
	if err != nil {
		return nil, err
	}
	dev, err := transport.NewDevice(l, transport.DeviceConfig{}) // the default device
	if err != nil {
		l.Close()
		return nil, err
	}
	e := &end{link: l, dev: dev}
	if e.pd, err = dev.AllocPD(); err == nil {
		if e.scq, err = dev.CreateCQ(4 * depth); err == nil {
			if e.rcq, err = dev.CreateCQ(4 * slots); err == nil {
				e.qp, err = dev.CreateQP(e.pd, transport.QPInitAttr{Type: transport.QPTypeRC, SendCQ: e.scq, RecvCQ: e.rcq,
					MaxSendWR: 2 * depth, MaxRecvWR: 2 * slots, MaxSGE: 1})
			}
		}
	}
	if err != nil {
		dev.Close()
		return nil, err
	}
	return e, nil
}

// connect connects e's QP to the peer's QP qpn at peerAddr with the
// default retry attributes (transport.DefaultRetry).
func (e *end) connect(peerAddr netip.Addr, qpn, sq, rq uint32) error {
	return e.qp.Connect(transport.ConnParams{Peer: peerAddr, DestQPN: qpn, SQPSN: sq, RQPSN: rq,
		PathMTU: transport.MTU4096, Access: memreg.AccessRemoteWrite | memreg.AccessRemoteRead}) // Retry nil: DefaultRetry
}

func (e *end) register(buf []byte) (*memreg.MR, error) {
	return e.pd.RegisterMR(buf, memreg.AccessLocalWrite|memreg.AccessRemoteWrite|memreg.AccessRemoteRead)
}

// pattern returns the bytes both processes expect: slots messages from a
// fixed seed.
func pattern() []byte {
	b := make([]byte, slots*msgSize)
	rand.NewChaCha8([32]byte{'r', 'o', 'c', 'e', 'v', '2', 'l', 'o', 'a', 'd'}).Read(b)
	return b
}

// runPeer is the responder process: it opens its end on addr, prints
// "qpn iova rkey" of its WRITE target / READ source, reads "qpn sends"
// (the requester's QPN and how many SENDs of msgSize follow), connects,
// posts receives and prints "ready", checks every SEND against pattern,
// and prints "ok" and its counters; it exits when stdin closes.
func runPeer(addr netip.Addr) error {
	e, err := newEnd(addr)
	if err != nil {
		return err
	}
	defer e.dev.Close()
	want := pattern()
	dst := make([]byte, len(want))
	rbuf := make([]byte, len(want))
	dstMR, err := e.register(dst)
	if err != nil {
		return err
	}
	rbufMR, err := e.register(rbuf)
	if err != nil {
		return err
	}
	fmt.Printf("%d %d %d\n", e.qp.QPN(), dstMR.IOVA(), dstMR.RKey())
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadString('\n')
	if err != nil {
		return err
	}
	var qpn uint32
	var msgs int
	if _, err := fmt.Sscanf(line, "%d %d", &qpn, &msgs); err != nil {
		return fmt.Errorf("parse %q: %w", line, err)
	}
	if err := e.connect(netip.MustParseAddr(os.Getenv("ROCEV2_LOAD_REQUESTER")), qpn, 0x200, 0x100); err != nil {
		return err
	}
	posted := 0
	for ; posted < slots && posted < msgs; posted++ {
		if err := e.qp.PostRecv(recvWR(rbufMR, posted)); err != nil {
			return err
		}
	}
	fmt.Println("ready")
	wc := make([]transport.WC, slots)
	for got := 0; got < msgs; {
		k, err := e.rcq.Wait(context.Background(), wc)
		if err != nil {
			return fmt.Errorf("receive %d of %d: %w", got, msgs, err)
		}
		for _, c := range wc[:k] {
			if c.Status != transport.WCSuccess {
				return fmt.Errorf("receive %d: %v", got, c.Err())
			}
			s := got % slots
			if !bytes.Equal(rbuf[s*msgSize:(s+1)*msgSize], want[s*msgSize:(s+1)*msgSize]) {
				return fmt.Errorf("SEND %d: data differs", got)
			}
			got++
			if posted < msgs {
				if err := e.qp.PostRecv(recvWR(rbufMR, posted%slots)); err != nil {
					return err
				}
				posted++
			}
		}
	}
	c, st := e.dev.Counters(), e.link.Stats()
	fmt.Printf("ok link_drop_kernel %d duplicate_request %d out_of_seq_request %d local_ack_timeout_err %d ack_timeout_late %d; link %+v; %+v\n",
		st.DropKernel, c.DuplicateRequest, c.OutOfSeqRequest, c.LocalAckTimeout, c.AckTimeoutLate, st, nonZero(c))
	io.Copy(io.Discard, in) // until the requester is done
	return nil
}

// startPeer starts runPeer in a child process on addrB for a requester on
// addrA and returns its first line's fields, a line reader and stdin.
func startPeer(t *testing.T, addrA, addrB netip.Addr) (fields []string, lines <-chan string, stdin io.WriteCloser) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := exec.Command(exe, "-test.run=^$")
	c.Env = append(os.Environ(), peerEnv+"="+addrB.String(), "ROCEV2_LOAD_REQUESTER="+addrA.String())
	var stderr bytes.Buffer
	c.Stderr = &stderr
	stdin, err = c.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			c.Process.Kill()
			<-exited
		}
		if stderr.Len() > 0 {
			t.Logf("peer stderr: %s", stderr.String())
		}
	})
	ch := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			ch <- sc.Text()
		}
		close(ch)
		c.Wait()
		close(exited)
	}()
	select {
	case l, ok := <-ch:
		if !ok {
			<-exited
			if strings.Contains(stderr.String(), syscall.EADDRINUSE.Error()) && os.Getenv("CI") != "true" {
				t.Skipf("LOUD SKIP: UDP %v:4791 is taken by another process: %s", addrB, stderr.String())
			}
			t.Fatalf("peer exited: %s", stderr.String())
		}
		return strings.Fields(l), ch, stdin
	case <-time.After(30 * time.Second):
		t.Fatal("no answer from the peer process in 30 s")
	}
	return nil, nil, nil
}

// TestFlowUnderCPULoad moves data with WRITE, READ and SEND between two
// processes — this one, the requester, and a child, the responder — each
// with a device on a kernel UDP socket on loopback, with the defaults
// (socket buffers, DefaultRetry: timeout 14 ≈ 67 ms, retry_cnt 7),
// while 2 × NumCPU CPU-bound processes run. The flow must survive: every
// work request completes successfully and every byte arrives (the READs
// bring back what the WRITEs placed; the responder checks every SEND).
// The counters must account for any retransmission: the requester's
// local_ack_timeout_err and ack_timeout_late, each socket's
// link_drop_kernel, and the responder's duplicate_request (a resent packet
// whose original had arrived: the timeout was a delay, not a loss) and
// out_of_seq_request (a gap: a loss). The byte count is 96 MiB (24 MiB
// with -short; ROCEV2_LOAD_MIB sets it), the busy processes 2 × NumCPU
// (ROCEV2_LOAD_SPINNERS sets it).
func TestFlowUnderCPULoad(t *testing.T) {
	total := int64(96 << 20)
	if testing.Short() {
		total = 24 << 20
	}
	if s := os.Getenv("ROCEV2_LOAD_MIB"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			total = int64(n) << 20
		}
	}
	spinners := 2 * runtime.NumCPU()
	if raceEnabled {
		// The race detector slows both processes several times over:
		// that is the load; spinners on top (with CI running other
		// packages' tests beside) measure nothing but the machine.
		spinners = 0
		t.Log("-race: no CPU-bound processes (the race detector's slowdown is the load); run without -race for the 2 x NumCPU check")
	}
	if s := os.Getenv("ROCEV2_LOAD_SPINNERS"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n >= 0 {
			spinners = n
		}
	}
	per := total / 3
	msgs := int(per / msgSize)
	addrA, addrB := netip.MustParseAddr("127.0.0.121"), netip.MustParseAddr("127.0.0.122")

	a, err := newEnd(addrA)
	if errors.Is(err, syscall.EADDRINUSE) && os.Getenv("CI") != "true" {
		t.Skipf("LOUD SKIP: UDP %v:4791 is taken by another process: %v", addrA, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.dev.Close() })
	src := pattern()
	srcMR, err := a.register(src)
	if err != nil {
		t.Fatal(err)
	}
	back := make([]byte, len(src)) // READ destination
	backMR, err := a.register(back)
	if err != nil {
		t.Fatal(err)
	}

	startSpinners(t, spinners)
	f, lines, stdin := startPeer(t, addrA, addrB)
	if len(f) != 3 {
		t.Fatalf("peer said %q", f)
	}
	qpn, _ := strconv.ParseUint(f[0], 10, 32)
	iova, _ := strconv.ParseUint(f[1], 10, 64)
	rkey, _ := strconv.ParseUint(f[2], 10, 32)
	remote := remoteMR{iova: iova, rkey: uint32(rkey)}
	if err := a.connect(addrB, uint32(qpn), 0x100, 0x200); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(stdin, "%d %d\n", a.qp.QPN(), msgs)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	next := func() string {
		select {
		case l := <-lines:
			return l
		case <-ctx.Done():
			t.Fatal("peer: no answer")
		}
		return ""
	}
	if l := next(); l != "ready" {
		t.Fatalf("peer said %q, want ready", l)
	}
	peerSays := "(no report)"
	report := func() string {
		c, st := a.dev.Counters(), a.link.Stats()
		return fmt.Sprintf("requester: local_ack_timeout_err %d ack_timeout_late %d retry_exceeded_err %d retransmitted_pkts %d link_drop_kernel %d (link %+v; %v); responder: %s",
			c.LocalAckTimeout, c.AckTimeoutLate, c.RetryExceededErr, c.RetransmittedPkts, st.DropKernel, st, nonZero(c), peerSays)
	}
	start := time.Now()
	for _, op := range []transport.WROpcode{transport.WRWrite, transport.WRRead, transport.WRSend} {
		t0 := time.Now()
		if err := move(ctx, a, op, msgs, srcMR, backMR, remote); err != nil {
			t.Fatalf("%v under %d CPU-bound processes: %v\n%s", op, spinners, err, report())
		}
		if op == transport.WRRead && !bytes.Equal(back, src) {
			t.Fatalf("READ brought back other bytes than the WRITEs placed")
		}
		t.Logf("%v: %d MiB in %v", op, per>>20, time.Since(t0).Round(time.Millisecond))
	}
	l := next()
	if !strings.HasPrefix(l, "ok ") {
		t.Fatalf("peer: %q", l)
	}
	peerSays = strings.TrimPrefix(l, "ok ")
	t.Logf("%d MiB in %v under %d CPU-bound processes on %d CPUs; %s", 3*per>>20, time.Since(start).Round(time.Millisecond),
		spinners, runtime.NumCPU(), report())
	// Attribution: every resend follows an ACK timeout (spent or late)
	// or a gap the responder NAKed (out_of_seq_request). A resent packet
	// whose original had arrived is a duplicate_request: the timeout was
	// a delay. A gap is a kernel drop (link_drop_kernel on the receiving
	// socket) or, with none, reordering: loopback delivers through the
	// sending CPU's backlog, so a sender moved between CPUs mid-burst can
	// reorder (seen once in about 20 runs: 2 gaps, no drops); logged.
	var pDrops, pDup, pOOS uint64
	fmt.Sscanf(peerSays, "link_drop_kernel %d duplicate_request %d out_of_seq_request %d", &pDrops, &pDup, &pOOS)
	c, st := a.dev.Counters(), a.link.Stats()
	if c.RetransmittedPkts > 0 && c.LocalAckTimeout+c.AckTimeoutLate == 0 && pOOS == 0 {
		t.Errorf("%d packets resent with no ACK timeout and no gap counted", c.RetransmittedPkts)
	}
	if pOOS > 0 && pDrops+st.DropKernel == 0 {
		t.Logf("the responder NAKed %d gaps and no socket dropped anything: reordering on loopback", pOOS)
	}
	if c.RetryExceededErr != 0 {
		t.Errorf("retry_exceeded_err %d", c.RetryExceededErr)
	}
}

// remoteMR is the responder's WRITE target / READ source.
type remoteMR struct {
	iova uint64
	rkey uint32
}

// move posts msgs work requests op of msgSize, depth outstanding, slot by
// slot: WRITE and SEND from src, READ from the remote region into back.
func move(ctx context.Context, a *end, op transport.WROpcode, msgs int, srcMR, backMR *memreg.MR, r remoteMR) error {
	wc := make([]transport.WC, depth)
	posted, done := 0, 0
	for done < msgs {
		for posted < msgs && posted-done < depth {
			off := uint64(posted%slots) * msgSize
			wr := transport.SendWR{WRID: uint64(posted), Opcode: op, Flags: transport.SendSignaled}
			switch op {
			case transport.WRRead:
				wr.SGEs = []memreg.SGE{{Addr: backMR.IOVA() + off, Length: msgSize, LKey: backMR.LKey()}}
				wr.RemoteAddr, wr.RKey = r.iova+off, r.rkey
			default:
				wr.SGEs = []memreg.SGE{{Addr: srcMR.IOVA() + off, Length: msgSize, LKey: srcMR.LKey()}}
				if op == transport.WRWrite {
					wr.RemoteAddr, wr.RKey = r.iova+off, r.rkey
				}
			}
			if err := a.qp.PostSend(wr); err != nil {
				return fmt.Errorf("post %d: %w", posted, err)
			}
			posted++
		}
		k, err := a.scq.Wait(ctx, wc)
		if err != nil {
			return fmt.Errorf("waiting for wr %d: %w", done, err)
		}
		for _, c := range wc[:k] {
			if c.Status != transport.WCSuccess || c.WRID != uint64(done) {
				return fmt.Errorf("completion %d: wr %d %v", done, c.WRID, c.Err())
			}
			done++
		}
	}
	return nil
}

func recvWR(mr *memreg.MR, slot int) transport.RecvWR {
	return transport.RecvWR{WRID: uint64(slot), SGEs: []memreg.SGE{{Addr: mr.IOVA() + uint64(slot*msgSize), Length: msgSize, LKey: mr.LKey()}}}
}

// nonZero lists the counters that are not 0.
func nonZero(c transport.Counters) string {
	var b strings.Builder
	for _, kv := range c.List() {
		if kv.Value != 0 {
			fmt.Fprintf(&b, "%s %d ", kv.Name, kv.Value)
		}
	}
	return strings.TrimSpace(b.String())
}
