//go:build unix

package cmtools

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/nvme"
	"github.com/gorocev2/rocev2/nvmf"
)

// TestNvmfLoopback: rocev2d nvmf-target (a file namespace) and rocev2d
// nvmf-host over kernel UDP sockets on loopback: discover, identify, a
// verified write, a read back into a file, a short bench; the target stops
// cleanly on its context (SIGINT) with -v counters.
func TestNvmfLoopback(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	port := cmPort()
	dir := t.TempDir()
	img := filepath.Join(dir, "ns.img")
	const nqn = "nqn.2026-12.io.rocev2:cli"
	srv := startCMServer(t, &nvmfListening, "nvmf-target", "--bind", "127.0.0.1", "--port", port, "--nqn", nqn,
		"--file", img, "--size", "4m", "-v", "--cpuprofile", filepath.Join(dir, "cpu.pprof"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	host := func(args ...string) cmResult {
		r := runCmd(t, ctx, append([]string{"nvmf-host", args[0], "--bind", "127.0.0.2", "--addr", "127.0.0.1", "--port", port}, args[1:]...)...)
		if r.code != 0 {
			t.Fatalf("nvmf-host %q: exit %d\n%s%s", args, r.code, r.out, r.errOut)
		}
		return r
	}
	if r := host("discover"); !strings.Contains(r.out, "subnqn:  "+nqn) || !strings.Contains(r.out, "trsvcid: "+port) {
		t.Errorf("discover:\n%s", r.out)
	}
	if r := host("identify", "--nqn", nqn); !strings.Contains(r.out, "namespace 1: 4194304 bytes, 512-byte blocks") {
		t.Errorf("identify:\n%s", r.out)
	}
	in := filepath.Join(dir, "in")
	data := []byte(strings.Repeat("NVMe over RoCEv2", 4096)) // 64 KiB
	os.WriteFile(in, data, 0o644)
	if r := host("write", "--nqn", nqn, "--offset", "1m", "--in", in, "--verify"); !strings.Contains(r.out, "verified") {
		t.Errorf("write:\n%s", r.out)
	}
	out := filepath.Join(dir, "out")
	host("read", "--nqn", nqn, "--offset", "1m", "--length", "64k", "--out", out)
	if got, _ := os.ReadFile(out); string(got) != string(data) {
		t.Error("read back differs")
	}
	if r := host("bench", "--nqn", nqn, "--bs", "4k", "--qd", "1,4", "--time", "200ms", "--rw", "rw"); strings.Count(r.out, "\n") != 3 {
		t.Errorf("bench:\n%s", r.out)
	}
	// The sweep: 4 regions of 512 KiB (2 block sizes x 2 queue depths),
	// each written and read back, then the whole 2 MiB again, with a key
	// per command that the target invalidates.
	r := host("verify", "--nqn", nqn, "--offset", "2m", "--length", "2m", "--bs", "4k,64k", "--qd", "1,8", "--invalidate")
	if strings.Count(r.out, "verified bs=") != 4 || !strings.Contains(r.out, "verified all 2097152 bytes at 2097152 in 4 regions") ||
		!regexp.MustCompile(`remote_invalidations [1-9]\d* local_invalidations 0\n`).MatchString(r.out) {
		t.Errorf("verify:\n%s", r.out)
	}
	// The file holds the data the host wrote.
	f, _ := os.ReadFile(img)
	if len(f) != 4<<20 || string(f[1<<20:1<<20+len(data)]) == "" {
		t.Errorf("image of %d bytes", len(f))
	}
	s := srv.wait(t, 100*time.Millisecond)
	if s.code != 0 || !strings.Contains(s.out, "nvmf-target: stopped") || !regexp.MustCompile(`target: connections .* send_invalidate [1-9]`).MatchString(s.out) {
		t.Errorf("target: exit %d\n%s%s", s.code, s.out, s.errOut)
	}
	// --cpuprofile: a gzip'ed pprof profile, written when the target stopped.
	if b, err := os.ReadFile(filepath.Join(dir, "cpu.pprof")); err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Errorf("--cpuprofile: %d bytes %v", len(b), err)
	} else if zr, err := gzip.NewReader(bytes.NewReader(b)); err != nil {
		t.Errorf("--cpuprofile: %v", err)
	} else if raw, err := io.ReadAll(zr); err != nil || len(raw) == 0 {
		t.Errorf("--cpuprofile: %d bytes inflated, %v", len(raw), err)
	}
	// Unknown subsystem: a clear failure.
	r = runCmd(t, ctx, "nvmf-host", "identify", "--bind", "127.0.0.2", "--addr", "127.0.0.1", "--port", port, "--nqn", "nqn.x")
	if r.code == 0 {
		t.Error("identify with the target gone succeeded")
	}
}

// TestNvmfHostSaysWhy: what the host's errors say besides the library's
// words: a subsystem the target does not have, a target that does not
// answer, an interrupt (each was a bare "invalid connect parameters",
// "context deadline exceeded" or "context canceled").
func TestNvmfHostSaysWhy(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	port := cmPort()
	srv := startCMServer(t, &nvmfListening, "nvmf-target", "--bind", "127.0.0.1", "--port", port, "--nqn", "nqn.2026-12.io.rocev2:why", "--size", "1m")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r := runCmd(t, ctx, "nvmf-host", "identify", "--bind", "127.0.0.2", "--addr", "127.0.0.1", "--port", port, "--nqn", "nqn.2026-12.io.rocev2:other")
	if r.code != cli.ExitFail || !strings.Contains(r.errOut, "invalid connect parameters") ||
		!strings.Contains(r.errOut, `has it a subsystem --nqn "nqn.2026-12.io.rocev2:other"? `+"`rocev2d nvmf-host discover` lists them") {
		t.Errorf("unknown subsystem: exit %d, stderr %q", r.code, r.errOut)
	}
	srv.wait(t, 0)

	// A black hole on UDP 4791: the Connect is never answered.
	hole, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 93), Port: 4791})
	if err != nil {
		t.Skipf("UDP 127.0.0.93:4791: %v", err)
	}
	defer hole.Close()
	go func() {
		b := make([]byte, 2048)
		for {
			if _, _, err := hole.ReadFrom(b); err != nil {
				return
			}
		}
	}()
	r = runCmd(t, ctx, "nvmf-host", "discover", "--bind", "127.0.0.94", "--addr", "127.0.0.93", "--port", port)
	if r.code != cli.ExitFail || !strings.Contains(r.errOut, "no answer from 127.0.0.93:"+port+": is a target") {
		t.Errorf("no answer: exit %d, stderr %q", r.code, r.errOut)
	}
	ictx, interrupt := context.WithCancelCause(ctx)
	time.AfterFunc(300*time.Millisecond, func() { interrupt(errors.New("interrupt signal received")) })
	r = runCmd(t, ictx, "nvmf-host", "discover", "--bind", "127.0.0.94", "--addr", "127.0.0.93", "--port", port)
	if r.code != cli.ExitFail || !strings.Contains(r.errOut, "(interrupt signal received)") {
		t.Errorf("interrupted: exit %d, stderr %q", r.code, r.errOut)
	}
}

func TestNvmfUsage(t *testing.T) {
	for _, args := range [][]string{
		{"nvmf-target", "--bind", "127.0.0.1", "--size", "1m"},
		{"nvmf-target", "--nqn", "x", "--size", "1m"},
		{"nvmf-target", "--bind", "127.0.0.1", "--nqn", "x"},
		{"nvmf-target", "--bind", "127.0.0.1", "--nqn", "x", "--size", "12q"},
		{"nvmf-host"},
		{"nvmf-host", "frobnicate"},
		{"nvmf-host", "identify", "--bind", "127.0.0.2", "--addr", "127.0.0.1"},
		{"nvmf-host", "bench", "--bind", "127.0.0.2", "--addr", "127.0.0.1", "--nqn", "x", "--bs", "0"},
		{"nvmf-host", "verify", "--bind", "127.0.0.2", "--addr", "127.0.0.1", "--nqn", "x", "--qd", "0"},
	} {
		var out, errb lockedBuffer
		if code := run(context.Background(), args, &out, &errb); code != cli.ExitUsage {
			t.Errorf("%q: exit %d, want %d\n%s", args, code, cli.ExitUsage, errb.String())
		}
	}
	// Values that were replaced or ignored without a word: each is a
	// usage error naming its flag, before anything connects (no target
	// listens at these addresses).
	tgt := []string{"nvmf-target", "--bind", "127.0.0.1", "--nqn", "x", "--size", "1m"}
	host := func(sub string, more ...string) []string {
		return append([]string{"nvmf-host", sub, "--bind", "127.0.0.2", "--addr", "127.0.0.1", "--nqn", "x"}, more...)
	}
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{append(tgt, "--queue-size", "0"), "--queue-size 0"},
		{append(tgt, "--io-queues", "-1"), "--io-queues -1"},
		{append(tgt, "--io-queues", "100000"), "--io-queues 100000"},
		{append(tgt, "--inline", "-1"), "--inline -1"},
		{append(tgt, "--port", "0"), "--port 0: want 1..65535"},
		{append(tgt, "--mtu", "5000"), "--mtu 5000"},
		{[]string{"nvmf-target", "--bind", "127.0.0.1", "--nqn", "x", "--size", "0"}, "--size 0"},
		{host("identify", "--queue-size", "1"), "--queue-size 1"},
		{host("identify", "--io-queues", "0"), "--io-queues 0"},
		{host("identify", "--mtu", "100"), "--mtu 100"},
		{host("identify", "--ctrl-loss-tmo", "-1s"), "--ctrl-loss-tmo"},
		{host("identify", "--io-timeout", "-1s"), "--io-timeout -1s"},
		{host("identify", "--admin-timeout", "-1s"), "--admin-timeout -1s"},
		{append(tgt, "--discovery-kato", "-1s"), "--discovery-kato -1s"},
		{append(tgt, "--discovery-kato", "500us"), "--discovery-kato 500µs"},
		{append(tgt, "--discovery-kato", "1200h"), "--discovery-kato 1200h0m0s"},
		{host("bench", "--time", "0s"), "--time 0s"},
		{host("bench", "--range", "0"), "--range"},
		{host("read"), "--length is required"},
		{host("read", "--length", "0"), "--length \"0\""},
		{host("read", "--length", "4k", "--offset", "-512"), "--offset"},
		{host("write", "--in", "/dev/null", "--length", "512"), "--in and --length"},
		{[]string{"nvmf-host", "identify", "--bind", "127.0.0.2", "--nqn", "x"}, "--addr (the target's address) is required"},
		// The lists name their flag (it was "bad list element"); a queue
		// depth of a million goroutines hung the host.
		{host("bench", "--qd", "1m"), `--qd "1m": "1m" is not a number from 1 to 4096`},
		{host("verify", "--bs", "4k,0"), `--bs "4k,0": "0" is not a number from 1 to`},
		// A block size the target cannot use, a size that is no whole
		// number of blocks: said before anything opens (exit 1 naming a
		// Go field, and a namespace with an unreachable tail, before).
		{append(tgt, "--block-size", "1000"), "--block-size 1000: want 512 or 4096"},
		{[]string{"nvmf-target", "--bind", "127.0.0.1", "--nqn", "x", "--size", "1000"}, "--size 1000: 1000 bytes is not a multiple of the 512-byte block size"},
		{[]string{"nvmf-target", "--bind", "127.0.0.1", "--nqn", "x", "--size", "6k", "--block-size", "4096"}, "--size 6k: 6144 bytes is not a multiple of the 4096-byte block size"},
		{[]string{"nvmf-host", "identify", "--bind", "127.0.0.2", "--nqn", "x", "--addr", "127.0.0.1:4420"}, `--addr "127.0.0.1:4420": give the address alone; --port sets the port`},
		{[]string{"nvmf-host", "identify", "--bind", "127.0.0.2", "--nqn", "x", "--addr", "localhost"}, `--addr "localhost": not an IP address`},
		{[]string{"nvmf-target", "--bind", "fe80::1", "--nqn", "x", "--size", "1m"}, "--bind fe80::1: a link-local address needs its zone"},
	} {
		// Bounded: a target that takes a bad value serves until stopped.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var out, errb lockedBuffer
		code := run(ctx, tc.args, &out, &errb)
		cancel()
		if code != cli.ExitUsage || !strings.Contains(errb.String(), tc.msg) {
			t.Errorf("%q: exit %d, stderr %q, want exit %d naming %q", tc.args, code, errb.String(), cli.ExitUsage, tc.msg)
		}
	}
	// A memory namespace beyond the host's memory (1 PiB: beyond any
	// host's address space) is an error naming --size; it was Go's fatal
	// "out of memory" with every goroutine's stack.
	var out, errb lockedBuffer
	args := []string{"nvmf-target", "--bind", "127.0.0.1", "--nqn", "x", "--size", "1048576g"}
	if code := run(context.Background(), args, &out, &errb); code != cli.ExitFail || !strings.Contains(errb.String(), "--size 1048576g: cannot map") {
		t.Errorf("%q: exit %d, stderr %q", args, code, errb.String())
	}
}

// TestNvmfNGUID: the namespace's NGUID names its data. The same file keeps
// it across restarts (a host reconnects to the same disk); a file made
// again at the same path, or memory (which a restart empties), gets
// another, so that a reconnecting host sees another namespace instead of
// reading other data as its old disk (it was derived from the NQN alone);
// --nguid sets it.
func TestNvmfNGUID(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	const nqn = "nqn.2026-12.io.rocev2:nguid"
	img := filepath.Join(t.TempDir(), "ns.img")
	re := regexp.MustCompile(`, nguid ([0-9a-f]{32})\n`)
	guid := func(args ...string) string {
		t.Helper()
		srv := startCMServer(t, &nvmfListening, append([]string{"nvmf-target", "--bind", "127.0.0.1", "--port", cmPort(), "--nqn", nqn}, args...)...)
		r := srv.wait(t, 10*time.Millisecond)
		m := re.FindStringSubmatch(r.out)
		if r.code != 0 || m == nil {
			t.Fatalf("%q: exit %d\n%s%s", args, r.code, r.out, r.errOut)
		}
		return m[1]
	}
	a := guid("--file", img, "--size", "1m")
	if b := guid("--file", img); b != a {
		t.Errorf("the same file: nguid %s, then %s", a, b)
	}
	os.Remove(img)
	if c := guid("--file", img, "--size", "1m"); c == a {
		t.Errorf("a new file at the same path kept the nguid %s", a)
	}
	if m1, m2 := guid("--size", "1m"), guid("--size", "1m"); m1 == m2 {
		t.Errorf("two memory namespaces, one nguid %s", m1)
	}
	if g := guid("--size", "1m", "--nguid", "00112233-4455-6677-8899-aabbccddeeff"); g != "00112233445566778899aabbccddeeff" {
		t.Errorf("--nguid: %s", g)
	}
	for _, bad := range []string{"0011", "00000000000000000000000000000000", "xyz"} {
		var out, errb lockedBuffer
		args := []string{"nvmf-target", "--bind", "127.0.0.1", "--nqn", nqn, "--size", "1m", "--nguid", bad}
		if code := run(context.Background(), args, &out, &errb); code != cli.ExitUsage || !strings.Contains(errb.String(), "--nguid") {
			t.Errorf("--nguid %s: exit %d %s", bad, code, errb.String())
		}
	}
}

// TestNvmfTimeoutFlags: --admin-timeout and --io-timeout reach the host's
// configuration (0: none), each its own field; the defaults are Linux's
// (admin_timeout 60 s, io_timeout 30 s).
func TestNvmfTimeoutFlags(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	defer func() { nvmfHostConfig = nil }()
	for _, tc := range []struct {
		flags     []string
		admin, io time.Duration
		sr        bool
	}{
		{nil, 60 * time.Second, 30 * time.Second, false},
		{[]string{"--admin-timeout", "5s"}, 5 * time.Second, 30 * time.Second, false},
		{[]string{"--io-timeout", "7s", "--admin-timeout", "0"}, -1, 7 * time.Second, false},
		{[]string{"--selective-repeat"}, 60 * time.Second, 30 * time.Second, true},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		var got *nvmf.HostConfig
		nvmfHostConfig = func(cfg nvmf.HostConfig) {
			got = &cfg
			cancel() // no need to connect
		}
		args := append([]string{"nvmf-host", "identify", "--bind", "127.0.0.2", "--addr", "127.0.0.1", "--port", cmPort(), "--nqn", "x"},
			tc.flags...)
		r := runCmd(t, ctx, args...)
		cancel()
		if got == nil {
			t.Errorf("%q: exit %d, the host never configured\n%s", tc.flags, r.code, r.errOut)
			continue
		}
		if got.AdminTimeout != tc.admin || got.IOTimeout != tc.io || got.SelectiveRepeat != tc.sr {
			t.Errorf("%q: AdminTimeout %v, IOTimeout %v, SelectiveRepeat %v; want %v, %v, %v", tc.flags, got.AdminTimeout, got.IOTimeout,
				got.SelectiveRepeat, tc.admin, tc.io, tc.sr)
		}
	}
}

// TestNvmfTargetNoSelectiveRepeat: nvmf-target --no-selective-repeat
// refuses a host's selective repeat offer (the host says its queues run
// go-back-N); without it the offer is taken. The target had no flag for
// TargetConfig.NoSelectiveRepeat.
func TestNvmfTargetNoSelectiveRepeat(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	const nqn = "nqn.2026-12.io.rocev2:nosr"
	for _, refuse := range []bool{false, true} {
		port := cmPort()
		args := []string{"nvmf-target", "--bind", "127.0.0.1", "--port", port, "--nqn", nqn, "--size", "1m"}
		if refuse {
			args = append(args, "--no-selective-repeat")
		}
		srv := startCMServer(t, &nvmfListening, args...)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		r := runCmd(t, ctx, "nvmf-host", "identify", "--bind", "127.0.0.2", "--addr", "127.0.0.1", "--port", port, "--nqn", nqn,
			"--selective-repeat")
		cancel()
		srv.wait(t, 10*time.Millisecond)
		if r.code != 0 {
			t.Fatalf("--no-selective-repeat %v: identify exit %d\n%s%s", refuse, r.code, r.out, r.errOut)
		}
		if declined := strings.Contains(r.errOut, "declined selective repeat"); declined != refuse {
			t.Errorf("--no-selective-repeat %v: the host's offer declined: %v\n%s", refuse, declined, r.errOut)
		}
	}
}

// TestNvmfDiscoveryKATO: --discovery-kato sets the keep-alive timeout a
// discovery controller gets when its host asks for none (nvmf-host
// discover asks for none); the target had no flag for it.
func TestNvmfDiscoveryKATO(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	for _, tc := range []struct {
		flag, want string
	}{{"", "(kato 120000 ms)"}, {"1500ms", "(kato 1500 ms)"}, {"0", "(kato 0 ms)"}} {
		port := cmPort()
		args := []string{"nvmf-target", "--bind", "127.0.0.1", "--port", port, "--nqn", "nqn.2026-12.io.rocev2:dkato", "--size", "1m", "-v"}
		if tc.flag != "" {
			args = append(args, "--discovery-kato", tc.flag)
		}
		srv := startCMServer(t, &nvmfListening, args...)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		r := runCmd(t, ctx, "nvmf-host", "discover", "--bind", "127.0.0.2", "--addr", "127.0.0.1", "--port", port)
		cancel()
		s := srv.wait(t, 10*time.Millisecond)
		if r.code != 0 || !strings.Contains(s.errOut, "on "+nvme.DiscoveryNQN+" "+tc.want) {
			t.Errorf("--discovery-kato %q: discover exit %d %s\ntarget:\n%s", tc.flag, r.code, r.errOut, s.errOut)
		}
	}
}

// TestNvmfTargetHangupResizes: SIGHUP makes nvmf-target read its file's
// size again: a file that grew is the namespace's new size, which a host
// identifying it then sees; a second SIGHUP finds it unchanged.
func TestNvmfTargetHangupResizes(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	hup := make(chan os.Signal, 1)
	old := nvmfHangup
	nvmfHangup = func() (<-chan os.Signal, func()) { return hup, func() {} }
	defer func() { nvmfHangup = old }()
	port := cmPort()
	img := filepath.Join(t.TempDir(), "ns.img")
	const nqn = "nqn.2026-12.io.rocev2:hup"
	srv := startCMServer(t, &nvmfListening, "nvmf-target", "--bind", "127.0.0.1", "--port", port, "--nqn", nqn,
		"--file", img, "--size", "1m")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	identify := func() string {
		r := runCmd(t, ctx, "nvmf-host", "identify", "--bind", "127.0.0.2", "--addr", "127.0.0.1", "--port", port, "--nqn", nqn)
		if r.code != 0 {
			t.Fatalf("identify: exit %d\n%s%s", r.code, r.out, r.errOut)
		}
		return r.out
	}
	if out := identify(); !strings.Contains(out, "namespace 1: 1048576 bytes") {
		t.Fatalf("identify:\n%s", out)
	}
	if err := os.Truncate(img, 3<<20+100); err != nil { // the tail short of a block does not count
		t.Fatal(err)
	}
	waitOut := func(what string) {
		t.Helper()
		hup <- syscall.SIGHUP
		for end := time.Now().Add(10 * time.Second); !strings.Contains(srv.out.String(), what); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("no %q after SIGHUP:\n%s", what, srv.out.String())
			}
		}
	}
	waitOut("nvmf-target: namespace 1 resized: 3145728 bytes, was 1048576; hosts notified")
	if out := identify(); !strings.Contains(out, "namespace 1: 3145728 bytes") {
		t.Fatalf("identify after the resize:\n%s", out)
	}
	waitOut("nvmf-target: namespace 1: 3145728 bytes, unchanged")
	if s := srv.wait(t, 100*time.Millisecond); s.code != 0 {
		t.Errorf("target: exit %d\n%s%s", s.code, s.out, s.errOut)
	}
}

// TestNvmfTargetNSList: --ns-list adds namespaces from the start, and
// SIGHUP reads it again: a namespace gone from it is removed, a new one
// added, which a host identifying the target then sees; a bad list
// changes nothing and says why.
func TestNvmfTargetNSList(t *testing.T) {
	hookMu.Lock()
	defer hookMu.Unlock()
	hup := make(chan os.Signal, 1)
	old := nvmfHangup
	nvmfHangup = func() (<-chan os.Signal, func()) { return hup, func() {} }
	defer func() { nvmfHangup = old }()
	dir := t.TempDir()
	for name, size := range map[string]int64{"a": 1 << 20, "b": 2 << 20} {
		if err := os.WriteFile(filepath.Join(dir, name), make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	list := filepath.Join(dir, "list")
	os.WriteFile(list, []byte("# nsid path\n2 "+filepath.Join(dir, "a")+"\n"), 0o644)
	port := cmPort()
	const nqn = "nqn.2026-12.io.rocev2:nslist"
	srv := startCMServer(t, &nvmfListening, "nvmf-target", "--bind", "127.0.0.1", "--port", port, "--nqn", nqn,
		"--size", "1m", "--ns-list", list)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	identify := func(nsid string) string {
		r := runCmd(t, ctx, "nvmf-host", "identify", "--bind", "127.0.0.2", "--addr", "127.0.0.1", "--port", port, "--nqn", nqn, "--nsid", nsid)
		if r.code != 0 {
			t.Fatalf("identify: exit %d\n%s%s", r.code, r.out, r.errOut)
		}
		return r.out
	}
	if out := identify("2"); !strings.Contains(out, "namespace 2: 1048576 bytes") || !strings.Contains(out, "namespaces: [1 2]") {
		t.Fatalf("identify:\n%s", out)
	}
	waitOut := func(w *lockedBuffer, what string) {
		t.Helper()
		hup <- syscall.SIGHUP
		for end := time.Now().Add(10 * time.Second); !strings.Contains(w.String(), what); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("no %q after SIGHUP:\n%s", what, w.String())
			}
		}
	}
	os.WriteFile(list, []byte("3 "+filepath.Join(dir, "b")+"\n"), 0o644)
	waitOut(srv.out, "nvmf-target: namespace 3 added: "+filepath.Join(dir, "b")+", 2097152 bytes; hosts notified")
	if !strings.Contains(srv.out.String(), "nvmf-target: namespace 2 ("+filepath.Join(dir, "a")+") removed; hosts notified") {
		t.Fatalf("no removal of namespace 2:\n%s", srv.out.String())
	}
	if out := identify("3"); !strings.Contains(out, "namespace 3: 2097152 bytes") || !strings.Contains(out, "namespaces: [1 3]") {
		t.Fatalf("identify after the reload:\n%s", out)
	}
	os.WriteFile(list, []byte("3 "+filepath.Join(dir, "b")+"\n1 /x\n"), 0o644)
	hup <- syscall.SIGHUP
	s := srv.wait(t, time.Second)
	if !strings.Contains(s.errOut, "--ns-list: "+list+":2: NSID \"1\": want 2..4294967294") {
		t.Errorf("bad list: exit %d\n%s%s", s.code, s.out, s.errOut)
	}
}
