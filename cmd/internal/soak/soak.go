package soak

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/rdmacm"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

// soak: connections that live as long as applications do (issue 26). A
// server process and client processes on loopback, every one a rocev2d
// child of this one: clients connect through the CM, exchange verified
// messages for a while, disconnect and connect again; the parent kills
// clients with SIGKILL and starts them again (churn), kills and restarts
// the server, and drops packets. Then it kills every client and checks
// that the server reclaimed everything (keep-alive finds the dead peers):
// QPs, CM connections, goroutines, descriptors, heap.

func init() {
	commands.Register("soak", "long-running churn test: CM clients killed and restarted against a server on loopback", soakUsage, runSoak)
	commands.Register("soak-server", "the server process of soak (started by soak)", soakChildUsage, runSoakServer)
	commands.Register("soak-client", "a client process of soak (started by soak)", soakChildUsage, runSoakClient)
}

const soakUsage = `usage: rocev2d soak [options]

Runs a server and --clients client processes (rocev2d soak-server and
soak-client, children of this process) on loopback addresses 127.B.C.x
derived from this process's ID. Each client connects to the server through
the CM (rdmacm), exchanges SEND messages of random sizes that the server
echoes (every byte checked on both sides), disconnects after a random
while and connects again. Every --churn the parent kills a random client
with SIGKILL and starts it again; --server-restarts times during the run it
kills the server with SIGKILL and starts it again. Every process drops
--loss of the packets it sends (a lossy wrapper around its socket link).
A restarted client takes the next address of its own range, so the
server's connections to the killed one end by keep-alive (a process
restarted on its old address would send their DREQs from the connection
journal, rdmacm.JournalEnv; soak leaves that path to rdmacm's tests). Its
children run without rocev2d's guardian (ROCEV2D_GUARDIAN=off, which the
parent sets): what soak checks is that keep-alive finds dead peers, and a
killed server's guardian would hold its address as it restarts.

At the end every client is killed and none is restarted (no DREQ: the
server must find its dead peers by keep-alive) and the server's resources
are compared with its start: QPs and CM connections must be back where
they were, goroutines within 4 and open descriptors within 2 of it (the
Go runtime's own come and go), the heap within 2x + 16 MiB. It prints a
table of both samples, connections made and failed, reconnect latency
p50/p99 and bytes checked, and fails (exit 1) on a data mismatch, on
growth, or when nothing connected. A run cut short by SIGINT or SIGTERM
(before --duration, or while it waits for the server's reaping) prints
what ran and INTERRUPTED, not PASS, and exits 1.

options:
  --duration=DUR       how long to run (default 1m)
  --clients=N          client processes (default 4, at most 32)
  --churn=DUR          kill and restart a random client this often (default 2s; 0: never)
  --server-restarts=N  kill and restart the server N times, evenly spread (default 1)
  --loss=F             fraction of packets each process drops on send (default 0.01)
  --keepalive=DUR      the connections' keep-alive interval (default 500ms)
  --keepalive-timeout=DUR  their probe timeout (default 1s)
  -v                   print the children's event lines
`

const soakChildUsage = `usage: rocev2d soak-server|soak-client [options]

The server and client processes of rocev2d soak, which starts them; see
rocev2d help soak.
`

// soakConfig is what the parent passes on to its children too.
type soakConfig struct {
	duration         time.Duration
	clients          int
	churn            time.Duration
	serverRestarts   int
	loss             float64
	keepAlive, kaTO  time.Duration
	verbose          bool
	addr, server     netip.Addr // children: own address, the server's
	port             int
	seed             uint64
	statusEvery      time.Duration
	responseTimeout  time.Duration
	maxConnLifeMilli int
}

func parseSoakFlags(name string, args []string) (*soakConfig, error) {
	c := &soakConfig{}
	fs := cli.NewFlagSet(name)
	fs.DurationVar(&c.duration, "duration", time.Minute, "")
	fs.IntVar(&c.clients, "clients", 4, "")
	fs.DurationVar(&c.churn, "churn", 2*time.Second, "")
	fs.IntVar(&c.serverRestarts, "server-restarts", 1, "")
	fs.Float64Var(&c.loss, "loss", 0.01, "")
	fs.DurationVar(&c.keepAlive, "keepalive", 500*time.Millisecond, "")
	fs.DurationVar(&c.kaTO, "keepalive-timeout", time.Second, "")
	fs.BoolVar(&c.verbose, "v", false, "")
	var addr, server string
	fs.StringVar(&addr, "addr", "", "")
	fs.StringVar(&server, "server", "", "")
	fs.IntVar(&c.port, "port", 7900, "")
	fs.Uint64Var(&c.seed, "seed", 0, "")
	fs.DurationVar(&c.statusEvery, "status-every", 500*time.Millisecond, "")
	fs.DurationVar(&c.responseTimeout, "cm-timeout", 200*time.Millisecond, "")
	fs.IntVar(&c.maxConnLifeMilli, "max-conn-ms", 800, "")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if c.clients < 1 || c.clients > 32 {
		return nil, fmt.Errorf("--clients %d out of range 1..32", c.clients)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
		zero bool // 0 allowed
	}{{"duration", c.duration, false}, {"churn", c.churn, true}, {"keepalive", c.keepAlive, false},
		{"keepalive-timeout", c.kaTO, false}, {"status-every", c.statusEvery, false}, {"cm-timeout", c.responseTimeout, false}} {
		if d.v < 0 || (d.v == 0 && !d.zero) {
			return nil, fmt.Errorf("--%s=%v: want a duration above 0", d.name, d.v)
		}
	}
	switch {
	case c.serverRestarts < 0:
		return nil, fmt.Errorf("--server-restarts %d: negative", c.serverRestarts)
	case c.maxConnLifeMilli < 1:
		return nil, fmt.Errorf("--max-conn-ms %d: want 1 or more", c.maxConnLifeMilli)
	case c.port < 1 || c.port > 65535:
		return nil, fmt.Errorf("--port %d: out of range 1..65535", c.port)
	}
	if c.loss < 0 || c.loss >= 0.5 {
		return nil, fmt.Errorf("--loss %v out of range [0, 0.5)", c.loss)
	}
	var err error
	if addr != "" {
		if c.addr, err = cli.ParseIP("--addr", addr, ""); err != nil {
			return nil, err
		}
	}
	if server != "" {
		if c.server, err = cli.ParseIP("--server", server, "--port"); err != nil {
			return nil, err
		}
	}
	// The children need their addresses: soak gives them; a user who
	// runs one by hand learns which.
	switch {
	case name == "soak-server" && !c.addr.IsValid():
		return nil, errors.New("--addr (the server's address) is required; soak-server is started by `rocev2d soak`, which gives it")
	case name == "soak-client" && (!c.addr.IsValid() || !c.server.IsValid()):
		return nil, errors.New("--addr (the client's address) and --server (the server's) are required; soak-client is started by `rocev2d soak`, which gives them")
	}
	return c, nil
}

// childArgs are the flags a child gets from the parent's configuration.
func (c *soakConfig) childArgs() []string {
	return []string{"--port", strconv.Itoa(c.port), "--loss", strconv.FormatFloat(c.loss, 'g', -1, 64),
		"--keepalive", c.keepAlive.String(), "--keepalive-timeout", c.kaTO.String(),
		"--status-every", c.statusEvery.String(), "--cm-timeout", c.responseTimeout.String(),
		"--max-conn-ms", strconv.Itoa(c.maxConnLifeMilli)}
}

// soakNet returns 127.B.C.0 for this process: distinct per process ID, so
// that soaks (and tests) of concurrent processes do not meet.
func soakNet() [4]byte {
	p := os.Getpid()
	return [4]byte{127, byte(40 + p%200), byte(1 + (p/200)%200), 0}
}

// soakServerAddr and soakClientAddr place the server at .1 of the
// process's net and incarnation k of client i at 127.B.(C+1+i).(2+k%250).
func soakServerAddr(n [4]byte) netip.Addr { n[3] = 1; return netip.AddrFrom4(n) }

func soakClientAddr(n [4]byte, i, k int) netip.Addr {
	n[2] += byte(1 + i)
	n[3] = byte(2 + k%250)
	return netip.AddrFrom4(n)
}

// lossyLink drops a fraction of the packets sent, at random. It moves
// packets whole (zero-copy ones too: udp.Wrap.PassPayload).
type lossyLink struct {
	udp.Wrap // forwards the wrapped link's capabilities
	loss     float64
	mu       sync.Mutex
	rng      *rand.Rand
	dropped  atomic.Uint64
}

// Unwrap returns the wrapped link (a device looks through it for a shared
// socket link's QPN leases).
func (l *lossyLink) Unwrap() udp.Link { return l.Link }

func (l *lossyLink) Send(pkts []udp.Packet) error {
	if l.loss <= 0 {
		return l.Link.Send(pkts)
	}
	l.mu.Lock()
	drop := -1
	for i := range pkts {
		if l.rng.Float64() < l.loss {
			drop = i
			break
		}
	}
	l.mu.Unlock()
	if drop < 0 {
		return l.Link.Send(pkts)
	}
	// Send around the dropped packet (rare: allocation is fine).
	keep := make([]udp.Packet, 0, len(pkts))
	keep = append(keep, pkts[:drop]...)
	l.mu.Lock()
	for i := drop + 1; i < len(pkts); i++ {
		if l.rng.Float64() >= l.loss {
			keep = append(keep, pkts[i])
		} else {
			l.dropped.Add(1)
		}
	}
	l.mu.Unlock()
	l.dropped.Add(1)
	if len(keep) == 0 {
		return nil
	}
	return l.Link.Send(keep)
}

// soakDevice opens the child's device on addr behind a lossy link.
func soakDevice(c *soakConfig, addr netip.Addr) (*transport.Device, error) {
	sl, err := cli.ListenSocket(addr, udp.SocketOptions{}, "soak picks 127.B.C.x addresses from its process ID")
	if err != nil {
		return nil, err
	}
	var link udp.Link = sl
	if c.loss > 0 {
		link = &lossyLink{Wrap: udp.Wrap{Link: sl, PassPayload: true}, loss: c.loss, rng: rand.New(rand.NewPCG(c.seed, uint64(os.Getpid())))}
	}
	dev, err := transport.NewDevice(link, transport.DeviceConfig{})
	if err != nil {
		link.Close()
		return nil, err
	}
	return dev, nil
}

// Message sizes and the echo protocol: message k of connection (seed,
// conn) has length soakLen and content soakFill; the server checks it and
// sends it back, the client checks the echo.
const soakMaxMsg = 4096

func soakHash(seed, conn, k uint64) uint64 {
	x := seed ^ conn*0x9e3779b97f4a7c15 ^ k*0xbf58476d1ce4e5b9
	x ^= x >> 31
	x *= 0x94d049bb133111eb
	x ^= x >> 29
	return x
}

func soakLen(seed, conn, k uint64) int { return 8 + int(soakHash(seed, conn, k)%(soakMaxMsg-8+1)) }

func soakFill(b []byte, seed, conn, k uint64) {
	binary.BigEndian.PutUint64(b, k)
	h := soakHash(seed, conn, k)
	for i := 8; i < len(b); i++ {
		b[i] = byte(h >> (8 * (i & 7)))
		if i&7 == 7 {
			h = h*6364136223846793005 + 1442695040888963407
		}
	}
}

// soakCheck reports whether b is message k of (seed, conn).
func soakCheck(b []byte, seed, conn, k uint64, scratch []byte) bool {
	n := soakLen(seed, conn, k)
	if len(b) != n {
		return false
	}
	soakFill(scratch[:n], seed, conn, k)
	return string(b) == string(scratch[:n])
}

// soakStatus is a server's resource sample.
type soakStatus struct {
	goroutines, fds, qps, conns int
	heap                        uint64
	bytes                       uint64
	mismatches                  uint64
}

func (s soakStatus) line() string {
	return fmt.Sprintf("status goroutines=%d heap=%d fds=%d qps=%d conns=%d bytes=%d mismatches=%d",
		s.goroutines, s.heap, s.fds, s.qps, s.conns, s.bytes, s.mismatches)
}

func parseSoakStatus(line string) (soakStatus, bool) {
	if !strings.HasPrefix(line, "status ") {
		return soakStatus{}, false
	}
	var s soakStatus
	for _, f := range strings.Fields(line)[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		n, _ := strconv.ParseUint(v, 10, 64)
		switch k {
		case "goroutines":
			s.goroutines = int(n)
		case "heap":
			s.heap = n
		case "fds":
			s.fds = int(n)
		case "qps":
			s.qps = int(n)
		case "conns":
			s.conns = int(n)
		case "bytes":
			s.bytes = n
		case "mismatches":
			s.mismatches = n
		}
	}
	return s, true
}

// openFDs counts the process's open descriptors (-1 where /proc is not).
func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents)
}

func sampleSoak(dev *transport.Device, bytes, bad uint64) soakStatus {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return soakStatus{goroutines: runtime.NumGoroutine(), heap: ms.HeapAlloc, fds: openFDs(),
		qps: dev.Resources().QPs, conns: int(rdmacm.StatsOf(dev).Conns), bytes: bytes, mismatches: bad}
}

func soakOptions(c *soakConfig) rdmacm.Options {
	return rdmacm.Options{KeepAlive: c.keepAlive, KeepAliveTimeout: c.kaTO, ResponseTimeout: c.responseTimeout,
		MaxSendWR: 16, MaxRecvWR: 16, CQDepth: 64}
}

// soakSlots is how many receives each side keeps posted (the client's
// window is half of it, so the server never runs out).
const soakSlots = 8

// runSoakServer accepts connections and echoes every message after
// checking it. It prints a status line every --status-every.
func runSoakServer(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseSoakFlags("soak-server", args)
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d soak-server: %v\n", err)
		return cli.ExitUsage
	}
	dev, err := soakDevice(c, c.addr)
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d soak-server: %v\n", err)
		return cli.ExitFail
	}
	defer dev.Close()
	var bytes, bad atomic.Uint64
	out := &lockedLines{w: stdout}
	lo := rdmacm.ListenOptions{Options: soakOptions(c)}
	l, err := rdmacm.Listen(dev, uint16(c.port), &lo)
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d soak-server: %v\n", err)
		return cli.ExitFail
	}
	defer l.Close()
	// The baseline: listening, before anything connects (the status
	// goroutine below counts in it).
	started := make(chan struct{})
	go func() {
		close(started)
		t := time.NewTicker(c.statusEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				out.println(sampleSoak(dev, bytes.Load(), bad.Load()).line())
			}
		}
	}()
	<-started
	out.println(sampleSoak(dev, 0, 0).line())
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := l.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return cli.ExitOK
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := soakEcho(ctx, conn)
			bytes.Add(n)
			if errors.Is(err, errSoakMismatch) {
				bad.Add(1)
				out.println(fmt.Sprintf("MISMATCH server: %v", err))
			}
		}()
	}
}

var errSoakMismatch = errors.New("data mismatch")

// soakEcho serves one connection until it ends: every received message
// is checked and sent back. It returns the bytes checked.
func soakEcho(ctx context.Context, conn *rdmacm.Conn) (uint64, error) {
	defer conn.Close()
	pd := conn.PD()
	pd0 := conn.PeerPrivateData()
	if len(pd0) < 16 {
		return 0, errors.New("no seed in the private data")
	}
	seed, cn := binary.BigEndian.Uint64(pd0), binary.BigEndian.Uint64(pd0[8:])
	buf := make([]byte, soakSlots*soakMaxMsg)
	mr, err := pd.RegisterMR(buf, memreg.AccessLocalWrite)
	if err != nil {
		return 0, err
	}
	defer mr.Deregister()
	qp := conn.QP()
	for i := 0; i < soakSlots; i++ {
		if err := qp.PostRecv(transport.RecvWR{WRID: uint64(i), SGEs: []memreg.SGE{mr.SGE(uint64(i*soakMaxMsg), soakMaxMsg)}}); err != nil {
			return 0, err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-conn.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	// The send CQ is drained by its own goroutine: a slot's receive is
	// posted again once its echo is sent.
	var total uint64
	scratch := make([]byte, soakMaxMsg)
	sendDone := make(chan error, 1)
	go func() {
		wcs := make([]transport.WC, soakSlots)
		for {
			n, err := conn.SendCQ().Wait(ctx, wcs)
			if err != nil {
				sendDone <- err
				return
			}
			for _, wc := range wcs[:n] {
				if wc.Status != transport.WCSuccess {
					sendDone <- wc.Err()
					return
				}
				i := wc.WRID
				if err := qp.PostRecv(transport.RecvWR{WRID: i, SGEs: []memreg.SGE{mr.SGE(i*soakMaxMsg, soakMaxMsg)}}); err != nil {
					sendDone <- err
					return
				}
			}
		}
	}()
	wcs := make([]transport.WC, soakSlots)
	next := uint64(0)
	for {
		n, err := conn.RecvCQ().Wait(ctx, wcs)
		if err != nil {
			return total, nil // the connection ended
		}
		for _, wc := range wcs[:n] {
			if wc.Status != transport.WCSuccess {
				return total, nil // flushed: the connection ended
			}
			i := wc.WRID
			msg := buf[i*soakMaxMsg : i*soakMaxMsg+uint64(wc.ByteLen)]
			if !soakCheck(msg, seed, cn, next, scratch) {
				return total, fmt.Errorf("%w: connection %#x/%d message %d (%d bytes)", errSoakMismatch, seed, cn, next, wc.ByteLen)
			}
			total += uint64(wc.ByteLen)
			next++
			if err := qp.PostSendContext(ctx, transport.SendWR{WRID: i, Opcode: transport.WRSend, Flags: transport.SendSignaled,
				SGEs: []memreg.SGE{mr.SGE(i*soakMaxMsg, wc.ByteLen)}}); err != nil {
				return total, nil
			}
		}
		select {
		case <-sendDone:
			return total, nil
		default:
		}
	}
}

// lockedLines writes whole lines from many goroutines.
type lockedLines struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedLines) println(s string) {
	l.mu.Lock()
	fmt.Fprintln(l.w, s)
	l.mu.Unlock()
}

// runSoakClient connects, exchanges, disconnects and connects again until
// it is killed. It prints one line per event: "made LAT_US", "failed
// ERR", "ended BYTES REASON".
func runSoakClient(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseSoakFlags("soak-client", args)
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d soak-client: %v\n", err)
		return cli.ExitUsage
	}
	start := time.Now()
	dev, err := soakDevice(c, c.addr)
	if err != nil {
		fmt.Fprintf(stdout, "failed device: %v\n", err)
		return cli.ExitFail
	}
	defer dev.Close()
	out := &lockedLines{w: stdout}
	rng := rand.New(rand.NewPCG(c.seed, uint64(os.Getpid())))
	seed := rng.Uint64()
	pd, err := dev.AllocPD()
	if err != nil {
		return cli.ExitFail
	}
	sbuf := make([]byte, soakSlots/2*soakMaxMsg)
	rbuf := make([]byte, soakSlots*soakMaxMsg)
	smr, err := pd.RegisterMR(sbuf, memreg.AccessLocalWrite)
	if err != nil {
		return cli.ExitFail
	}
	rmr, err := pd.RegisterMR(rbuf, memreg.AccessLocalWrite)
	if err != nil {
		return cli.ExitFail
	}
	since := start // the reconnect latency runs from the last connection's end (or the process start)
	for cn := uint64(0); ctx.Err() == nil; cn++ {
		o := soakOptions(c)
		o.PD = pd
		o.PrivateData = binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, seed), cn)
		o.Prepare = func(qp *transport.QP) error {
			for i := 0; i < soakSlots; i++ {
				if err := qp.PostRecv(transport.RecvWR{WRID: uint64(i), SGEs: []memreg.SGE{rmr.SGE(uint64(i*soakMaxMsg), soakMaxMsg)}}); err != nil {
					return err
				}
			}
			return nil
		}
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		conn, err := rdmacm.Dial(dctx, dev, netip.AddrPortFrom(c.server, uint16(c.port)), &o)
		cancel()
		if err != nil {
			out.println(fmt.Sprintf("failed %v", strings.ReplaceAll(err.Error(), "\n", " ")))
			time.Sleep(50 * time.Millisecond)
			continue
		}
		out.println(fmt.Sprintf("made %d", time.Since(since).Microseconds()))
		life := time.Duration(50+rng.IntN(max(c.maxConnLifeMilli, 51)-49)) * time.Millisecond
		n, why := soakExchange(ctx, conn, seed, cn, smr, rmr, sbuf, rbuf, life)
		if errors.Is(why, errSoakMismatch) {
			out.println(fmt.Sprintf("MISMATCH client: %v", why))
		}
		conn.Close()
		since = time.Now()
		reason := "closed"
		if why != nil {
			reason = strings.ReplaceAll(why.Error(), " ", "_")
		}
		out.println(fmt.Sprintf("ended %d %s", n, reason))
	}
	return cli.ExitOK
}

// soakExchange keeps soakSlots/2 messages in flight on conn for life and
// checks every echo. It returns the bytes checked and why it stopped
// early (nil when life ran out).
func soakExchange(ctx context.Context, conn *rdmacm.Conn, seed, cn uint64, smr, rmr *memreg.MR, sbuf, rbuf []byte, life time.Duration) (uint64, error) {
	qp := conn.QP()
	ctx, cancel := context.WithTimeout(ctx, life)
	defer cancel()
	go func() {
		select {
		case <-conn.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	const window = soakSlots / 2
	var sent, echoed, total uint64
	sendSlot := func(k uint64) error {
		i := k % window
		n := soakLen(seed, cn, k)
		b := sbuf[i*soakMaxMsg : i*soakMaxMsg+uint64(n)]
		soakFill(b, seed, cn, k)
		return qp.PostSendContext(ctx, transport.SendWR{WRID: k, Opcode: transport.WRSend,
			SGEs: []memreg.SGE{smr.SGE(i*soakMaxMsg, uint32(n))}})
	}
	for ; sent < window; sent++ {
		if err := sendSlot(sent); err != nil {
			return total, conn.Err()
		}
	}
	scratch := make([]byte, soakMaxMsg)
	wcs := make([]transport.WC, soakSlots)
	for {
		n, err := conn.RecvCQ().Wait(ctx, wcs)
		if err != nil {
			if e := conn.Err(); e != nil {
				return total, e
			}
			return total, nil // life ran out
		}
		for _, wc := range wcs[:n] {
			if wc.Status != transport.WCSuccess {
				return total, conn.Err()
			}
			i := wc.WRID
			msg := rbuf[i*soakMaxMsg : i*soakMaxMsg+uint64(wc.ByteLen)]
			if !soakCheck(msg, seed, cn, echoed, scratch) {
				return total, fmt.Errorf("%w: echo of message %d (%d bytes)", errSoakMismatch, echoed, wc.ByteLen)
			}
			total += uint64(wc.ByteLen)
			echoed++
			if err := qp.PostRecv(transport.RecvWR{WRID: i, SGEs: []memreg.SGE{rmr.SGE(i*soakMaxMsg, soakMaxMsg)}}); err != nil {
				return total, conn.Err()
			}
			// The echo of message k proves the send of k done: its
			// send slot (k % window) is free again.
			if ctx.Err() == nil {
				if err := sendSlot(sent); err != nil {
					return total, conn.Err()
				}
				sent++
			}
		}
	}
}

// soakProc is a running child.
type soakProc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// soakRun is the parent's state.
type soakRun struct {
	c       *soakConfig
	bin     string
	net     [4]byte
	verbose io.Writer

	mu          sync.Mutex
	made        int
	failed      int
	lat         []time.Duration
	bytes       uint64
	mismatches  []string
	failures    map[string]int
	endings     map[string]int // why connections ended ("closed": the client's own Close)
	statuses    []soakStatus   // of the current server incarnation
	serverStart []soakStatus   // the first status of each incarnation
}

func (r *soakRun) start(args ...string) (*soakProc, error) {
	cmd := exec.Command(r.bin, args...)
	cmd.Env = append(os.Environ(), soakChildEnv+"=1", cli.GuardianEnv+"=off")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &soakProc{cmd: cmd, done: make(chan struct{})}
	server := args[0] == "soak-server"
	go func() {
		sc := bufio.NewScanner(stdout)
		first := true
		for sc.Scan() {
			r.event(sc.Text(), server, &first)
		}
		cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// soakChildEnv makes a test binary run as rocev2d (TestMain): soak starts
// its children from its own executable.
const soakChildEnv = "ROCEV2D_RUN_AS_MAIN"

func (r *soakRun) event(line string, server bool, first *bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.verbose != nil {
		fmt.Fprintln(r.verbose, line)
	}
	if server {
		if s, ok := parseSoakStatus(line); ok {
			if *first {
				*first = false
				r.serverStart = append(r.serverStart, s)
				r.statuses = r.statuses[:0]
			}
			r.statuses = append(r.statuses, s)
			return
		}
	}
	f := strings.Fields(line)
	if len(f) == 0 {
		return
	}
	switch f[0] {
	case "made":
		r.made++
		if len(f) > 1 {
			if us, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				r.lat = append(r.lat, time.Duration(us)*time.Microsecond)
			}
		}
	case "failed":
		r.failed++
		why := strings.Join(f[1:], " ")
		if len(why) > 60 {
			why = why[:60]
		}
		r.failures[why]++
	case "ended":
		if len(f) > 1 {
			n, _ := strconv.ParseUint(f[1], 10, 64)
			r.bytes += n
		}
		if len(f) > 2 {
			why := strings.ReplaceAll(f[2], "_", " ")
			if len(why) > 90 {
				why = why[:90]
			}
			r.endings[why]++
		}
	case "MISMATCH":
		r.mismatches = append(r.mismatches, line)
	}
}

func (r *soakRun) lastStatus() (soakStatus, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.statuses) == 0 {
		return soakStatus{}, false
	}
	return r.statuses[len(r.statuses)-1], true
}

func (r *soakRun) startServer() (*soakProc, error) {
	args := append([]string{"soak-server", "--addr", soakServerAddr(r.net).String(), "--seed", strconv.FormatUint(rand.Uint64(), 10)}, r.c.childArgs()...)
	p, err := r.start(args...)
	if err != nil {
		return nil, err
	}
	// Wait for its baseline status (it listens right after).
	n := r.incarnations()
	deadline := time.Now().Add(20 * time.Second)
	for r.incarnations() == n {
		select {
		case <-p.done:
			return nil, errors.New("the server exited at start (see -v)")
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, errors.New("no status from the server in 20 s")
		}
	}
	time.Sleep(50 * time.Millisecond)
	return p, nil
}

func (r *soakRun) incarnations() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.serverStart)
}

func (r *soakRun) startClient(i, k int) (*soakProc, error) {
	args := append([]string{"soak-client", "--addr", soakClientAddr(r.net, i, k).String(), "--server", soakServerAddr(r.net).String(),
		"--seed", strconv.FormatUint(rand.Uint64(), 10)}, r.c.childArgs()...)
	return r.start(args...)
}

func kill(p *soakProc) {
	if p == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

func runSoak(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseSoakFlags("soak", args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, soakUsage)
		return cli.ExitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d soak: %v\n(see `rocev2d help soak`)\n", err)
		return cli.ExitUsage
	}
	bin, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d soak: %v\n", err)
		return cli.ExitFail
	}
	r := &soakRun{c: c, bin: bin, net: soakNet(), failures: map[string]int{}, endings: map[string]int{}}
	if c.verbose {
		r.verbose = stdout
	}
	fmt.Fprintf(stdout, "soak: %v, %d clients, churn %v, %d server restarts, loss %.2f%%, keep-alive %v/%v, server %v\n",
		c.duration, c.clients, c.churn, c.serverRestarts, 100*c.loss, c.keepAlive, c.kaTO, soakServerAddr(r.net))
	server, err := r.startServer()
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d soak: server: %v\n", err)
		return cli.ExitFail
	}
	defer func() { kill(server) }()
	clients := make([]*soakProc, c.clients)
	incarnation := make([]int, c.clients)
	defer func() {
		for _, p := range clients {
			kill(p)
		}
	}()
	for i := range clients {
		if clients[i], err = r.startClient(i, 0); err != nil {
			fmt.Fprintf(stderr, "rocev2d soak: client %d: %v\n", i, err)
			return cli.ExitFail
		}
	}
	start := time.Now()
	end := start.Add(c.duration)
	var restartAt []time.Time
	for k := 1; k <= c.serverRestarts; k++ {
		// Spread over the first two thirds: the last incarnation lives
		// long enough to show growth.
		restartAt = append(restartAt, start.Add(c.duration*time.Duration(2*k)/time.Duration(3*(c.serverRestarts+1))))
	}
	churn := c.churn
	if churn <= 0 {
		churn = time.Hour
	}
	nextChurn := start.Add(churn)
	kills, restarts := 0, 0
	for time.Now().Before(end) && ctx.Err() == nil {
		now := time.Now()
		if len(restartAt) > 0 && !now.Before(restartAt[0]) {
			restartAt = restartAt[1:]
			kill(server)
			if server, err = r.startServer(); err != nil {
				fmt.Fprintf(stderr, "rocev2d soak: restarting the server: %v\n", err)
				return cli.ExitFail
			}
			restarts++
		}
		if !now.Before(nextChurn) {
			nextChurn = now.Add(churn)
			i := rand.IntN(c.clients)
			kill(clients[i])
			incarnation[i]++
			if clients[i], err = r.startClient(i, incarnation[i]); err != nil {
				fmt.Fprintf(stderr, "rocev2d soak: client %d: %v\n", i, err)
				return cli.ExitFail
			}
			kills++
		}
		// A child that exits by itself is a failure.
		for i, p := range clients {
			select {
			case <-p.done:
				fmt.Fprintf(stderr, "rocev2d soak: client %d exited by itself: %v\n", i, p.cmd.ProcessState)
				return cli.ExitFail
			default:
			}
		}
		select {
		case <-server.done:
			fmt.Fprintf(stderr, "rocev2d soak: the server exited by itself: %v\n", server.cmd.ProcessState)
			return cli.ExitFail
		default:
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Cut short (SIGINT, SIGTERM): what ran is reported, but it is not
	// the run asked for, so it is no pass, and the reaping is not waited
	// for (an interrupted run should end now).
	ran := time.Since(start)
	var stopped error
	if ctx.Err() != nil && ran < c.duration {
		stopped = context.Cause(ctx)
	}
	// Every client dies without a word: the server finds them by
	// keep-alive and must give everything back.
	for i, p := range clients {
		kill(p)
		clients[i] = nil
	}
	if soakReapHook != nil {
		soakReapHook()
	}
	reap := 2*c.keepAlive + c.kaTO + 3*time.Second
	r.mu.Lock()
	base := r.serverStart[len(r.serverStart)-1]
	r.mu.Unlock()
	deadline := time.Now().Add(reap + 10*time.Second)
	var last soakStatus
	reaping := false // stopped while waiting for the server to give everything back
	for stopped == nil {
		select {
		case <-ctx.Done():
			// Cut short after --duration, while the server's
			// reaping was awaited: the run's traffic was checked,
			// but not that the server gave everything back.
			stopped, reaping = context.Cause(ctx), true
			continue
		case <-time.After(c.statusEvery):
		}
		s, _ := r.lastStatus()
		last = s
		if s.qps <= base.qps && s.conns <= base.conns && s.goroutines <= base.goroutines+soakGoroutineSlack && s.fds <= base.fds+soakFDSlack {
			break
		}
		if time.Now().After(deadline) {
			break
		}
	}
	if stopped != nil {
		last, _ = r.lastStatus()
	}
	el := time.Since(start)
	r.mu.Lock()
	defer r.mu.Unlock()
	var problems []string
	if len(r.mismatches) > 0 {
		problems = append(problems, fmt.Sprintf("%d data mismatches, first: %s", len(r.mismatches), r.mismatches[0]))
	}
	if last.mismatches > 0 {
		problems = append(problems, fmt.Sprintf("the server saw %d mismatches", last.mismatches))
	}
	if (r.made == 0 || r.bytes == 0) && stopped == nil {
		problems = append(problems, fmt.Sprintf("%d connections made, %d bytes checked", r.made, r.bytes))
	}
	grow := func(what string, a, b, slack int) {
		if b > a+slack && stopped == nil { // not reaped when interrupted
			problems = append(problems, fmt.Sprintf("%s grew: %d at start, %d at the end (after %v to reap)", what, a, b, reap))
		}
	}
	grow("server QPs", base.qps, last.qps, 0)
	grow("server CM connections", base.conns, last.conns, 0)
	grow("server goroutines", base.goroutines, last.goroutines, soakGoroutineSlack)
	grow("server open descriptors", base.fds, last.fds, soakFDSlack)
	if last.heap > 2*base.heap+16<<20 && stopped == nil {
		problems = append(problems, fmt.Sprintf("server heap grew: %d at start, %d at the end", base.heap, last.heap))
	}
	slices.Sort(r.lat)
	pct := func(p float64) time.Duration {
		if len(r.lat) == 0 {
			return 0
		}
		return r.lat[min(len(r.lat)-1, int(p*float64(len(r.lat))))]
	}
	fmt.Fprintf(stdout, "\nsoak ran %v: %d client kills, %d server restarts\n", el.Round(time.Millisecond), kills, restarts)
	fmt.Fprintf(stdout, "%-28s %14s %14s\n", "", "start", "end")
	fmt.Fprintf(stdout, "%-28s %14d %14d\n", "connections made", 0, r.made)
	fmt.Fprintf(stdout, "%-28s %14d %14d\n", "connections failed", 0, r.failed)
	fmt.Fprintf(stdout, "%-28s %14s %14v\n", "reconnect latency p50", "-", pct(0.50).Round(time.Microsecond))
	fmt.Fprintf(stdout, "%-28s %14s %14v\n", "reconnect latency p99", "-", pct(0.99).Round(time.Microsecond))
	fmt.Fprintf(stdout, "%-28s %14d %14d\n", "bytes checked", 0, r.bytes)
	fmt.Fprintf(stdout, "%-28s %14d %14d\n", "server goroutines", base.goroutines, last.goroutines)
	fmt.Fprintf(stdout, "%-28s %14d %14d\n", "server heap (bytes)", base.heap, last.heap)
	fmt.Fprintf(stdout, "%-28s %14d %14d\n", "server open fds", base.fds, last.fds)
	fmt.Fprintf(stdout, "%-28s %14d %14d\n", "server device QPs", base.qps, last.qps)
	fmt.Fprintf(stdout, "%-28s %14d %14d\n", "server CM connections", base.conns, last.conns)
	printByReason(stdout, "failed connects by reason:", r.failures)
	printByReason(stdout, "connections ended by reason:", r.endings)
	for _, p := range problems {
		fmt.Fprintf(stdout, "FAIL: %s\n", p)
	}
	if stopped != nil {
		// Not a pass: the run asked for did not happen (and the
		// server's reaping was not checked).
		if reaping {
			fmt.Fprintf(stdout, "INTERRUPTED after the %v run, while waiting up to %v for the server to give back what the killed clients held (%v): no verdict; the server's reaping was not checked\n",
				c.duration, reap, stopped)
			return cli.ExitFail
		}
		fmt.Fprintf(stdout, "INTERRUPTED after %v of %v (%v): no verdict on the run asked for; nothing reaped or compared\n",
			ran.Round(time.Millisecond), c.duration, stopped)
		return cli.ExitFail
	}
	if len(problems) > 0 {
		return cli.ExitFail
	}
	fmt.Fprintln(stdout, "PASS: every byte checked, nothing grew")
	return cli.ExitOK
}

// soakReapHook, when set (by tests), runs after the run's clients are
// killed, before the wait for the server to reap them.
var soakReapHook func()

// Slack for gauges that wobble by a few: the runtime's own goroutines
// (GC workers, a timer) and descriptors (epoll) come and go.
const (
	soakGoroutineSlack = 4
	soakFDSlack        = 2
)

// printByReason prints title and then one line per reason of counts, in
// the reasons' order; nothing when counts is empty.
func printByReason(w io.Writer, title string, counts map[string]int) {
	if len(counts) == 0 {
		return
	}
	fmt.Fprintln(w, title)
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		fmt.Fprintf(w, "  %5d  %s\n", counts[k], k)
	}
}
