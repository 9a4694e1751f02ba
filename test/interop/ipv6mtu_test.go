//go:build linux

package interop

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The IPv6 and path-MTU cells, in the same VM boot as the matrix
// (labSuites), run by runCell:
//
//   - IPv6: ibv_rc_pingpong, ib_write_bw, ib_read_bw and ib_send_bw over
//     rxe0's link-local RoCEv2 GID (VMLL, index Lab.GID6Index) and rocev2d
//     on HostLL%rv2br0, both roles. Every RoCEv2 packet of the capture must
//     be IPv6 (ICRC checked over the IPv6 header like every other); rxe's
//     UDP checksums, flow labels and hop limits are reported. The
//     out-of-band exchanges: ibv_rc_pingpong as client dials rocev2d at
//     HostLL%eth0 (IPv6 with its zone), as server it listens on IPv4 only,
//     so rocev2d dials VMIP and runs RoCEv2 from --bind HostLL%rv2br0;
//     perftest 4.5 speaks its exchange over IPv4 only ("Address family for
//     hostname not supported" for an IPv6 server), so the perftest cells
//     exchange over 192.0.2.0/24 and carry RoCEv2 over IPv6 — the rocev2d
//     client then must not bind its TCP connection to the IPv6 --bind.
//   - Path MTU: the wire goes to MTU 9000 (Lab.SetWireMTU: tap, bridge and
//     the VM's eth0; rxe0's active MTU becomes 4096) for cells at -m 4096
//     (pingpong, write, read, send; both roles) and one of each at -m 256,
//     512 and 2048 (both roles), then back to 1500. Every packet of a
//     multi-packet message but the last must carry exactly the path MTU,
//     none more; the data checks place payloads at that MTU.
func init() { labSuites = append(labSuites, ipv6MTUSuite) }

// hostLLZone is the host's link-local address with its zone.
const hostLLZone = HostLL + "%" + Bridge

func ipv6MTUSuite(t *testing.T, ctx context.Context, lab *Lab, img *Image, add func(row)) {
	defer func() {
		if err := lab.SetWireMTU(ctx, DefaultWireMTU); err != nil {
			t.Errorf("restoring the wire MTU: %v", err)
		}
	}()
	for _, c := range ipv6MTUCells(lab.GID6Index, lab.GIDIndex) {
		t.Run(c.name, func(t *testing.T) {
			r := row{cell: c.label, direction: c.direction(), result: "FAIL"}
			defer func() {
				if r.result == "FAIL" && r.packets == "" {
					r.counters = "stopped before the checks: " + r.counters
				}
				add(r)
			}()
			if c.ipv6 && lab.GID6Index < 0 {
				r.counters = "rxe0 has no link-local RoCEv2 GID"
				t.Fatal("rxe0 has no link-local RoCEv2 GID (vmagent without rocev2lab.ipv6=1?)")
			}
			if err := lab.SetWireMTU(ctx, c.wireMTU); err != nil {
				r.counters = err.Error()
				t.Fatal(err)
			}
			// The row and the log get what the capture says about the
			// IPv6 headers and the payload sizes.
			var summary string
			defer func() {
				if summary != "" {
					r.counters += " | " + summary
				}
			}()
			inner := c.captureCheck
			c.captureCheck = func(st *CaptureStats, hostOut, vmOut string) []string {
				summary = fmt.Sprintf("payload max rocev2d %d rxe %d, FIRST/MIDDLE rocev2d %v rxe %v",
					st.HostMaxPayload, st.VMMaxPayload, sortedKeys(st.HostMiddlePayloads), sortedKeys(st.VMMiddlePayloads))
				if c.ipv6 {
					summary = st.IPv6Summary() + "; " + summary
				}
				t.Logf("%s: wire MTU %d, path MTU %d: %s", c.name, lab.WireMTU, c.pathMTU, summary)
				return inner(st, hostOut, vmOut)
			}
			runCell(t, ctx, lab, img, c, &r)
		})
	}
}

// ipv6MTUCells returns the IPv6 cells (gid6: rxe0's link-local GID index)
// and the path-MTU cells (gid4: its IPv4 GID index).
func ipv6MTUCells(gid6, gid4 int) []cell {
	var cs []cell
	ppIters := max(iters()/2, 10)
	bwIters := max(iters(), 20)
	for _, server := range []bool{true, false} {
		role := map[bool]string{true: "server", false: "client"}[server]
		// IPv6: path MTU 1024 on the 1500-byte wire.
		cs = append(cs, ppCell("ipv6", role, server, gid6, true, 4096, 1024, ppIters))
		for _, pt := range []struct{ tool, sub string }{{"ib_write_bw", "write-bw"}, {"ib_read_bw", "read-bw"}, {"ib_send_bw", "send-bw"}} {
			cs = append(cs, bwCell("ipv6", role, server, gid6, true, pt.tool, pt.sub, 4096, 1024, bwIters))
		}
	}
	for _, server := range []bool{true, false} {
		role := map[bool]string{true: "server", false: "client"}[server]
		// Path MTU 4096 on the 9000-byte wire: 2 packets per pingpong
		// message, 4 per bandwidth message.
		cs = append(cs, ppCell("mtu4096", role, server, gid4, false, 8192, 4096, ppIters))
		for _, pt := range []struct{ tool, sub string }{{"ib_write_bw", "write-bw"}, {"ib_read_bw", "read-bw"}, {"ib_send_bw", "send-bw"}} {
			cs = append(cs, bwCell("mtu4096", role, server, gid4, false, pt.tool, pt.sub, 16384, 4096, bwIters))
		}
		// The other IB MTUs, one test each: 16, 8 and 2 packets per
		// message.
		cs = append(cs, ppCell("mtu256", role, server, gid4, false, 4096, 256, ppIters),
			bwCell("mtu512", role, server, gid4, false, "ib_read_bw", "read-bw", 4096, 512, bwIters),
			bwCell("mtu2048", role, server, gid4, false, "ib_write_bw", "write-bw", 4096, 2048, bwIters))
	}
	return cs
}

// ppCell is an ibv_rc_pingpong -c cell at path MTU mtu, over IPv6 or IPv4.
func ppCell(tag, role string, server bool, gid int, ipv6 bool, size, mtu, n int) cell {
	perMsg := (size + mtu - 1) / mtu
	bind := HostIP
	if ipv6 {
		bind = hostLLZone
	}
	c := cell{
		name:          fmt.Sprintf("rc_pingpong_%d_%s_rocev2d_%s", size, tag, role),
		label:         fmt.Sprintf("ibv_rc_pingpong -s %d -m %d -n %d -c%s", size, mtu, n, ipv6Label(ipv6)),
		tool:          fmt.Sprintf("ibv_rc_pingpong -d rxe0 -g %d -m %d -n %d -s %d -c", gid, mtu, n, size),
		toolName:      "ibv_rc_pingpong",
		ours:          []string{"pingpong", "--bind", bind, "-m", strconv.Itoa(mtu), "-s", strconv.Itoa(size), "-n", strconv.Itoa(n), "-c", "-v", "--timeout", "120s"},
		check:         func(who, out string) []string { return checkPingpongOutput(who, out, size, n) },
		data:          func(string) (DataCheck, error) { return pingpongData, nil },
		dataWhat:      "every SEND carries the -c buffer (0 at each 4096-byte page start, 0x7b elsewhere)",
		rocev2dServer: server,
		minPkts:       2 * n * perMsg,
		wantPkts:      2 * n * (perMsg + 1),
		ipv6:          ipv6,
		pathMTU:       mtu,
	}
	if ipv6 {
		// ibv_rc_pingpong dials any address family (its server listens
		// on IPv4 only, so rocev2d as client dials VMIP).
		c.toolServer = HostLL + "%" + VMDev
	}
	return finishCell(c, size, mtu)
}

// bwCell is a perftest bandwidth cell at path MTU mtu, over IPv6 (GID
// index gid; the exchange stays on IPv4) or IPv4.
func bwCell(tag, role string, server bool, gid int, ipv6 bool, tool, sub string, size, mtu, n int) cell {
	bind := HostIP
	if ipv6 {
		bind = hostLLZone
	}
	args := []string{"-s", strconv.Itoa(size), "-n", strconv.Itoa(n), "-m", strconv.Itoa(mtu)}
	label := strings.Join(append([]string{tool}, args...), " ") + ipv6Label(ipv6)
	ours := append([]string{sub, "--bind", bind, "-v", "--timeout", "120s"}, args...)
	dc, what, check := perfDataCheck(sub, server)
	if check {
		ours = append(ours, "--check")
		label += " (rocev2d --check)"
	}
	c := cell{
		name:     fmt.Sprintf("%s_%d_%s_rocev2d_%s", tool, size, tag, role),
		label:    label,
		tool:     fmt.Sprintf("%s -d rxe0 -x %d -F %s", tool, gid, strings.Join(args, " ")),
		toolName: tool,
		ours:     ours,
		check: func(who, out string) []string {
			p := checkPerftestOutput(who, out, size, n)
			if check && who == "rocev2d" && !strings.Contains(out, " data check: ok") {
				p = append(p, "rocev2d --check: no \"data check: ok\" line")
			}
			if want := fmt.Sprintf("Mtu             : %d[B]", mtu); !strings.Contains(out, want) {
				p = append(p, fmt.Sprintf("%s: no %q line (the negotiated MTU)", who, want))
			}
			return p
		},
		data:          dc,
		dataWhat:      what,
		rocev2dServer: server,
		minPkts:       n * ((size + mtu - 1) / mtu),
		ipv6:          ipv6,
		pathMTU:       mtu,
	}
	return finishCell(c, size, mtu)
}

func ipv6Label(ipv6 bool) string {
	if ipv6 {
		return " IPv6 fe80::"
	}
	return ""
}

// finishCell sets the wire MTU a cell needs (9000 beyond 1024: rxe0's
// active MTU is 1024 on 1500) and its capture checks: the addresses'
// family, and the payload sizes the path MTU allows.
func finishCell(c cell, size, mtu int) cell {
	if mtu > rxeActiveMTU(DefaultWireMTU) || strings.Contains(c.name, "_mtu") {
		// All path-MTU cells run on the jumbo wire, so that the ones
		// below rxe0's active MTU show a smaller path MTU is kept.
		c.wireMTU = JumboWireMTU
	}
	prev := c.captureCheck
	c.captureCheck = func(st *CaptureStats, hostOut, vmOut string) []string {
		var p []string
		if prev != nil {
			p = prev(st, hostOut, vmOut)
		}
		return append(p, checkFamilyAndMTU(st, c.ipv6, size, mtu)...)
	}
	return c
}

// checkFamilyAndMTU checks that every RoCEv2 packet of the capture was of
// the cell's address family, and the payload sizes: at most mtu, exactly
// mtu on every FIRST or MIDDLE packet (every packet of a message but the
// last), and some of those when the messages (size) span several packets.
func checkFamilyAndMTU(st *CaptureStats, ipv6 bool, size, mtu int) []string {
	var p []string
	if ipv6 && st.IPv6 != st.RoCE {
		p = append(p, fmt.Sprintf("%d of %d RoCEv2 packets were IPv6, want all", st.IPv6, st.RoCE))
	}
	if !ipv6 && st.IPv6 != 0 {
		p = append(p, fmt.Sprintf("%d RoCEv2 packets were IPv6, want none", st.IPv6))
	}
	for _, side := range []struct {
		who string
		max int
		mid map[int]int
	}{{"rocev2d", st.HostMaxPayload, st.HostMiddlePayloads}, {"rxe", st.VMMaxPayload, st.VMMiddlePayloads}} {
		if side.max > mtu {
			p = append(p, fmt.Sprintf("%s sent a %d-byte payload, beyond the path MTU %d", side.who, side.max, mtu))
		}
		for n := range side.mid {
			if n != mtu {
				p = append(p, fmt.Sprintf("%s sent FIRST/MIDDLE packets of %v bytes, want exactly the path MTU %d", side.who, sortedKeys(side.mid), mtu))
				break
			}
		}
	}
	if size > mtu && len(st.HostMiddlePayloads)+len(st.VMMiddlePayloads) == 0 {
		p = append(p, fmt.Sprintf("no FIRST/MIDDLE packet though %d-byte messages span %d packets", size, (size+mtu-1)/mtu))
	}
	return p
}

func sortedKeys(m map[int]int) []int {
	k := make([]int, 0, len(m))
	for n := range m {
		k = append(k, n)
	}
	sort.Ints(k)
	return k
}

// toolServerAddr is the server address the tool in the VM is given when
// rocev2d is the server; ourServerAddr the one rocev2d is given as
// client.
func (c cell) toolServerAddr() string {
	if c.toolServer != "" {
		return c.toolServer
	}
	return HostIP
}

func (c cell) ourServerAddr() string {
	if c.ourServer != "" {
		return c.ourServer
	}
	return VMIP
}
