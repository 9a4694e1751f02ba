//go:build linux

package faultscmd

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/clitest"
	"github.com/gorocev2/rocev2/internal/netns"
	"github.com/gorocev2/rocev2/udp/faults"
)

func TestFaultsFlags(t *testing.T) {
	c, err := parseFaultsFlags([]string{"--drop", "0.01", "--dup=0.5", "--reorder", "0.02", "--ce", "1", "--ce-all",
		"--every", "300", "--psn", "0xfffffe-0x10", "--psn-limit", "4", "--qp", "0x11", "--netns", "x", "--ingress",
		"--mode", "tc", "-i", "50ms", "-d", "2s", "veth0"})
	if err != nil {
		t.Fatal(err)
	}
	want := faults.Config{DropRate: 0.01, DupRate: 0.5, ReorderRate: 0.02, CERate: 1, CEAll: true, DropEveryN: 300,
		DropPSN: &faults.PSNRange{First: 0xfffffe, Last: 0x10, Limit: 4}, DestQP: 0x11, FilterDestQP: true}
	got := c.cfg
	if *got.DropPSN != *want.DropPSN {
		t.Errorf("DropPSN %+v", *got.DropPSN)
	}
	got.DropPSN, want.DropPSN = nil, nil
	if got != want || c.iface != "veth0" || c.opts.Netns != "x" || !c.opts.Ingress || c.opts.Egress ||
		c.opts.Mode != faults.ModeTC || c.interval != 50*time.Millisecond || c.duration != 2*time.Second {
		t.Errorf("parsed %+v", c)
	}
	if s := describeFaults(&c.cfg); !strings.Contains(s, "drop 1%") || !strings.Contains(s, "0xfffffe-0x000010") {
		t.Errorf("describe: %s", s)
	}

	bad := []struct {
		args []string
		msg  string
	}{
		{nil, "missing IFACE"},
		{[]string{"a", "b"}, "unexpected argument"},
		{[]string{"--drop", "1.5", "a"}, "--drop"},
		{[]string{"--dup", "x", "a"}, "--dup"},
		{[]string{"--reorder", "-1", "a"}, "--reorder"},
		{[]string{"--ce", "NaN", "a"}, "--ce"},
		{[]string{"--psn", "0x1000000", "a"}, "24-bit"},
		{[]string{"--psn-limit", "3", "a"}, "needs --psn"},
		{[]string{"--qp", "zz", "a"}, "--qp"},
		{[]string{"--mode", "xdp", "a"}, "--mode"},
		{[]string{"-i", "1ms", "a"}, "--interval"},
		{[]string{"-d", "-1s", "a"}, "negative"},
		{[]string{"--ce-all", "a"}, "--ce-all"},
	}
	for _, b := range bad {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append([]string{"faults"}, b.args...), &out, &errOut)
		if code != cli.ExitUsage || !strings.Contains(errOut.String(), b.msg) {
			t.Errorf("%q: exit %d, stderr %q, want usage error with %q", b.args, code, errOut.String(), b.msg)
		}
	}
	var out bytes.Buffer
	if code := run(context.Background(), []string{"help", "faults"}, &out, &out); code != cli.ExitOK || !strings.Contains(out.String(), "--reorder=RATE") {
		t.Errorf("help faults: %d %q", code, out.String())
	}
}

// TestFaultsCommand attaches with the subcommand to a veth in a namespace,
// sends RoCE-port datagrams through it and checks the printed counters.
func TestFaultsCommand(t *testing.T) {
	netns.Require(t, "ip")
	pair := netns.TestPair(t, netns.PairConfig{Prefix: "rvfc", IfPrefix: "rvfc",
		AddrA: netip.MustParseAddr("203.0.113.1"), AddrB: netip.MustParseAddr("203.0.113.2"),
		MACA: "02:00:5e:00:72:01", MACB: "02:00:5e:00:72:02"})
	nsA, ifA := pair.NsA, pair.IfA

	// A sending socket inside A.
	conn := netns.MustGet(t, nsA, func() (*net.UDPConn, error) {
		return net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(203, 0, 113, 1)})
	})
	defer conn.Close()

	out, errOut, exit := startFaults(t, "--netns", nsA, "--every", "2", "-i", "100ms", "-d", "1500ms", ifA)
	payload := make([]byte, 12+4)
	payload[0] = 0x04
	for i := range 10 {
		payload[11] = byte(i)
		if _, err := conn.WriteToUDP(payload, &net.UDPAddr{IP: net.IPv4(203, 0, 113, 2), Port: 4791}); err != nil {
			t.Fatal(err)
		}
	}
	if code := <-exit; code != cli.ExitOK {
		t.Fatalf("exit %d: %s\n%s", code, errOut.String(), out.String())
	}
	s := out.String()
	if !strings.Contains(s, "total ") || !strings.Contains(s, "egress: seen=10 dropped=5 (random=0 nth=5") ||
		!strings.Contains(s, "detached from "+ifA) || !strings.Contains(s, "drop every 2-th") {
		t.Errorf("output:\n%s", s)
	}
	t.Logf("output:\n%s", s)
}

// TestFaultsCommandGSO sends UDP GSO datagrams (UDP_SEGMENT, 4 RoCE
// packets each) through the subcommand's injector: --every counts their
// segments and drops the datagram holding the Nth, and the output says how
// much of the traffic was GSO. Before the injector read GSO datagrams it
// printed seen=0 gso=3 and dropped nothing.
func TestFaultsCommandGSO(t *testing.T) {
	netns.Require(t, "ip")
	pair := netns.TestPair(t, netns.PairConfig{Prefix: "rvfg", IfPrefix: "rvfg",
		AddrA: netip.MustParseAddr("203.0.113.1"), AddrB: netip.MustParseAddr("203.0.113.2"),
		MACA: "02:00:5e:00:72:03", MACB: "02:00:5e:00:72:04"})
	conn := netns.MustGet(t, pair.NsA, func() (*net.UDPConn, error) {
		return net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(203, 0, 113, 1)})
	})
	defer conn.Close()

	out, errOut, exit := startFaults(t, "--netns", pair.NsA, "--every", "6", "-i", "100ms", "-d", "1500ms", pair.IfA)
	const segs, seg = 4, 12 + 32 + 4
	oob := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(oob[unix.CmsgLen(0):], seg)
	for i := range 3 {
		payload := make([]byte, segs*seg)
		for k := range segs {
			p := payload[k*seg:]
			p[0] = 0x07 // RC WRITE middle
			binary.BigEndian.PutUint32(p[8:], uint32(i*segs+k))
		}
		if _, _, err := conn.WriteMsgUDP(payload, oob, &net.UDPAddr{IP: net.IPv4(203, 0, 113, 2), Port: 4791}); err != nil {
			t.Fatal(err)
		}
	}
	if code := <-exit; code != cli.ExitOK {
		t.Fatalf("exit %d: %s\n%s", code, errOut.String(), out.String())
	}
	s := out.String()
	// Segments 1-4 pass, 5-8 hold the 6th, 9-12 the 12th.
	for _, want := range []string{
		"UDP GSO datagrams are faulted per segment",
		"total ",
		"egress: seen=12 dropped=8 (random=0 nth=8 psn=0 requests=8)",
		"gso=3 datagrams/12 segments (100.0% of packets) gso_dropped=2",
		"egress: 12 of 12 packets came in 3 GSO datagrams (4.0 per datagram); 2 datagrams dropped, 0 marked CE",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	t.Logf("output:\n%s", s)
}

// startFaults runs `rocev2d faults args...` and returns once the program
// is attached (loading takes a while under the race detector: the
// verifier walks the GSO path's unrolled segment loops). The exit code
// arrives on the channel.
func startFaults(t *testing.T, args ...string) (out, errOut *clitest.LockedBuffer, exit chan int) {
	t.Helper()
	out, errOut, exit = &clitest.LockedBuffer{}, &clitest.LockedBuffer{}, make(chan int, 1)
	go func() { exit <- run(context.Background(), append([]string{"faults"}, args...), out, errOut) }()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(out.String(), "attached to"); {
		select {
		case code := <-exit:
			t.Fatalf("exit %d before attaching: %s\n%s", code, errOut.String(), out.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("not attached after 30 s: %s\n%s", errOut.String(), out.String())
		}
	}
	return out, errOut, exit
}
