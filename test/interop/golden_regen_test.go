//go:build linux

package interop

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket/pcapgo"

	"github.com/gorocev2/rocev2/test/golden"
	"github.com/gorocev2/rocev2/test/interop/agentproto"
)

// goldenCase is one golden capture: rdma-core's tools on rxe in both VMs
// of a VMPair, server in vm0, client in vm1 (testdata/golden/INDEX.md).
type goldenCase struct {
	name, desc string
	// server and client are the commands; "%g" is replaced by the RoCEv2
	// GID index and "%s" (client) by vm0's address.
	server, client string
	// port is the TCP port vm0 listens on when the server is ready; 0:
	// wait a fixed 2 s (rping, which has no TCP exchange).
	port int
}

// goldenCases are the cells of testdata/golden that two rxe VMs make
// (host_ud_interop's peer is a host-side tool of the workspace lab, not
// of this repository, and nvmeof_rdma_linux needs kernel NVMe modules
// the lab image does not carry). The commands are those of INDEX.md; the
// immediate cells use the lab's rv2imm where the workspace lab used its
// rxe_imm (same RoCEv2 traffic, a different TCP exchange).
func goldenCases() []goldenCase {
	const pp = "-d rxe0 -g %g -m 1024"
	const pt = "-d rxe0 -x %g -m 1024 -u 17 -F"
	both := func(name, desc, cmd string, port int) goldenCase {
		return goldenCase{name: name, desc: desc, server: cmd, client: cmd + " %s", port: port}
	}
	return []goldenCase{
		both("rc_send_4096", "RC SEND, 4096 B > MTU: SEND_FIRST/MIDDLE/LAST + ACK, 5 ping-pongs (ibv_rc_pingpong)", "ibv_rc_pingpong "+pp+" -n 5 -s 4096", 18515),
		both("rc_send_64", "RC SEND_ONLY 64 B + ACK, 5 ping-pongs (ibv_rc_pingpong)", "ibv_rc_pingpong "+pp+" -n 5 -s 64", 18515),
		both("uc_send_4096", "UC SEND_FIRST/MIDDLE/LAST (no ACKs), 5 ping-pongs (ibv_uc_pingpong)", "ibv_uc_pingpong "+pp+" -n 5 -s 4096", 18515),
		both("ud_send_512", "UD SEND_ONLY with DETH (qkey 0x11111111), 512 B, 5 ping-pongs (ibv_ud_pingpong)", "ibv_ud_pingpong -d rxe0 -g %g -n 5 -s 512", 18515),
		both("rc_write_64", "RC RDMA_WRITE_ONLY 64 B x5 + ACKs (ib_write_bw) + perftest OOB exchange", "ib_write_bw "+pt+" -n 5 -s 64", 18515),
		both("rc_write_4096", "RC RDMA_WRITE_FIRST/MIDDLE/LAST 4096 B x5 + ACKs (ib_write_bw)", "ib_write_bw "+pt+" -n 5 -s 4096", 18515),
		both("rc_read_64", "RC RDMA_READ_REQUEST + READ_RESPONSE_ONLY 64 B x5 (ib_read_bw)", "ib_read_bw "+pt+" -n 5 -s 64", 18515),
		both("rc_read_4096", "RC RDMA_READ_REQUEST + READ_RESPONSE_FIRST/MIDDLE/LAST 4096 B x5 (ib_read_bw)", "ib_read_bw "+pt+" -n 5 -s 4096", 18515),
		both("rc_atomic_fadd", "RC FETCH_ADD + ATOMIC_ACKNOWLEDGE x5 (ib_atomic_bw)", "ib_atomic_bw "+pt+" -n 5 -A FETCH_AND_ADD", 18515),
		both("rc_atomic_cswap", "RC COMPARE_SWAP + ATOMIC_ACKNOWLEDGE x5 (ib_atomic_bw)", "ib_atomic_bw "+pt+" -n 5 -A CMP_AND_SWAP", 18515),
		both("rc_write_imm_64", "RC RDMA_WRITE_ONLY_WITH_IMMEDIATE 64 B x5 (rv2imm)", "rv2imm -d rxe0 -g %g -o write -n 5 -s 64", immPort),
		both("rc_write_imm_3000", "RC RDMA_WRITE_FIRST/MIDDLE/LAST_WITH_IMMEDIATE 3000 B x5 (pad count 0, last 952 B; rv2imm)", "rv2imm -d rxe0 -g %g -o write -n 5 -s 3000", immPort),
		both("rc_send_imm_62", "RC SEND_ONLY_WITH_IMMEDIATE 62 B x5 (pad count 2; rv2imm)", "rv2imm -d rxe0 -g %g -o send -n 5 -s 62", immPort),
		both("rc_send_bw_64", "RC SEND_ONLY 64 B x5 (ib_send_bw)", "ib_send_bw "+pt+" -n 5 -s 64", 18515),
		{name: "rdmacm_rping", desc: "rdma_cm: CM REQ/REP/RTU/DREQ/DREP MADs (UD SEND_ONLY to QP1) + rping RC SEND/READ/WRITE traffic",
			server: "rping -s -a %v -C 3 -S 64 -v", client: "rping -c -a %s -C 3 -S 64 -v"},
	}
}

// TestGoldenRegen regenerates the golden captures with the project's own
// lab: it boots the two VMs of a VMPair (rdma_rxe on each), and for every
// case runs the server in vm0 and the client in vm1 while tcpdump records
// the host side of vm0's tap, then writes NAME.pcap and NAME.txt (the
// commands, the tools' output, tcpdump's summary and the decoded packets
// in the "## packets" format test/golden parses) into the directory
// $ROCEV2_GOLDEN_REGEN. $ROCEV2_GOLDEN_CASES, a regular expression, picks
// cases. Nothing is written into testdata/golden: compare, then copy
// (testdata/golden/README.md).
//
//	flock /tmp/rocev2-vm.lock env ROCEV2_INTEROP=1 ROCEV2_GOLDEN_REGEN=/tmp/golden \
//	  go test -v -count=1 -timeout 30m -run TestGoldenRegen ./test/interop/
func TestGoldenRegen(t *testing.T) {
	out := os.Getenv("ROCEV2_GOLDEN_REGEN")
	if out == "" {
		t.Skip("ROCEV2_GOLDEN_REGEN=DIR regenerates the golden captures into DIR (with ROCEV2_INTEROP=1, root)")
	}
	if os.Getenv("ROCEV2_INTEROP") != "1" {
		t.Skip(enableHint)
	}
	if os.Geteuid() != 0 {
		t.Fatal("regenerating the golden captures needs root (network namespace, tap, qemu)")
	}
	var pick *regexp.Regexp
	if s := os.Getenv("ROCEV2_GOLDEN_CASES"); s != "" {
		var err error
		if pick, err = regexp.Compile(s); err != nil {
			t.Fatalf("ROCEV2_GOLDEN_CASES: %v", err)
		}
	}
	var cases []goldenCase
	for _, c := range goldenCases() {
		if pick == nil || pick.MatchString(c.name) {
			cases = append(cases, c)
		}
	}
	if len(cases) == 0 {
		t.Fatalf("ROCEV2_GOLDEN_CASES=%q matches no case", os.Getenv("ROCEV2_GOLDEN_CASES"))
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	root, err := FindRepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	cache := DefaultCacheDir()
	cfg := Config{CacheDir: cache, RepoRoot: root, Logf: t.Logf}
	img, err := Prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The host's rocev2d decodes the captures into the .txt.
	rocev2d := filepath.Join(cache, "build", "rocev2d-host")
	if err := goBuild(root, rocev2d, "./cmd/rocev2d", false); err != nil {
		t.Fatal(err)
	}
	runDir := filepath.Join(cache, "run-golden")
	os.RemoveAll(runDir)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	p, err := StartVMPair(ctx, img, runDir, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.VM[0].GIDIndex != p.VM[1].GIDIndex {
		t.Fatalf("RoCEv2 GID index differs: vm0 %d, vm1 %d", p.VM[0].GIDIndex, p.VM[1].GIDIndex)
	}
	kernel, _ := p.VM[0].Run(ctx, "uname -r", 10*time.Second)
	t.Logf("pair: boot %.1fs, kernel %s, GID index %d", p.BootTime.Seconds(), strings.TrimSpace(kernel.Output), p.VM[0].GIDIndex)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := regenCase(ctx, p, c, out, rocev2d, strings.TrimSpace(kernel.Output)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// regenCase captures one case into dir.
func regenCase(ctx context.Context, p *VMPair, c goldenCase, dir, rocev2d, kernel string) error {
	gid := strconv.Itoa(p.VM[0].GIDIndex)
	srvCmd := strings.NewReplacer("%g", gid, "%v", p.IP[0]).Replace(c.server)
	cliCmd := strings.NewReplacer("%g", gid, "%s", p.IP[0]).Replace(c.client)
	pcap := filepath.Join(dir, c.name+".pcap")
	os.Remove(pcap)
	// The frames that crossed vm0's wire, without the command channel and
	// the host's own ARP (the host bridge is HostIP).
	td, err := p.VM[0].StartHost(ctx, "tcpdump", "-i", pairSpecs[0].tap, "-s", "0", "-U", "--immediate-mode", "-n", "-Z", "root",
		"-w", pcap, "not", "host", HostIP, "and", "not", "tcp", "port", strconv.Itoa(agentproto.Port))
	if err != nil {
		return err
	}
	for i := 0; !strings.Contains(td.Output(), "listening on"); i++ {
		if i > 200 {
			td.Cmd.Process.Kill()
			return fmt.Errorf("tcpdump not capturing: %s", td.Output())
		}
		time.Sleep(25 * time.Millisecond)
	}
	captured := time.Now().UTC()
	t0 := time.Now()
	srv, err := p.VM[0].StartVM(ctx, agentproto.Request{Cmd: srvCmd + "; echo exit=$?", TimeoutSec: 120})
	if err != nil {
		td.Cmd.Process.Kill()
		return err
	}
	if c.port != 0 {
		err = p.VM[0].WaitListenVM(ctx, c.port, 60*time.Second)
	} else {
		time.Sleep(2 * time.Second)
	}
	var cli agentproto.Response
	if err == nil {
		cli, err = p.VM[1].Run(ctx, cliCmd, 120*time.Second)
	}
	wall := time.Since(t0)
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	sr, serr := srv.Wait(wctx)
	wcancel()
	time.Sleep(200 * time.Millisecond)
	td.Cmd.Process.Signal(os.Interrupt)
	<-td.Done()
	if err != nil || cli.Exit != 0 {
		return fmt.Errorf("client: exit %d %v\n%s\n--- server:\n%s", cli.Exit, err, cli.Output, sr.Output)
	}
	if serr != nil {
		return fmt.Errorf("server: %v\n%s", serr, sr.Output)
	}
	check, err := exec.CommandContext(ctx, rocev2d, "pcap", "check", pcap).Output()
	if err != nil {
		return fmt.Errorf("rocev2d pcap check %s: %v\n%s", pcap, err, check)
	}
	pkts, err := goldenPacketLines(pcap, string(check))
	if err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n", c.name)
	fmt.Fprintf(&b, "description: %s\n", c.desc)
	fmt.Fprintf(&b, "captured:    %s on the host side of vm0's tap (%s), netns %s\n", captured.Format(time.RFC3339), pairSpecs[0].tap, p.NS)
	fmt.Fprintf(&b, "kernel:      %s rdma_rxe (test/interop lab image)\n", kernel)
	fmt.Fprintf(&b, "path MTU:    1024 (netdev MTU %d); RoCEv2 GID index %s\n", DefaultWireMTU, gid)
	fmt.Fprintf(&b, "server (vm0 %s):    %s\n", p.IP[0], srvCmd)
	fmt.Fprintf(&b, "client (vm1 %s): %s\n", p.IP[1], cliCmd)
	fmt.Fprintf(&b, "reproduce:   ROCEV2_INTEROP=1 ROCEV2_GOLDEN_REGEN=DIR ROCEV2_GOLDEN_CASES='^%s$' go test -run TestGoldenRegen ./test/interop/\n", c.name)
	fmt.Fprintf(&b, "client exit: %d   wall: %.1fs\n", cli.Exit, wall.Seconds())
	fmt.Fprintf(&b, "\n## server output\n%s\n", strings.TrimRight(sr.Output, "\n"))
	fmt.Fprintf(&b, "\n## client output\n%s\n", strings.TrimRight(cli.Output, "\n"))
	fmt.Fprintf(&b, "\n## tcpdump\n%s\n", strings.TrimSpace(tcpdumpSummary(td.Output())))
	fmt.Fprintf(&b, "\n## RoCEv2 summary (rocev2d pcap check)\n%s\n", lastLines(strings.TrimSpace(string(check)), 2))
	fmt.Fprintf(&b, "\n## packets (rocev2d pcap check)\n%s", pkts)
	txt := filepath.Join(dir, c.name+".txt")
	if err := os.WriteFile(txt, []byte(b.String()), 0o644); err != nil {
		return err
	}
	// What the golden tests read back: the roles, every RoCEv2 packet as a
	// "## packets" line, and (the tools that print them) the QPs.
	got, err := golden.ParseTxt(txt)
	if err != nil {
		return fmt.Errorf("%s does not parse as a golden .txt: %w", txt, err)
	}
	roce := strings.Count(string(check), " ok\n")
	if len(got.Packets) != roce || roce == 0 || got.Server.String() != p.IP[0] || got.Client.String() != p.IP[1] {
		return fmt.Errorf("%s: %d packet lines for %d RoCEv2 packets, server %v client %v", txt, len(got.Packets), roce, got.Server, got.Client)
	}
	return nil
}

// tcpdumpSummary keeps tcpdump's "N packets ..." lines.
func tcpdumpSummary(out string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "packets") {
			keep = append(keep, strings.TrimSpace(l))
		}
	}
	return strings.Join(keep, "\n")
}

// rePcapCheck is one packet line of `rocev2d pcap check`.
var rePcapCheck = regexp.MustCompile(`^\S+ #(\d+) (\S+) > (\S+):4791 (\S+) qpn=(0x[0-9a-f]+) psn=(0x[0-9a-f]+) (A )?pkey=(0x[0-9a-f]+) (.*?) ?pay=(\d+) icrc=(0x[0-9a-f]{8}) ok$`)

// goldenPacketLines rewrites `rocev2d pcap check`'s packet lines into the
// "## packets" lines of the golden .txt files (frame, seconds since the
// first frame, source, destination, opcode, dqpn, psn, AckReq, pkey,
// payload, extension headers, ICRC), the format test/golden parses.
func goldenPacketLines(pcap, check string) (string, error) {
	f, err := os.Open(pcap)
	if err != nil {
		return "", err
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		return "", err
	}
	var at []time.Duration
	var first time.Time
	for {
		_, ci, err := r.ReadPacketData()
		if err != nil {
			break
		}
		if first.IsZero() {
			first = ci.Timestamp
		}
		at = append(at, ci.Timestamp.Sub(first))
	}
	var b strings.Builder
	for _, l := range strings.Split(check, "\n") {
		m := rePcapCheck.FindStringSubmatch(l)
		if m == nil {
			if strings.Contains(l, " BAD") {
				return "", fmt.Errorf("bad packet in the capture: %s", l)
			}
			continue
		}
		n, _ := strconv.Atoi(m[1])
		var sec float64
		if n >= 1 && n <= len(at) {
			sec = at[n-1].Seconds()
		}
		dst := m[3]
		fmt.Fprintf(&b, "  %d %.6f %s > %s %-34s dqpn=%s psn=%s %spkey=%s pay=%s %s icrc=%s\n",
			n, sec, m[2], dst, m[4], m[5], m[6], m[7], m[8], m[10], m[9], m[11])
	}
	return b.String(), nil
}
