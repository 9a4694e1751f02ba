//go:build linux

// Package netns runs code inside Linux network namespaces and builds the
// namespaces the veth tests use: one pair of namespaces joined by a veth
// pair (NewPair), or a lone namespace (New). It is the one copy of that
// setup in the module.
//
// Do (and Get) serve products and tests alike: udp/faults attaches its
// programs inside a named namespace with it, the tests open their sockets
// in one. The rest drives iproute2's ip(8) and is for tests and
// experiments; TestPair, TestNew and Require add the testing conventions
// (skip loudly without root or ip, fail instead when CI=true, remove at
// cleanup).
//
// Names carry the creating process's PID (PREFIX-PID-SEQ, PREFIX-PID-SEQ-a
// and -b for a pair), so a run killed before its cleanup leaves namespaces
// that the next run with the same prefix deletes (RemoveStale: only those
// whose PID no longer exists). Nothing is ever found or killed by name
// pattern other than that.
//
// Addresses must come from the documentation ranges (192.0.2.0/24,
// 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32), so a test never claims a
// routable address.
//
// It imports only the standard library and golang.org/x/sys, so any package
// of the module — product or test — may import it.
package netns

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Dir is where ip(8) keeps the named network namespaces.
const Dir = "/var/run/netns"

// Path returns the file of namespace ns: ns itself if it contains a slash,
// else Dir/ns.
func Path(ns string) string {
	if strings.ContainsRune(ns, '/') {
		return ns
	}
	return filepath.Join(Dir, ns)
}

// Do runs f on an OS thread in the network namespace ns (a name under Dir,
// as `ip netns add` makes, or a path; "" runs f as is) and returns its
// error (errors of its own start with "netns: "). Sockets f opens stay in ns whichever thread uses them later. f
// runs on a goroutine of its own, whose thread returns to its namespace
// afterwards; if it cannot, the thread stays locked and ends with the
// goroutine, so no other goroutine ever runs in the wrong namespace.
func Do(ns string, f func() error) error {
	if ns == "" {
		return f()
	}
	target, err := os.Open(Path(ns))
	if err != nil {
		return fmt.Errorf("netns: %w", err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns: enter %s: %w", ns, err)
			return
		}
		ferr := f()
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- ferr
	}()
	return <-errc
}

// Get is Do for a function that returns a value.
func Get[V any](ns string, f func() (V, error)) (V, error) {
	var v V
	err := Do(ns, func() error {
		var err error
		v, err = f()
		return err
	})
	return v, err
}

// seq numbers the namespaces of this process, so that names stay unique
// when one test makes several.
var seq atomic.Uint32

// name returns a fresh PREFIX-PID-SEQ and the sequence number in it.
func name(prefix string) (string, uint32) {
	n := seq.Add(1)
	return fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), n), n
}

// ip runs ip(8) with args.
func ip(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Delete removes namespace ns (by name; with it the interfaces in it).
func Delete(ns string) error { return ip("netns", "del", ns) }

// New creates a namespace PREFIX-PID-SEQ with its loopback up and returns
// its name, after RemoveStale(prefix). The caller deletes it (Delete).
func New(prefix string) (string, error) {
	RemoveStale(prefix)
	ns, _ := name(prefix)
	if err := ip("netns", "add", ns); err != nil {
		return "", err
	}
	if err := ip("-n", ns, "link", "set", "lo", "up"); err != nil {
		Delete(ns)
		return "", err
	}
	return ns, nil
}

// RemoveStale deletes the namespaces named PREFIX-PID or PREFIX-PID-...
// whose process PID no longer exists (a run killed before its cleanup),
// and returns their names.
func RemoveStale(prefix string) []string {
	ents, _ := os.ReadDir(Dir)
	var gone []string
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), prefix+"-")
		if !ok {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := unix.Kill(pid, 0); !errors.Is(err, unix.ESRCH) {
			continue // alive (or not ours to judge)
		}
		if Delete(e.Name()) == nil {
			gone = append(gone, e.Name())
		}
	}
	return gone
}

// PairConfig describes a pair of namespaces joined by a veth pair.
type PairConfig struct {
	// Prefix names the namespaces PREFIX-PID-SEQ-a and PREFIX-PID-SEQ-b.
	Prefix string
	// IfPrefix names the veth ends IFPREFIX+"a"+PID+"n"+SEQ (in a) and
	// the same with "b" (in b); the whole name must fit in 15 bytes, so
	// keep IfPrefix to a few letters.
	IfPrefix string
	// AddrA and AddrB are set as /24 (IPv4) or /64 (IPv6) on the ends in
	// a and b; ExtraA are further addresses on a's end.
	AddrA, AddrB netip.Addr
	ExtraA       []netip.Addr
	// MTU of both ends; 0 keeps the default (1500).
	MTU int
	// MACA and MACB, when both set, are the ends' MAC addresses, and each
	// side gets a permanent neighbour entry for the other's address: no
	// ARP exchange to wait for or to disturb a packet count.
	MACA, MACB string
}

// Pair is two network namespaces joined by a veth pair.
type Pair struct {
	NsA, NsB     string     // namespace names (under Dir)
	IfA, IfB     string     // the veth ends, IfA in NsA, IfB in NsB
	AddrA, AddrB netip.Addr // on IfA and IfB
	ExtraA       []netip.Addr
}

// Documentation reports whether a is in a documentation range
// (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32): the
// only addresses NewPair puts on an interface.
func Documentation(a netip.Addr) bool {
	for _, p := range docRanges {
		if p.Contains(a.Unmap()) {
			return true
		}
	}
	return false
}

var docRanges = []netip.Prefix{
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("2001:db8::/32"),
}

// NewPair creates the pair described by c, after RemoveStale(c.Prefix).
// On error nothing it made is left. The caller removes it with Close.
func NewPair(c PairConfig) (p *Pair, err error) {
	for _, a := range append([]netip.Addr{c.AddrA, c.AddrB}, c.ExtraA...) {
		if !Documentation(a) {
			return nil, fmt.Errorf("netns: address %v is not in a documentation range", a)
		}
	}
	RemoveStale(c.Prefix)
	base, n := name(c.Prefix)
	p = &Pair{NsA: base + "-a", NsB: base + "-b",
		IfA:   fmt.Sprintf("%sa%dn%d", c.IfPrefix, os.Getpid(), n),
		IfB:   fmt.Sprintf("%sb%dn%d", c.IfPrefix, os.Getpid(), n),
		AddrA: c.AddrA, AddrB: c.AddrB, ExtraA: c.ExtraA}
	if len(p.IfA) > 15 {
		return nil, fmt.Errorf("netns: interface name %q longer than 15 bytes (shorten IfPrefix)", p.IfA)
	}
	if err := ip("netns", "add", p.NsA); err != nil {
		return nil, err
	}
	if err := ip("netns", "add", p.NsB); err != nil {
		Delete(p.NsA)
		return nil, err
	}
	defer func() {
		if err != nil {
			p.Close()
			p = nil
		}
	}()
	endA := []string{p.IfA}
	endB := []string{"name", p.IfB}
	if c.MACA != "" && c.MACB != "" {
		endA = append(endA, "address", c.MACA)
		endB = append(endB, "address", c.MACB)
	}
	endA = append(endA, "netns", p.NsA)
	endB = append(endB, "netns", p.NsB)
	if c.MTU > 0 {
		endA = append(endA, "mtu", strconv.Itoa(c.MTU))
		endB = append(endB, "mtu", strconv.Itoa(c.MTU))
	}
	args := append(append(append([]string{"link", "add"}, endA...), "type", "veth", "peer"), endB...)
	if err := ip(args...); err != nil {
		return nil, err
	}
	if c.MACA != "" && c.MACB != "" {
		if err := ip("-n", p.NsA, "neigh", "replace", p.AddrB.String(), "lladdr", c.MACB, "dev", p.IfA, "nud", "permanent"); err != nil {
			return nil, err
		}
		if err := ip("-n", p.NsB, "neigh", "replace", p.AddrA.String(), "lladdr", c.MACA, "dev", p.IfB, "nud", "permanent"); err != nil {
			return nil, err
		}
	}
	for _, x := range append([]netip.Addr{p.AddrA}, p.ExtraA...) {
		if err := ip("-n", p.NsA, "addr", "add", prefixed(x), "dev", p.IfA); err != nil {
			return nil, err
		}
	}
	if err := ip("-n", p.NsB, "addr", "add", prefixed(p.AddrB), "dev", p.IfB); err != nil {
		return nil, err
	}
	// Loopback up in both, as on every real host: an error the stack
	// makes for itself (ICMP host unreachable when ARP for an on-link
	// address fails) is delivered over lo; with lo down it was sent and
	// never received.
	for _, ns := range []string{p.NsA, p.NsB} {
		if err := ip("-n", ns, "link", "set", "lo", "up"); err != nil {
			return nil, err
		}
	}
	if err := ip("-n", p.NsA, "link", "set", p.IfA, "up"); err != nil {
		return nil, err
	}
	if err := ip("-n", p.NsB, "link", "set", p.IfB, "up"); err != nil {
		return nil, err
	}
	// A veth's carrier comes up asynchronously after "link set up", and
	// until it does the kernel drops what is sent (seen: a QP's first
	// SENDs lost for its whole retry budget, 0.5 s, under -race): wait
	// (bounded) until both ends report LOWER_UP.
	for _, e := range [][2]string{{p.NsA, p.IfA}, {p.NsB, p.IfB}} {
		if err := waitLowerUp(e[0], e[1], 5*time.Second); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// waitLowerUp waits until interface ifc in namespace ns has its carrier
// (the LOWER_UP flag of `ip link show`), at most d.
func waitLowerUp(ns, ifc string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		out, err := exec.Command("ip", "-n", ns, "-o", "link", "show", "dev", ifc).CombinedOutput()
		if err == nil && strings.Contains(string(out), "LOWER_UP") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s in %s: no carrier after %v: %s", ifc, ns, d, strings.TrimSpace(string(out)))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// prefixed is a with the pair's prefix length: /24 for IPv4, /64 for IPv6.
func prefixed(a netip.Addr) string {
	if a.Unmap().Is4() {
		return a.Unmap().String() + "/24"
	}
	return a.String() + "/64"
}

// Close deletes both namespaces (and with them the veth pair).
func (p *Pair) Close() error {
	return errors.Join(Delete(p.NsA), Delete(p.NsB))
}
