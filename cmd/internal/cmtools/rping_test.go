//go:build unix

package cmtools

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/clitest"
)

func TestRpingFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    rpingConfig
		wantErr string
		usage   bool // rping's usage text goes with the error
	}{
		{name: "server defaults", args: []string{"-s", "-a", "192.0.2.1"},
			want: rpingConfig{server: true, addr: "192.0.2.1", port: 7174, size: 64}},
		{name: "client getopt clusters", args: []string{"-cvV", "-a192.0.2.2", "-C50", "-S", "4096", "-p7000", "-d", "-q"},
			want: rpingConfig{addr: "192.0.2.2", port: 7000, count: 50, size: 4096, verbose: 1, validate: true, debug: true}},
		{name: "verbose twice, long options", args: []string{"-c", "-v", "-v", "-a", "h", "-I", "192.0.2.9", "--bind=192.0.2.3", "--timeout", "5s", "--counters", "--busy-poll=50us"},
			want: rpingConfig{addr: "h", source: "192.0.2.9", port: 7174, size: 64, verbose: 2, timeout: 5 * time.Second, counters: true,
				bind: netip.MustParseAddr("192.0.2.3"), sock: cli.SocketFlags{BusyPoll: 50 * time.Microsecond, BusyPollSet: true}}},
		{name: "last of -s and -c wins", args: []string{"-s", "-c", "-a", "x"}, want: rpingConfig{addr: "x", port: 7174, size: 64}},
		{name: "server on --bind", args: []string{"-s", "--bind", "127.0.0.1"},
			want: rpingConfig{server: true, port: 7174, size: 64, bind: netip.MustParseAddr("127.0.0.1")}},
		{name: "neither side", args: []string{"-v"}, wantErr: "-s (server) or -c (client)", usage: true},
		{name: "client without address", args: []string{"-c"}, wantErr: "-a addr", usage: true},
		{name: "server without address", args: []string{"-s"}, wantErr: "-a addr or --bind"},
		{name: "size too small", args: []string{"-c", "-a", "x", "-S", "22"}, wantErr: "Invalid size 22 (valid range is 23 to 65536)"},
		{name: "size too large", args: []string{"-c", "-a", "x", "-S", "65536"}, wantErr: "Invalid size 65536 (valid range is 23 to 65536)"},
		{name: "negative count", args: []string{"-c", "-a", "x", "-C", "-1"}, wantErr: "Invalid count -1"},
		{name: "persistent", args: []string{"-s", "-P", "-a", "x"}, want: rpingConfig{server: true, persistent: true, addr: "x", port: 7174, size: 64}},
		{name: "unknown option", args: []string{"-c", "-x"}, wantErr: "-x", usage: true},
		{name: "argument", args: []string{"-c", "-a", "x", "extra"}, wantErr: `unexpected argument "extra"`, usage: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseRpingFlags(tc.args)
			if tc.wantErr != "" {
				if err == nil || !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), tc.wantErr) || errors.Is(err, errRpingUsage) != tc.usage {
					t.Fatalf("err = %v, want a usage error containing %q (usage text %v)", err, tc.wantErr, tc.usage)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if *c != tc.want {
				t.Fatalf("got  %+v\nwant %+v", *c, tc.want)
			}
		})
	}
}

// TestRpingAddressForms: -a as users type it: in brackets it is taken; with
// a port, or link-local without its zone, it is refused saying why,
// before any name lookup ("lookup 127.0.0.1:7174: no such host" before).
func TestRpingAddressForms(t *testing.T) {
	ctx := context.Background()
	if a, err := resolveAddr(ctx, "[::1]"); err != nil || a != netip.IPv6Loopback() {
		t.Errorf("[::1]: %v, %v", a, err)
	}
	for _, tc := range []struct{ s, want string }{
		{"127.0.0.1:7174", `address "127.0.0.1:7174": give the address alone; -p sets the port`},
		{"[::1]:7174", "-p sets the port"},
		{"fe80::1", "address fe80::1: a link-local address needs its zone"},
	} {
		if _, err := resolveAddr(ctx, tc.s); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "getaddrinfo failed") {
			t.Errorf("%s: %v, want getaddrinfo's failure naming %q", tc.s, err, tc.want)
		}
	}
}

// TestRpingUsage: rping's exit status 22 (EINVAL) and its messages.
func TestRpingUsage(t *testing.T) {
	for _, tc := range []struct {
		args            []string
		stdout, stderr  string
		noStdout, usage bool
	}{
		{args: []string{"-s", "-S", "10", "-a", "127.0.0.1"}, stderr: "Invalid size 10 (valid range is 23 to 65536)", noStdout: true},
		{args: nil, stderr: "-s (server) or -c (client)", stdout: "rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]\n"},
		{args: []string{"-c", "-z"}, stderr: "-z", stdout: "\t-q\t\tuse self-created, self-modified QP\n"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), append([]string{"rping"}, tc.args...), &out, &errb)
		if code != rpingExitUsage || !strings.Contains(errb.String(), tc.stderr) || !strings.Contains(out.String(), tc.stdout) || (tc.noStdout && out.Len() > 0) {
			t.Errorf("rping %q: exit %d, stdout %q, stderr %q; want exit 22, %q on stderr, %q on stdout", tc.args, code, out.String(), errb.String(), tc.stderr, tc.stdout)
		}
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"rping", "-h"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "usage: rocev2d rping") {
		t.Errorf("rping -h: exit %d, %q", code, out.String())
	}
}

// TestRpingFill: the data of rping_test_client, as the golden capture's
// rping printed it (size 64: the first three pings), the rotation from 'z'
// back to 'A', and a size too small for the whole message.
func TestRpingFill(t *testing.T) {
	b := make([]byte, 64)
	for i, want := range []string{
		"rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr",
		"rdma-ping-1: BCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrs",
		"rdma-ping-2: CDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrst",
	} {
		rpingFill(b, i, byte(65+i))
		if got := string(cString(b)); got != want || b[63] != 0 {
			t.Errorf("ping %d: %q, want %q", i, got, want)
		}
	}
	rpingFill(b, 57, 'z')
	if got := string(b[14:17]); got != "zAB" {
		t.Errorf("rotation: %q", got)
	}
	small := make([]byte, 23)
	for _, tc := range []struct {
		ping int
		want string
	}{{123456789, "rdma-ping-123456789: A"}, {1234567890, "rdma-ping-1234567890: "}, {-2147483648, "rdma-ping--2147483648:"}} {
		rpingFill(small, tc.ping, 'A')
		if got := string(cString(small)); got != tc.want || small[22] != 0 {
			t.Errorf("23 bytes at ping %d: %q, want %q", tc.ping, got, tc.want)
		}
	}
}

// lockedBuffer is clitest.LockedBuffer.
type lockedBuffer = clitest.LockedBuffer

type cmResult struct {
	code        int
	out, errOut string
}

// cmServer runs a rocev2d command as a server in this process and returns
// once it listens (listening is the command's test hook), or fails.
type cmServer struct {
	res    chan cmResult
	cancel context.CancelFunc
	out    *lockedBuffer
}

// hookMu serializes the tests that set the listening hooks.
var hookMu sync.Mutex

// startCMServer starts `rocev2d args...` and waits until hook reports that
// it listens; it retries while UDP 4791 on the address is busy (other
// tests of the repository use the loopback addresses).
func startCMServer(t *testing.T, hook *func(netip.AddrPort), args ...string) *cmServer {
	t.Helper()
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithCancel(context.Background())
		s := &cmServer{res: make(chan cmResult, 1), cancel: cancel, out: &lockedBuffer{}}
		ready := make(chan struct{})
		*hook = func(netip.AddrPort) { close(ready) }
		go func() {
			var errb lockedBuffer
			code := run(ctx, args, s.out, &errb)
			s.res <- cmResult{code, s.out.String(), errb.String()}
		}()
		select {
		case <-ready:
			*hook = nil
			return s
		case r := <-s.res:
			cancel()
			*hook = nil
			if strings.Contains(r.errOut, "address already in use") && attempt < 5 {
				t.Logf("UDP 4791 busy, retrying: %s", r.errOut)
				time.Sleep(time.Duration(200*(attempt+1)) * time.Millisecond)
				continue
			}
			t.Fatalf("%q did not start: exit %d\n%s%s", args, r.code, r.out, r.errOut)
		case <-time.After(10 * time.Second):
			cancel()
			t.Fatalf("%q did not listen within 10 s", args)
		}
	}
}

// wait returns the server's result, interrupting it after d.
func (s *cmServer) wait(t *testing.T, d time.Duration) cmResult {
	t.Helper()
	select {
	case r := <-s.res:
		s.cancel()
		return r
	case <-time.After(d):
		s.cancel()
		return <-s.res
	}
}

// runCmd runs a rocev2d command in this process, retrying while UDP 4791
// is busy.
func runCmd(t *testing.T, ctx context.Context, args ...string) cmResult {
	t.Helper()
	for attempt := 0; ; attempt++ {
		var out, errb lockedBuffer
		code := run(ctx, args, &out, &errb)
		r := cmResult{code, out.String(), errb.String()}
		if !strings.Contains(r.errOut, "address already in use") || attempt == 5 {
			return r
		}
		t.Logf("UDP 4791 busy, retrying: %s", r.errOut)
		time.Sleep(time.Duration(200*(attempt+1)) * time.Millisecond)
	}
}

// cmPort picks an rdma_cm port for one test, so that a stray request of
// another test never reaches it.
func cmPort() string { return strconv.Itoa(20000 + rand.IntN(20000)) }

var (
	rePingData       = regexp.MustCompile(`(?m)^ping data: (.*)$`)
	reServerPingData = regexp.MustCompile(`(?m)^server ping data: (.*)$`)
)

// checkPingLines checks that out holds count lines matched by re with the
// data of pings 0..count-1 of size bytes.
func checkPingLines(t *testing.T, who, out string, re *regexp.Regexp, count, size int) {
	t.Helper()
	m := re.FindAllStringSubmatch(out, -1)
	if len(m) != count {
		t.Errorf("%s printed %d ping lines, want %d:\n%s", who, len(m), count, out)
		return
	}
	b := make([]byte, size)
	for i, l := range m {
		rpingFill(b, i, byte(65+i%58))
		if want := string(cString(b)); l[1] != want {
			t.Errorf("%s ping %d: %q, want %q", who, i, l[1], want)
			return
		}
	}
}

// TestRpingLoopback: rocev2d rping against itself (server 127.0.0.1,
// client 127.0.0.2), both -v -V, at several sizes and counts; every
// ping's data on both sides, rping's disconnect messages, exit 0.
func TestRpingLoopback(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	for _, tc := range []struct{ size, count int }{{64, 10}, {23, 3}, {4096, 50}, {65535, 4}, {1000, 120}} {
		t.Run(fmt.Sprintf("S%d_C%d", tc.size, tc.count), func(t *testing.T) {
			port, size, count := cmPort(), strconv.Itoa(tc.size), strconv.Itoa(tc.count)
			srv := startCMServer(t, &rpingListening, "rping", "-s", "-a", "127.0.0.1", "-p", port, "-S", size, "-vV")
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cli := runCmd(t, ctx, "rping", "-c", "-a", "127.0.0.1", "--bind", "127.0.0.2", "-p", port, "-S", size, "-C", count, "-v", "-V", "--counters")
			s := srv.wait(t, 10*time.Second)
			if cli.code != 0 || s.code != 0 {
				t.Fatalf("exit: client %d, server %d\n--- client:\n%s%s--- server:\n%s%s", cli.code, s.code, cli.out, cli.errOut, s.out, s.errOut)
			}
			checkPingLines(t, "client", cli.out, rePingData, tc.count, tc.size)
			checkPingLines(t, "server", s.out, reServerPingData, tc.count, tc.size)
			// rping's messages at the end: the client's own disconnect,
			// the server's view of it.
			if cli.errOut != "client DISCONNECT EVENT...\n" {
				t.Errorf("client stderr %q", cli.errOut)
			}
			if s.errOut != "server DISCONNECT EVENT...\nwait for RDMA_READ_ADV state 10\n" {
				t.Errorf("server stderr %q", s.errOut)
			}
			for _, want := range []string{"cm_established           1", "cm_retransmits           0"} {
				if !strings.Contains(cli.out, want) {
					t.Errorf("client --counters has no %q:\n%s", want, cli.out)
				}
			}
		})
	}
}

// TestRpingRefused: a client whose server does not listen on the port is
// refused at once (REJ, invalid service ID) with rping's event line, a
// clear message and rping's exit status 255; with no connection manager
// at the address at all, --timeout ends the wait.
func TestRpingRefused(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	port := cmPort()
	srv := startCMServer(t, &rpingListening, "rping", "-s", "-a", "127.0.0.1", "-p", port)
	other := strconv.Itoa(mustAtoi(port) + 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	cli := runCmd(t, ctx, "rping", "-c", "-a", "127.0.0.1", "--bind", "127.0.0.2", "-p", other, "-C", "1")
	d := time.Since(start)
	if cli.code != rpingExitFail || !strings.Contains(cli.errOut, "cma event RDMA_CM_EVENT_REJECTED, error 8\n") ||
		!strings.Contains(cli.errOut, "refused: nothing listens on rdma_cm port "+other) {
		t.Errorf("refused client: exit %d\n%s%s", cli.code, cli.out, cli.errOut)
	}
	if d > 2*time.Second {
		t.Errorf("the refusal took %v", d)
	}
	// The server still serves its own port; an interrupt ends it.
	s := srv.wait(t, 100*time.Millisecond)
	if s.code != rpingExitFail || !strings.Contains(s.errOut, "interrupted") {
		t.Errorf("interrupted server: exit %d\n%s%s", s.code, s.out, s.errOut)
	}
	// Nobody at 127.0.0.3: the kernel's ICMP port unreachable ends it
	// at once, long before --timeout.
	start = time.Now()
	cli = runCmd(t, ctx, "rping", "-c", "-a", "127.0.0.3", "--bind", "127.0.0.2", "-p", port, "--timeout", "10s")
	if cli.code != rpingExitFail || !strings.Contains(cli.errOut, "RDMA_CM_EVENT_UNREACHABLE") ||
		!strings.Contains(cli.errOut, "127.0.0.3:"+port+" unreachable: nothing answered on UDP 4791 there: no RoCEv2 device, or none there runs a connection manager (`rocev2d share status 127.0.0.3` there lists a shared address's processes)") ||
		time.Since(start) > 3*time.Second {
		t.Errorf("client with no peer: exit %d after %v\n%s%s", cli.code, time.Since(start), cli.out, cli.errOut)
	}
}

func mustAtoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		panic(err)
	}
	return n
}

// TestRpingServerDisconnects: the server is interrupted while a client
// pings without end (-C 0): it disconnects (DREQ), and the client, told
// so, ends with rping's "client DISCONNECT EVENT..." and exit 0.
func TestRpingServerDisconnects(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	port := cmPort()
	srv := startCMServer(t, &rpingListening, "rping", "-s", "-a", "127.0.0.1", "-p", port, "-v", "-S", "100")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res := make(chan cmResult, 1)
	go func() {
		res <- runCmd(t, ctx, "rping", "-c", "-a", "127.0.0.1", "--bind", "127.0.0.2", "-p", port, "-V", "-S", "100")
	}()
	for deadline := time.Now().Add(20 * time.Second); strings.Count(srv.out.String(), "server ping data") < 20; {
		if time.Now().After(deadline) {
			t.Fatalf("the server did not get 20 pings:\n%s", srv.out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	s := srv.wait(t, 0)
	cli := <-res
	if s.code != rpingExitFail || !strings.Contains(s.errOut, "interrupted; disconnected") {
		t.Errorf("server: exit %d\n%s%s", s.code, s.out, s.errOut)
	}
	// The server stops where the client waits for its first go-ahead.
	if cli.code != 0 || cli.errOut != "client DISCONNECT EVENT...\nwait for RDMA_WRITE_ADV state 10\n" {
		t.Errorf("client: exit %d\n%s%s", cli.code, cli.out, cli.errOut)
	}
}

// TestRpingClientInterrupted: a client pinging without end (-C 0) is
// interrupted: it finishes its ping and disconnects, and the server ends
// as after a counted run (exit 0).
func TestRpingClientInterrupted(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	port := cmPort()
	srv := startCMServer(t, &rpingListening, "rping", "-s", "-a", "127.0.0.1", "-p", port, "-v", "-S", "200")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := make(chan cmResult, 1)
	out := &lockedBuffer{}
	go func() {
		var errb lockedBuffer
		code := run(ctx, []string{"rping", "-c", "-a", "127.0.0.1", "--bind", "127.0.0.2", "-p", port, "-v", "-V", "-S", "200"}, out, &errb)
		res <- cmResult{code, out.String(), errb.String()}
	}()
	for deadline := time.Now().Add(20 * time.Second); strings.Count(out.String(), "ping data") < 30; {
		if time.Now().After(deadline) {
			t.Fatalf("the client did not ping 30 times:\n%s", out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	cli := <-res
	s := srv.wait(t, 10*time.Second)
	if cli.code != rpingExitFail || cli.errOut != "rocev2d rping: interrupted; disconnected\n" {
		t.Errorf("client: exit %d\n%s%s", cli.code, cli.out, cli.errOut)
	}
	if s.code != 0 || s.errOut != "server DISCONNECT EVENT...\nwait for RDMA_READ_ADV state 10\n" {
		t.Errorf("server: exit %d\n%s%s", s.code, s.out, s.errOut)
	}
	n := strings.Count(cli.out, "ping data")
	checkPingLines(t, "client", cli.out, rePingData, n, 200)
	checkPingLines(t, "server", s.out, reServerPingData, n, 200)
}

// TestRpingPersistent: one rping -P server serves clients one after
// another from one address and then several at once from others, each
// ping checked on both sides; an interrupt ends the server.
func TestRpingPersistent(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	port := cmPort()
	srv := startCMServer(t, &rpingListening, "rping", "-s", "-P", "-a", "127.0.0.1", "-p", port, "-v")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := 0; i < 3; i++ {
		cli := runCmd(t, ctx, "rping", "-c", "-a", "127.0.0.1", "--bind", "127.0.0.2", "-p", port, "-C", "5", "-v", "-V")
		if cli.code != 0 {
			t.Fatalf("client %d in turn: exit %d\n%s%s", i, cli.code, cli.out, cli.errOut)
		}
		checkPingLines(t, "client", cli.out, rePingData, 5, 64)
	}
	var wg sync.WaitGroup
	res := make([]cmResult, 3)
	for i := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = runCmd(t, ctx, "rping", "-c", "-a", "127.0.0.1", "--bind", fmt.Sprintf("127.0.0.%d", 3+i), "-p", port, "-C", "20", "-v", "-V")
		}()
	}
	wg.Wait()
	for i, cli := range res {
		if cli.code != 0 {
			t.Errorf("client %d at once: exit %d\n%s%s", i, cli.code, cli.out, cli.errOut)
			continue
		}
		checkPingLines(t, "client", cli.out, rePingData, 20, 64)
	}
	s := srv.wait(t, 100*time.Millisecond)
	if s.code != rpingExitFail || !strings.Contains(s.errOut, "interrupted") {
		t.Errorf("interrupted server: exit %d\n%s%s", s.code, s.out, s.errOut)
	}
	if n := len(reServerPingData.FindAllString(s.out, -1)); n != 3*5+3*20 {
		t.Errorf("the server printed %d pings, want %d", n, 3*5+3*20)
	}
	if n := strings.Count(s.errOut, "server DISCONNECT EVENT..."); n != 6 {
		t.Errorf("the server saw %d disconnects, want 6:\n%s", n, s.errOut)
	}
}

// TestRpingSizeMismatch: a client pinging with more bytes than the
// server's -S: the server says so (it failed on "post send error ...
// out of bounds"), and the client, whose -C 3 pings did not happen,
// exits 255 saying that the server cut it short (rping's client exits 0
// whenever the server disconnects; rocev2d's still does for -C 0).
func TestRpingSizeMismatch(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	port := cmPort()
	srv := startCMServer(t, &rpingListening, "rping", "-s", "-a", "127.0.0.1", "-p", port, "-S", "100")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := runCmd(t, ctx, "rping", "-c", "-a", "127.0.0.1", "--bind", "127.0.0.2", "-p", port, "-S", "200", "-C", "3", "-V")
	s := srv.wait(t, 10*time.Second)
	if s.code != rpingExitFail || !strings.Contains(s.errOut, "the client pings with 200 bytes, more than this server's -S 100") {
		t.Errorf("server: exit %d\n%s%s", s.code, s.out, s.errOut)
	}
	if cli.code != rpingExitFail || !strings.Contains(cli.errOut, "the server disconnected after 0 of -C 3 pings") {
		t.Errorf("client: exit %d\n%s%s", cli.code, cli.out, cli.errOut)
	}
}
