//go:build linux

package pcapcmd

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/clitest"
)

// liveNeeds skips (or, under CI=true, fails) when the live capture test
// cannot run: it needs root, tcpdump and ip.
func liveNeeds(t *testing.T) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "needs root (a network namespace and tcpdump)"
	}
	for _, tool := range []string{"tcpdump", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			why = tool + " is not installed (scripts/test.sh installs it as root)"
		}
	}
	if why == "" {
		return
	}
	msg := "LIVE tcpdump -i any CAPTURE NOT RUN: " + why
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// TestPcapCheckLiveTcpdumpAny captures rocev2d's traffic as a user would:
// `tcpdump -i any` (LINUX_SLL2) in a fresh network namespace while two
// rocev2d processes run a ping-pong over its loopback with the defaults
// (GSO on), then checks the file with `rocev2d pcap check`, and the same
// packets rewritten as pcapng (tcpdump 4.99 writes only pcap).
func TestPcapCheckLiveTcpdumpAny(t *testing.T) {
	liveNeeds(t)
	bin := clitest.BuildRocev2d(t)
	ns, file, tdErr, stop := liveCapture(t)
	const iters = 5
	for _, size := range []int{64, 3000} {
		args := []string{"pingpong", "--bind=127.0.0.2", "-s", strconv.Itoa(size), "-n", strconv.Itoa(iters), "--timeout=20s"}
		srv := exec.Command("ip", append([]string{"netns", "exec", ns, bin}, args...)...)
		var srvOut bytes.Buffer
		srv.Stdout, srv.Stderr = &srvOut, &srvOut
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		var cliOut []byte
		var err error
		for try := 0; try < 50; try++ { // until the server listens
			time.Sleep(100 * time.Millisecond)
			cli := exec.Command("ip", "netns", "exec", ns, bin, "pingpong", "--bind=127.0.0.1", "-s", strconv.Itoa(size),
				"-n", strconv.Itoa(iters), "--timeout=20s", "127.0.0.2")
			if cliOut, err = cli.CombinedOutput(); err == nil || !bytes.Contains(cliOut, []byte("connection refused")) {
				break
			}
		}
		serr := srv.Wait()
		if err != nil || serr != nil {
			t.Fatalf("pingpong -s %d: client %v\n%s\nserver %v\n%s", size, err, cliOut, serr, srvOut.String())
		}
	}
	time.Sleep(200 * time.Millisecond)
	stop()
	if !strings.Contains(tdErr.String(), "LINUX_SLL2") {
		t.Fatalf("tcpdump -i any did not write LINUX_SLL2:\n%s", tdErr.String())
	}
	// Each ping-pong of one size: iters messages each way, each
	// acknowledged (the ACK count depends on coalescing): at least 2*iters
	// data packets per 64-B round, 3 per 3000-B message, all checked.
	code, out, errOut := runIn(t, "pcap", "check", file)
	t.Logf("tcpdump: %s\n%s", strings.TrimSpace(tdErr.String()), lastLine(out))
	if code != cli.ExitOK {
		t.Fatalf("pcap check: exit %d\n%s%s", code, out, errOut)
	}
	m := regexp.MustCompile(`any\.pcap: (\d+) frames, (\d+) RoCEv2 \(ICRC ok (\d+), bad 0\)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no summary line:\n%s", out)
	}
	roce, _ := strconv.Atoi(m[2])
	sends := strings.Count(out, " RC_SEND_ONLY ") + strings.Count(out, " RC_SEND_FIRST ") +
		strings.Count(out, " RC_SEND_MIDDLE ") + strings.Count(out, " RC_SEND_LAST ")
	if want := 2*iters + 2*iters*3; sends != want || roce < want+2 {
		t.Errorf("%d SEND packets (want %d), %d RoCEv2 packets in all:\n%s", sends, want, roce, out)
	}
	// The same packets as pcapng.
	frames := readSLL2(t, file)
	ng := filepath.Join(filepath.Dir(file), "any.pcapng")
	writeLinkType(t, ng, framings[2], frames, true)
	code, out2, errOut := runIn(t, "pcap", "check", "-q", ng)
	if want := fmt.Sprintf("%s frames, %s RoCEv2 (ICRC ok %s, bad 0)", m[1], m[2], m[3]); code != cli.ExitOK || !strings.Contains(out2, want) {
		t.Errorf("pcapng: exit %d, output lacks %q:\n%s%s", code, want, out2, errOut)
	}
}

// liveCapture makes a network namespace with lo up and starts tcpdump -i
// any in it; it returns the namespace, the capture file, tcpdump's
// stderr and a stop function (also run at cleanup).
func liveCapture(t *testing.T) (ns, file string, tdErr *clitest.LockedBuffer, stop func()) {
	t.Helper()
	ns = "rocev2-any-" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	if out, err := exec.Command("ip", "-n", ns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v %s", err, out)
	}
	file = filepath.Join(t.TempDir(), "any.pcap")
	tdErr = &clitest.LockedBuffer{}
	td := exec.Command("ip", "netns", "exec", ns, "tcpdump", "-i", "any", "-s", "65600", "-B", "32768", "-U", "--immediate-mode", "-n",
		"-Z", "root", "-w", file, "udp port 4791 or tcp port 18515")
	td.Stderr = tdErr
	if err := td.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			td.Process.Signal(syscall.SIGINT)
			td.Wait()
		}
	}
	t.Cleanup(stop)
	for i := 0; !strings.Contains(tdErr.String(), "listening on"); i++ {
		if i > 200 {
			t.Fatalf("tcpdump not capturing after 5 s: %s", tdErr.String())
		}
		time.Sleep(25 * time.Millisecond)
	}
	return ns, file, tdErr, stop
}

// TestPcapCheckLiveTcpdumpAnyDemo: a tcpdump -i any capture of rocev2d
// demo (every RC operation; its ACKs, READ requests and atomics leave in
// GSO batches of packets without payload) checks clean, the batches split.
func TestPcapCheckLiveTcpdumpAnyDemo(t *testing.T) {
	liveNeeds(t)
	bin := clitest.BuildRocev2d(t)
	ns, file, tdErr, stop := liveCapture(t)
	if out, err := exec.Command("ip", "netns", "exec", ns, bin, "demo").CombinedOutput(); err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	time.Sleep(200 * time.Millisecond)
	stop()
	code, out, errOut := runIn(t, "pcap", "check", file)
	t.Logf("tcpdump: %s\n%s", strings.TrimSpace(tdErr.String()), lastLine(out))
	if code != cli.ExitOK {
		t.Fatalf("pcap check: exit %d\n%s%s", code, lastLines(out, 20), errOut)
	}
	if !regexp.MustCompile(`RC_RDMA_READ_REQUEST .* ok \(GSO segment 2/`).MatchString(out) {
		t.Errorf("no GSO batch of READ requests split:\n%s", lastLines(out, 20))
	}
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(ls[max(0, len(ls)-n):], "\n")
}

// lastLine returns the last line of s.
func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\n')+1:]
}
