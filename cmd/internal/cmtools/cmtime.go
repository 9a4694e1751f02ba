package cmtools

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/rdmacm"
	"github.com/gorocev2/rocev2/transport"
)

// cmtime is librdmacm's cmtime example (rdma-core 44): a client that
// connects many RC connections at once through the CM and disconnects
// them again, timing each step; its server accepts whatever comes and
// disconnects what the clients disconnect.

func init() {
	commands.Register("cmtime", "rdma_cm connection setup/teardown timing, compatible with librdmacm's cmtime", cmtimeUsage, runCmtime)
}

const cmtimeUsage = `usage: rocev2d cmtime [-s server_address] [-b bind_address] [-c connections] [-p port_number] [-r retries] [-t timeout_ms]

librdmacm's cmtime example (rdma-core 44) on rocev2. With -s it is the client:
it creates -c connections' worth of RC QPs (max_send_wr = max_recv_wr = 1),
sends all their connection requests at once (responder resources and
initiator depth 1, retry count -r), waits until every one is established or
failed, then disconnects them all at once (a DREQ each) and waits for every
DREP, and prints cmtime's table of the steps' times: total ms, the slowest
connection's ms, the fastest's us, us per connection. Without -s it is the
server: it accepts every request (a QP each, no data) and disconnects each
connection its client disconnects, until interrupted; then it prints how
many it served. Either side may be the real cmtime.

options:
  -s addr        the server's address (client mode)
  -b addr        local address (the RoCEv2 address; the server needs it or --bind)
  -c n           connections (default 100; the client's)
  -p port        rdma_cm port (default 7471)
  -r n           the QPs' retry count (default 2, 0..7)
  -t ms          accepted (cmtime's address/route resolution timeout; rocev2d
                 resolves once, with no per-connection step)
      --bind=IP  same as -b
      --timeout=DUR  give up when the whole run takes longer (default 0 = no limit)
      --counters print the device's and the CM's counters at the end
` + cli.SocketUsage + `
Output as cmtime's client: its step lines ("creating id", "resolving
address", ..., "destroying id") and its table. rocev2d has no per-connection
address or route resolution: those rows time an empty step. A connection that
fails prints cmtime's "event: RDMA_CM_EVENT_REJECTED, error: REASON" (or
RDMA_CM_EVENT_UNREACHABLE, error: -110 / -111). The server prints "cmtime:
served N connections, N disconnected by their client" and, once all are
released, what its device still holds ("open at exit: Q QPs, C connections").
Exit status: 0; unlike cmtime (which exits 0 anyway), 255 when a connection
failed or did not disconnect cleanly; 1 for bad usage.
`

type cmtimeConfig struct {
	server   string
	bind     netip.Addr
	conns    int
	port     int
	retries  int
	timeout  time.Duration
	counters bool
	sock     cli.SocketFlags
}

var cmtimeOptLetters = map[byte]bool{'s': true, 'b': true, 'c': true, 'p': true, 'r': true, 't': true}

func parseCmtimeFlags(args []string) (*cmtimeConfig, error) {
	c := &cmtimeConfig{}
	fs := cli.NewFlagSet("cmtime")
	var bindB, bind, port string
	var tms int
	fs.StringVar(&c.server, "s", "", "")
	fs.StringVar(&bindB, "b", "", "")
	fs.IntVar(&c.conns, "c", 100, "")
	fs.StringVar(&port, "p", "7471", "")
	fs.IntVar(&c.retries, "r", 2, "")
	fs.IntVar(&tms, "t", 2000, "")
	fs.StringVar(&bind, "bind", "", "")
	fs.DurationVar(&c.timeout, "timeout", 0, "")
	fs.BoolVar(&c.counters, "counters", false, "")
	cli.AddSocketFlags(fs, &c.sock)
	if err := fs.Parse(splitGetopt(args, cmtimeOptLetters)); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case c.conns < 1:
		return nil, fmt.Errorf("-c %d: at least one connection", c.conns)
	case c.conns > cmtimeMaxConns:
		return nil, fmt.Errorf("-c %d: at most %d connections (one QP each on one device)", c.conns, cmtimeMaxConns)
	case c.retries < 0 || c.retries > 7:
		return nil, fmt.Errorf("-r %d: a QP's retry count is 0..7", c.retries)
	case tms < 0:
		return nil, fmt.Errorf("-t %d: negative", tms)
	case c.timeout < 0:
		return nil, fmt.Errorf("--timeout=%v: negative (0: no limit)", c.timeout)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p <= 0 || p > 65535 {
		return nil, fmt.Errorf("-p %q: port out of range 1..65535", port)
	}
	c.port = p
	if c.bind, err = bindFor(bind, bindB, c.server == ""); err != nil {
		return nil, err
	}
	return c, nil
}

// cmtimeMaxConns is the most connections one rocev2d cmtime makes or
// serves at once: its device's QP limit (transport.DeviceConfig.MaxQP).
const cmtimeMaxConns = 4096

// cmBacklog is the servers' ListenOptions.Backlog: as many half-open
// requests as connections they make. Linux's rdma_listen(id, 0) bounds
// only the connect requests the application has not read yet (rdma_ucm's
// max_backlog, 1024), not the requests waiting for their RTU; with 1024
// here, 3000 requests from the VM's cmtime at once (its RTUs lagging) had
// 934 shed unanswered, each connected only by its REQ's resend ~6.5 s
// later.
const cmBacklog = cmtimeMaxConns

// cmtimeListening, when set (by tests), is called once the server listens.
var cmtimeListening func(addr netip.AddrPort)

func runCmtime(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseCmtimeFlags(args)
	if code, done := flagOutcome("cmtime", cmtimeUsage, err, stdout, stderr); done {
		return code
	}
	ctx, cancel := runTimeout(ctx, c.timeout)
	defer cancel()
	if c.server == "" {
		err = cmtimeServer(ctx, c, stdout)
	} else {
		err = cmtimeClient(ctx, c, stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d cmtime: %v\n", err)
		return 255
	}
	return 0
}

// cmEndpoint opens the device of a CM tool on local with a PD and one CQ
// pair of depth cq, and no QP of its own (the connections make theirs), so
// that Device.Resources counts the connections' QPs only.
func cmEndpoint(local netip.Addr, sock *cli.SocketFlags, cq int, advice string) (*cli.Endpoint, error) {
	link, err := cli.ListenSocket(local, sock.Options(true, 0), advice)
	if err != nil {
		return nil, err
	}
	e, err := cli.NewEndpoint(link, cli.EndpointConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 1, MaxRecvWR: 1, CC: sock.CC.Config(),
		MaxQP: cmtimeMaxConns + 1})
	if err != nil {
		return nil, err
	}
	e.QP.Destroy()
	e.QP = nil
	return e, nil
}

// cmEvent returns the librdmacm event and status an application sees for
// a failed connection request: REJECTED with the REJ's reason,
// UNREACHABLE with -ETIMEDOUT when the peer never answered, -ECONNREFUSED
// when the network bounced the request (ICMP).
func cmEvent(err error) (string, int) {
	var rej *rdmacm.RejectError
	switch {
	case errors.As(err, &rej):
		return "RDMA_CM_EVENT_REJECTED", int(rej.Reason)
	case errors.Is(err, rdmacm.ErrUnreachable):
		return "RDMA_CM_EVENT_UNREACHABLE", -111
	case errors.Is(err, rdmacm.ErrTimeout):
		return "RDMA_CM_EVENT_UNREACHABLE", -110
	}
	return "RDMA_CM_EVENT_CONNECT_ERROR", -1
}

// cmtime's steps, in its order, and their names in its table.
const (
	stepCreateID = iota
	stepBind
	stepResolveAddr
	stepResolveRoute
	stepCreateQP
	stepConnect
	stepDisconnect
	stepDestroy
	numSteps
)

var cmtimeStepNames = [numSteps]string{"create id", "bind addr", "resolve addr", "resolve route", "create qp", "connect", "disconnect", "destroy"}

// cmtimeNode is one connection of the client and its steps' times.
type cmtimeNode struct {
	times [numSteps][2]time.Time
	qp    *transport.QP
	conn  *rdmacm.Conn
	err   bool
}

func cmtimeClient(ctx context.Context, c *cmtimeConfig, stdout io.Writer) error {
	peer, err := resolveAddr(ctx, c.server)
	if err != nil {
		return err
	}
	local := c.bind
	if !local.IsValid() {
		if local, err = routeSource(peer); err != nil {
			return err
		}
	}
	e, err := cmEndpoint(local, &c.sock, 2*c.conns, "pick another address with -b")
	if err != nil {
		return err
	}
	defer e.Close()
	if c.counters {
		defer func() {
			cli.PrintCounters(stdout, local.String(), e.Dev)
			printCMStats(stdout, local.String(), rdmacm.StatsOf(e.Dev))
		}()
	}
	nodes := make([]cmtimeNode, c.conns)
	var total [numSteps][2]time.Time
	// step times a step without per-connection work (rocev2d resolves
	// the address and route once), or with f's.
	step := func(s int, line string, f func(n *cmtimeNode) bool) {
		fmt.Fprintln(stdout, line)
		total[s][0] = time.Now()
		for i := range nodes {
			n := &nodes[i]
			if n.err {
				continue
			}
			n.times[s][0] = time.Now()
			if f != nil && !f(n) {
				n.err = true
				continue
			}
			n.times[s][1] = time.Now()
		}
		total[s][1] = time.Now()
	}
	step(stepCreateID, "creating id", nil)
	if c.bind.IsValid() {
		step(stepBind, "binding source address", nil)
	}
	step(stepResolveAddr, "resolving address", nil)
	step(stepResolveRoute, "resolving route", nil)
	var failed error
	step(stepCreateQP, "creating qp", func(n *cmtimeNode) bool {
		qp, err := e.Dev.CreateQP(e.PD, transport.QPInitAttr{Type: transport.QPTypeRC, SendCQ: e.SCQ, RecvCQ: e.RCQ,
			MaxSendWR: 1, MaxRecvWR: 1, MaxSGE: 1})
		if err != nil {
			fmt.Fprintf(stdout, "failure creating qp: %v\n", err)
			failed = err
			return false
		}
		n.qp = qp
		return true
	})

	// Every request goes out at once; each node's end is when its
	// connection was established (or failed).
	fmt.Fprintln(stdout, "connecting")
	retry := transport.DefaultRetry
	retry.RetryCnt = uint8(c.retries)
	addr := netip.AddrPortFrom(peer, uint16(c.port))
	var mu sync.Mutex
	var wg sync.WaitGroup
	var nfail int
	total[stepConnect][0] = time.Now()
	for i := range nodes {
		n := &nodes[i]
		if n.err {
			continue
		}
		n.times[stepConnect][0] = time.Now()
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := rdmacm.Dial(ctx, e.Dev, addr, &rdmacm.Options{QP: n.qp, ResponderResources: 1, InitiatorDepth: 1, Retry: &retry})
			n.times[stepConnect][1] = time.Now()
			if err != nil {
				ev, st := cmEvent(err)
				mu.Lock()
				fmt.Fprintf(stdout, "event: %s, error: %d\n", ev, st)
				nfail++
				if failed == nil || errors.Is(failed, context.Canceled) {
					failed = err
				}
				mu.Unlock()
				n.err = true
				return
			}
			n.conn = conn
		}()
	}
	wg.Wait()
	total[stepConnect][1] = time.Now()

	// rdma_disconnect and rdma_destroy_qp of each, then the wait for
	// every DISCONNECTED (the peer's DREP).
	fmt.Fprintln(stdout, "disconnecting")
	total[stepDisconnect][0] = time.Now()
	var unclean int
	for i := range nodes {
		n := &nodes[i]
		if n.err {
			continue
		}
		n.times[stepDisconnect][0] = time.Now()
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := n.conn.Close()
			n.times[stepDisconnect][1] = time.Now()
			if cerr := n.conn.Err(); err != nil || !errors.Is(cerr, rdmacm.ErrClosed) {
				mu.Lock()
				unclean++
				fmt.Fprintf(stdout, "disconnect: %v\n", errors.Join(err, cerr))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	total[stepDisconnect][1] = time.Now()

	fmt.Fprintln(stdout, "destroying id")
	total[stepDestroy][0] = time.Now()
	for i := range nodes {
		n := &nodes[i]
		n.times[stepDestroy][0] = time.Now()
		if n.qp != nil {
			n.qp.Destroy()
		}
		n.times[stepDestroy][1] = time.Now()
	}
	total[stepDestroy][1] = time.Now()

	printCmtimeTable(stdout, &total, nodes, c.bind.IsValid())
	switch {
	case nfail > 0:
		return fmt.Errorf("%d of %d connections failed: %v", nfail, c.conns, failed)
	case failed != nil:
		return failed
	case unclean > 0:
		return fmt.Errorf("%d of %d connections did not disconnect cleanly", unclean, c.conns)
	}
	return nil
}

// printCmtimeTable prints cmtime's show_perf table: per step the total
// time, the slowest connection's, the fastest's (in µs) and the total per
// connection. A connection that failed a step has no time for it.
func printCmtimeTable(w io.Writer, total *[numSteps][2]time.Time, nodes []cmtimeNode, bound bool) {
	us := func(a, b time.Time) float64 { return float64(b.Sub(a).Nanoseconds()) / 1000 }
	fmt.Fprintf(w, "step              total ms     max ms     min us  us / conn\n")
	for s := 0; s < numSteps; s++ {
		if s == stepBind && !bound {
			continue
		}
		mx, mn := 0.0, 999999999.0
		for i := range nodes {
			t := nodes[i].times[s]
			if t[0].IsZero() || t[1].IsZero() {
				continue
			}
			d := us(t[0], t[1])
			mx = max(mx, d)
			mn = min(mn, d)
		}
		tot := us(total[s][0], total[s][1])
		fmt.Fprintf(w, "%-13s: %11.2f%11.2f%11.2f%11.2f\n", cmtimeStepNames[s], tot/1000, mx/1000, mn, tot/float64(len(nodes)))
	}
}

func cmtimeServer(ctx context.Context, c *cmtimeConfig, stdout io.Writer) error {
	e, err := cmEndpoint(c.bind, &c.sock, 64, "pick another address with -b")
	if err != nil {
		return err
	}
	defer e.Close()
	if c.counters {
		defer func() {
			cli.PrintCounters(stdout, c.bind.String(), e.Dev)
			printCMStats(stdout, c.bind.String(), rdmacm.StatsOf(e.Dev))
		}()
	}
	// Every connection shares the CQs (cmtime's QPs carry no data).
	l, err := rdmacm.Listen(e.Dev, uint16(c.port), &rdmacm.ListenOptions{Backlog: cmBacklog,
		Options: rdmacm.Options{PD: e.PD, SendCQ: e.SCQ, RecvCQ: e.RCQ, MaxSendWR: 1, MaxRecvWR: 1}})
	if err != nil {
		return fmt.Errorf("failure trying to listen: %v", err)
	}
	if cmtimeListening != nil {
		cmtimeListening(l.Addr())
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var served, byClient, unclean int
	for {
		conn, err := l.Accept(ctx)
		if err != nil {
			break
		}
		mu.Lock()
		served++
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-conn.Done():
			case <-ctx.Done():
			}
			select {
			case <-conn.Done():
				// The client's DREQ (answered by the CM); cmtime's
				// disconnect thread then destroys QP and id. Checked
				// again after an interrupt: a client that disconnected
				// just before it counts as one.
				err := conn.Close()
				mu.Lock()
				if errors.Is(conn.Err(), rdmacm.ErrDisconnected) && err == nil {
					byClient++
				} else {
					unclean++
					fmt.Fprintf(stdout, "cmtime: connection from %v ended: %v\n", conn.RemoteAddr(), errors.Join(conn.Err(), err))
				}
				mu.Unlock()
			default:
				conn.Close()
			}
		}()
	}
	l.Close()
	wg.Wait()
	st := rdmacm.StatsOf(e.Dev)
	fmt.Fprintf(stdout, "cmtime: served %d connections, %d disconnected by their client\n", served, byClient)
	fmt.Fprintf(stdout, "cmtime: open at exit: %d QPs, %d connections (%d in TimeWait)\n", e.Dev.Resources().QPs, st.Conns, st.TimeWait)
	if unclean > 0 {
		return fmt.Errorf("%d connections ended otherwise than by their client's disconnect", unclean)
	}
	return nil
}
