//go:build linux

package interop

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// The guest sometimes stops answering altogether (no ARP, no command
// channel, not one console line even at log level 7: a CPU looping with
// interrupts off, which a TCG guest's watchdogs do not report). To see
// where, qemu keeps a QMP socket in the VM's directory, the guest kernel
// boots without KASLR (its addresses are then the same in every boot), and
// before a reboot the lab reads the stuck CPU's registers and the top of
// its stack through QMP; after the reboot the new guest's /proc/kallsyms
// names those addresses.

// qmpPath is the VM's QMP socket.
func (l *Lab) qmpPath() string { return filepath.Join(l.Dir, "qmp.sock") }

// qmpHuman runs human monitor commands on the VM's QMP socket and returns
// their outputs, in order.
func (l *Lab) qmpHuman(ctx context.Context, cmds ...string) ([]string, error) {
	var d net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := d.DialContext(dctx, "unix", l.qmpPath())
	if err != nil {
		return nil, fmt.Errorf("qmp: %w", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	r := bufio.NewReader(c)
	// reply reads lines until one that is not an asynchronous event.
	reply := func() (map[string]json.RawMessage, error) {
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return nil, fmt.Errorf("qmp: %w", err)
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(line, &m); err != nil {
				return nil, fmt.Errorf("qmp: %q: %w", line, err)
			}
			if _, ev := m["event"]; !ev {
				return m, nil
			}
		}
	}
	if _, err := reply(); err != nil { // the greeting
		return nil, err
	}
	send := func(v any) (map[string]json.RawMessage, error) {
		b, _ := json.Marshal(v)
		if _, err := c.Write(append(b, '\n')); err != nil {
			return nil, fmt.Errorf("qmp: %w", err)
		}
		m, err := reply()
		if err == nil && m["error"] != nil {
			err = fmt.Errorf("qmp: %s", m["error"])
		}
		return m, err
	}
	if _, err := send(map[string]string{"execute": "qmp_capabilities"}); err != nil {
		return nil, err
	}
	var outs []string
	for _, cmd := range cmds {
		m, err := send(map[string]any{"execute": "human-monitor-command", "arguments": map[string]string{"command-line": cmd}})
		if err != nil {
			return outs, err
		}
		var s string
		if err := json.Unmarshal(m["return"], &s); err != nil {
			return outs, fmt.Errorf("qmp: %s: %w", cmd, err)
		}
		outs = append(outs, s)
	}
	return outs, nil
}

// GuestCPU is where a VM's CPU was when the lab looked (GuestCPUState).
type GuestCPU struct {
	Registers string   // "info registers"
	Stack     string   // "x/32gx" at RSP: the top of the stack
	RIP       uint64   // the instruction pointer
	Text      []uint64 // RIP, then every stack word that looks like a kernel text address
}

var (
	ripRe  = regexp.MustCompile(`RIP=([0-9a-f]{16})`)
	rspRe  = regexp.MustCompile(`RSP=([0-9a-f]{16})`)
	wordRe = regexp.MustCompile(`0x(ffffffff[89a-f][0-9a-f]{7})`)
)

// GuestCPUState reads the VM's CPU registers and the top of its stack
// through QMP (qemu answers even when the guest does not).
func (l *Lab) GuestCPUState(ctx context.Context) (GuestCPU, error) {
	var g GuestCPU
	outs, err := l.qmpHuman(ctx, "info registers")
	if err != nil || len(outs) == 0 {
		return g, err
	}
	g.Registers = outs[0]
	if m := ripRe.FindStringSubmatch(g.Registers); m != nil {
		g.RIP, _ = strconv.ParseUint(m[1], 16, 64)
		g.Text = append(g.Text, g.RIP)
	}
	m := rspRe.FindStringSubmatch(g.Registers)
	if m == nil {
		return g, nil
	}
	if outs, err = l.qmpHuman(ctx, "x/32gx 0x"+m[1]); err != nil || len(outs) == 0 {
		return g, err
	}
	g.Stack = outs[0]
	for _, m := range wordRe.FindAllStringSubmatch(g.Stack, -1) {
		v, _ := strconv.ParseUint(m[1], 16, 64)
		g.Text = append(g.Text, v)
	}
	return g, nil
}

// GuestDevices returns qemu's view of the VM's interrupt and network
// state (the local APIC with its timer, interrupt counts, the virtio
// devices and the network's queues), for a guest that stopped answering:
// halted with interrupts enabled, it waits for an interrupt that never
// comes.
func (l *Lab) GuestDevices(ctx context.Context) string {
	const vnet = "/machine/peripheral-anon/device[0]/virtio-backend" // the lab's one virtio device
	cmds := []string{"info lapic", "info irq", "info virtio", "info network",
		"info virtio-queue-status " + vnet + " 0", "info virtio-queue-status " + vnet + " 1"} // receive, transmit
	outs, err := l.qmpHuman(ctx, cmds...)
	var b strings.Builder
	for i, c := range cmds {
		if i < len(outs) {
			fmt.Fprintf(&b, "(qemu) %s\n%s", c, outs[i])
		}
	}
	if err != nil {
		fmt.Fprintf(&b, "qmp: %v\n", err)
	}
	return b.String()
}

// NMI sends the VM's CPU a non-maskable interrupt: it leaves HLT whatever
// it waited for.
func (l *Lab) NMI(ctx context.Context) error {
	_, err := l.qmpHuman(ctx, "nmi")
	return err
}

// Symbolize names kernel addresses (symbol+offset) from the running
// guest's /proc/kallsyms. Without KASLR (the lab's guests boot with
// nokaslr) they may come from an earlier boot of the same kernel. The
// guest sorts its text symbols together with the addresses (16 hex digits
// sort as numbers) and returns the symbol line before each.
func (l *Lab) Symbolize(ctx context.Context, addrs []uint64) (map[uint64]string, error) {
	if len(addrs) == 0 {
		return nil, nil
	}
	var list strings.Builder
	for _, a := range addrs {
		fmt.Fprintf(&list, "%016x ~ADDR\n", a)
	}
	cmd := fmt.Sprintf("{ grep ' [tT] ' /proc/kallsyms; printf '%%s' '%s'; } | sort | grep -B1 ' ~ADDR$'", list.String())
	res, err := l.Run(ctx, cmd, 60*time.Second)
	if err != nil {
		return nil, err
	}
	out := map[uint64]string{}
	var prev string
	for _, line := range strings.Split(res.Output, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[1] == "~ADDR" {
			a, _ := strconv.ParseUint(f[0], 16, 64)
			if p := strings.Fields(prev); len(p) >= 3 && p[1] != "~ADDR" {
				base, _ := strconv.ParseUint(p[0], 16, 64)
				if base != 0 {
					out[a] = fmt.Sprintf("%s+%#x", p[2], a-base)
				}
			}
		}
		prev = line
	}
	return out, nil
}

// Describe is g's addresses with their names, RIP first.
func (g GuestCPU) Describe(names map[uint64]string) string {
	var b strings.Builder
	seen := map[uint64]bool{}
	for i, a := range g.Text {
		if seen[a] {
			continue
		}
		seen[a] = true
		what := "stack"
		if i == 0 && a == g.RIP {
			what = "RIP"
		}
		fmt.Fprintf(&b, "  %s %016x %s\n", what, a, names[a])
	}
	return b.String()
}
