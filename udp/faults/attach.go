//go:build linux

package faults

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/gorocev2/rocev2/internal/netns"
)

// Mode selects how the programs are attached.
type Mode int

const (
	// ModeAuto uses TCX and falls back to ModeTC when the kernel lacks it.
	ModeAuto Mode = iota
	// ModeTCX attaches with BPF links of type TCX (kernel >= 6.6).
	ModeTCX
	// ModeTC installs a clsact qdisc (if absent) and a cls_bpf
	// direct-action filter with iproute2's tc, loading the program from a
	// pin in a private bpffs mount.
	ModeTC
)

// String names the mode.
func (m Mode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModeTCX:
		return "tcx"
	case ModeTC:
		return "tc"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// Options are Attach's optional settings. The zero value attaches to the
// egress hook of an interface in the caller's network namespace, with TCX
// if available.
type Options struct {
	// Netns is the network namespace of the interface: a name under
	// /var/run/netns (as `ip netns add` makes) or a path. Empty means the
	// calling thread's namespace.
	Netns string
	// Egress and Ingress select the hooks; both false means Egress only.
	// Both hooks of one interface fault both directions of its traffic.
	Egress, Ingress bool
	// Mode selects TCX or tc (cls_bpf).
	Mode Mode
}

// tcPref is the priority of the cls_bpf filter in ModeTC.
const tcPref = 4791

// attachment is an attached set of hooks.
type attachment interface{ detach() error }

// Attach loads the injector with cfg and attaches it to the egress hook of
// interface ifname in the caller's network namespace.
func Attach(ifname string, cfg Config) (*Injector, error) {
	return AttachWith(ifname, cfg, nil)
}

// AttachWith is Attach with options (namespace, hooks, mode). ifname may
// also be a decimal interface index.
func AttachWith(ifname string, cfg Config, opts *Options) (*Injector, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if !o.Egress && !o.Ingress {
		o.Egress = true
	}
	inj, err := Load(cfg)
	if err != nil {
		return nil, err
	}
	err = netns.Do(o.Netns, func() error {
		idx, name, err := resolve(ifname)
		if err != nil {
			return err
		}
		var hooks []Hook
		if o.Egress {
			hooks = append(hooks, Egress)
		}
		if o.Ingress {
			hooks = append(hooks, Ingress)
		}
		mode := o.Mode
		if mode == ModeAuto || mode == ModeTCX {
			inj.att, err = attachTCX(inj, idx, hooks)
			if err == nil || mode == ModeTCX || !(errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EINVAL)) {
				return err
			}
		}
		inj.att, err = attachTC(inj, name, o.Netns, hooks)
		return err
	})
	if err != nil {
		inj.close()
		return nil, err
	}
	return inj, nil
}

// AttachIndex attaches to the interface with index ifindex.
func AttachIndex(ifindex int, cfg Config, opts *Options) (*Injector, error) {
	return AttachWith(strconv.Itoa(ifindex), cfg, opts)
}

// resolve returns the index and name of an interface given by name or
// decimal index, in the calling thread's namespace.
func resolve(ifname string) (int, string, error) {
	if n, err := strconv.Atoi(ifname); err == nil {
		ifi, err := net.InterfaceByIndex(n)
		if err != nil {
			return 0, "", fmt.Errorf("faults: interface index %d: %w", n, err)
		}
		return ifi.Index, ifi.Name, nil
	}
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return 0, "", fmt.Errorf("faults: interface %q: %w", ifname, err)
	}
	return ifi.Index, ifi.Name, nil
}

// tcxAttachment is a set of TCX links.
type tcxAttachment []link.Link

func (a tcxAttachment) detach() error {
	var errs []error
	for _, l := range a {
		errs = append(errs, l.Close())
	}
	return errors.Join(errs...)
}

func attachTCX(inj *Injector, ifindex int, hooks []Hook) (attachment, error) {
	var a tcxAttachment
	for _, h := range hooks {
		at := ebpf.AttachTCXEgress
		if h == Ingress {
			at = ebpf.AttachTCXIngress
		}
		l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: inj.progs[h], Attach: at})
		if err != nil {
			a.detach()
			return nil, fmt.Errorf("faults: attach tcx %s on ifindex %d: %w", h, ifindex, err)
		}
		a = append(a, l)
	}
	return a, nil
}

// tcAttachment is cls_bpf filters installed with tc.
type tcAttachment struct {
	ifname, netns string
	nsPath        string // namespace given as a path: detach enters it
	hooks         []Hook
	addedQdisc    bool
}

// tc runs iproute2's tc (in the namespace when set).
func tc(netns string, args ...string) error {
	if netns != "" && !strings.ContainsRune(netns, '/') {
		args = append([]string{"-n", netns}, args...)
	}
	out, err := exec.Command("tc", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("faults: tc %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func attachTC(inj *Injector, ifname, netns string, hooks []Hook) (attachment, error) {
	if _, err := exec.LookPath("tc"); err != nil {
		return nil, fmt.Errorf("faults: no TCX and no iproute2 tc for the cls_bpf fallback: %w", err)
	}
	var nsPath string
	if strings.ContainsRune(netns, '/') {
		// Called on a thread inside the namespace: tc inherits it.
		nsPath, netns = netns, ""
	}
	dir, err := os.MkdirTemp("", "rocev2-faults-bpffs-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(dir)
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return nil, fmt.Errorf("faults: mount bpffs for tc: %w", err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	a := &tcAttachment{ifname: ifname, netns: netns, nsPath: nsPath}
	if err := tc(netns, "qdisc", "add", "dev", ifname, "clsact"); err == nil {
		a.addedQdisc = true
	} else if !strings.Contains(err.Error(), "File exists") && !strings.Contains(err.Error(), "Exclusivity flag on") {
		return nil, err
	}
	for _, h := range hooks {
		pin := filepath.Join(dir, h.String())
		if err := inj.progs[h].Pin(pin); err != nil {
			a.detach()
			return nil, fmt.Errorf("faults: pin %s program: %w", h, err)
		}
		err := tc(netns, "filter", "add", "dev", ifname, h.String(), "pref", strconv.Itoa(tcPref),
			"bpf", "direct-action", "pinned", pin)
		inj.progs[h].Unpin()
		if err != nil {
			a.detach()
			return nil, err
		}
		a.hooks = append(a.hooks, h)
	}
	return a, nil
}

func (a *tcAttachment) detach() error {
	return netns.Do(a.nsPath, a.detachHere)
}

func (a *tcAttachment) detachHere() error {
	var errs []error
	for _, h := range a.hooks {
		errs = append(errs, tc(a.netns, "filter", "del", "dev", a.ifname, h.String(), "pref", strconv.Itoa(tcPref)))
	}
	if a.addedQdisc {
		errs = append(errs, tc(a.netns, "qdisc", "del", "dev", a.ifname, "clsact"))
	}
	return errors.Join(errs...)
}
