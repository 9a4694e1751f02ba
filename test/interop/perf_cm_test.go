//go:build linux

package interop

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// perftest -R: ib_write_bw, ib_read_bw, ib_send_bw, ib_atomic_bw and the
// latency tests connect through rdma_cm (IB CM MADs to QP1) instead of the
// TCP exchange, rocev2d with -R in both roles. perftest 4.5 makes two RC connections on the port (18515):
// the first carries its exchange (each message one SEND), the second is
// the test QP's; at the end each side disconnects (DREQ/DREP). Besides
// every check of a clean cell (ICRC of every packet — the MADs too —,
// rocev2d pcap check, tshark, rxe's counters, resends), a cell checks the
// CM MADs in the capture (decoded with package cm): two connections, each
// REQ answered by a REP and an RTU, both disconnected, no REJ but "invalid
// service ID" from rxe to rocev2d's client (its request for the test QP
// can arrive before perftest listens again; perftest's own client retries
// the same way); that the test connection is the one between the QPs both
// sides print; that both run in rdma_cm mode (their headers); and the data
// on the wire of the test connection only.

// perfCMPort is perftest's port: rdma_cm's with -R.
const perfCMPort = 18515

// perfCMCells returns the -R cells: ib_write_bw, ib_read_bw, ib_send_bw
// (4096 B), ib_atomic_bw and the four latency tests against rocev2d as
// server and as client.
func perfCMCells(gidIndex int) []cell {
	var cs []cell
	for _, server := range []bool{true, false} {
		role := map[bool]string{true: "server", false: "client"}[server]
		for _, pt := range []struct {
			tool, sub string
			size, n   int
		}{
			{"ib_write_bw", "write-bw", 4096, 2 * iters()}, {"ib_read_bw", "read-bw", 4096, 2 * iters()},
			{"ib_send_bw", "send-bw", 4096, 2 * iters()}, {"ib_atomic_bw", "atomic-bw", 8, 2 * iters()},
			{"ib_write_lat", "write-lat", 64, iters()}, {"ib_read_lat", "read-lat", 64, iters()},
			{"ib_send_lat", "send-lat", 64, iters()}, {"ib_atomic_lat", "atomic-lat", 8, iters()},
		} {
			size, n := pt.size, pt.n
			args := []string{"-s", strconv.Itoa(size), "-n", strconv.Itoa(n)}
			label := strings.Join(append([]string{pt.tool, "-R"}, args...), " ")
			ours := append([]string{pt.sub, "-R", "--bind", HostIP, "-v", "--timeout", "120s"}, args...)
			dc, what, check := perfDataCheck(pt.sub, server)
			if check {
				ours = append(ours, "--check")
				label += " (rocev2d --check)"
			}
			sub := pt.sub
			cs = append(cs, cell{
				name:     fmt.Sprintf("%s_R_%d_rocev2d_%s", pt.tool, size, role),
				label:    label,
				tool:     fmt.Sprintf("%s -R -d rxe0 -x %d -F %s", pt.tool, gidIndex, strings.Join(args, " ")),
				toolName: pt.tool,
				ours:     ours,
				check: func(who, out string) []string {
					p := checkPerftestOutput(who, out, size, n)
					if !strings.Contains(out, " rdma_cm QPs\t : ON") || !strings.Contains(out, " Data ex. method : rdma_cm") {
						p = append(p, who+`: its header does not say "rdma_cm QPs : ON" and "Data ex. method : rdma_cm"`)
					}
					if check && who == "rocev2d" && !strings.Contains(out, " data check: ok") {
						p = append(p, "rocev2d --check: no \"data check: ok\" line")
					}
					return p
				},
				data:          perfCMData(dc),
				dataWhat:      what,
				rocev2dServer: server,
				port:          perfCMPort, // rocev2d -R listens on TCP there too (to refuse clients without -R)
				waitVM:        func(ctx context.Context, lab *Lab) error { return waitCMListenVM(ctx, lab, perfCMPort, 20*time.Second) },
				captureCheck: func(st *CaptureStats, hostOut, vmOut string) []string {
					return checkPerfCMCapture(st, hostOut, sub, server)
				},
				minPkts: n,
				// The server of a READ or atomic latency test is passive
				// and prints no result.
				passiveServer: pt.tool == "ib_read_lat" || pt.tool == "ib_atomic_lat",
			})
		}
	}
	return cs
}

// waitCMListenVM waits until an rdma_cm ID listens on port in the VM (the
// kernel's resource tracking: `rdma resource show cm_id`).
func waitCMListenVM(ctx context.Context, lab *Lab, port int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	want := regexp.MustCompile(`state LISTEN .*src-addr \S+:` + strconv.Itoa(port) + `\b`)
	var last string
	for {
		r, err := lab.Run(ctx, "rdma resource show cm_id", 10*time.Second)
		if err != nil {
			return err
		}
		if want.MatchString(r.Output) {
			return nil
		}
		last = r.Output
		if time.Now().After(deadline) {
			return fmt.Errorf("no rdma_cm listener on port %d after %v; `rdma resource show cm_id`:\n%s", port, timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// reAddrQPN matches the QPN of perftest's (and rocev2d's) address lines.
var reAddrQPN = regexp.MustCompile(`(?m)^ (local|remote) address: LID \S+ QPN (\S+) `)

// perfQPNs returns the QPNs of rocev2d's local and remote address lines.
func perfQPNs(out string) (local, remote uint32, err error) {
	found := 0
	for _, m := range reAddrQPN.FindAllStringSubmatch(out, -1) {
		v, perr := strconv.ParseUint(m[2], 0, 32)
		if perr != nil {
			return 0, 0, fmt.Errorf("QPN %q in rocev2d's %s address line: %v", m[2], m[1], perr)
		}
		if m[1] == "local" {
			local, found = uint32(v), found|1
		} else {
			remote, found = uint32(v), found|2
		}
	}
	if found != 3 {
		return 0, 0, fmt.Errorf("rocev2d printed no local and remote address lines")
	}
	return local, remote, nil
}

// perfCMData restricts a perftest data check to the test connection's RC
// packets: perftest -R's exchange runs as SENDs on a QP of its own, and the
// CM's MADs are UD datagrams.
func perfCMData(dc func(hostOut string) (DataCheck, error)) func(hostOut string) (DataCheck, error) {
	if dc == nil {
		return nil
	}
	return func(hostOut string) (DataCheck, error) {
		check, err := dc(hostOut)
		if err != nil {
			return nil, err
		}
		local, remote, err := perfQPNs(hostOut)
		if err != nil {
			return nil, err
		}
		return func(p Payload) string {
			// QPNs are per side: the exchange's QP on one side may have
			// the number of the test QP on the other.
			if p.UD != nil || (p.FromHost && p.DestQP != remote) || (!p.FromHost && p.DestQP != local) {
				return ""
			}
			return check(p)
		}, nil
	}
}

// checkPerfCMCapture checks the CM MADs of a -R cell and that the test QPs
// rocev2d printed are the ones the CM connected.
func checkPerfCMCapture(st *CaptureStats, hostOut, sub string, rocev2dServer bool) []string {
	var p []string
	active, passive := "vm", "host"
	if !rocev2dServer {
		active, passive = "host", "vm"
	}
	if len(st.CMPairs) != 2 {
		p = append(p, fmt.Sprintf("CM: %d connections (REQ answered by a REP), want 2 (perftest's exchange and the test QP): %v", len(st.CMPairs), st.CM))
	}
	for _, m := range []struct {
		who, msg string
		min, max int
	}{
		{active, "REQ", 2, 0}, {passive, "REP", 2, 0}, {active, "RTU", 2, 0},
		{passive, "REQ", 0, 0}, {active, "REP", 0, 0}, {passive, "RTU", 0, 0},
	} {
		n := st.CM[m.who+" "+m.msg]
		if n < m.min || (m.max >= m.min && n > m.max) || (m.min == 0 && n != 0) {
			p = append(p, fmt.Sprintf("CM: %d %s from %s (%s), want %s", n, m.msg, m.who, cmSideName(m.who), cmWant(m.min, m.max)))
		}
	}
	if d := st.CM["host DREQ"] + st.CM["vm DREQ"]; d < 2 {
		p = append(p, fmt.Sprintf("CM: %d DREQ, want one for each connection at least", d))
	}
	if d := st.CM["host DREP"] + st.CM["vm DREP"]; d < 2 {
		p = append(p, fmt.Sprintf("CM: %d DREP, want one for each connection at least", d))
	}
	for k, v := range st.CM {
		if !strings.Contains(k, " REJ") || strings.HasSuffix(k, " REJ") {
			continue
		}
		// rocev2d's client may ask for the test QP's connection before
		// perftest's server listens again: rxe refuses, rocev2d retries.
		if k == "vm REJ invalid service ID" && !rocev2dServer {
			continue
		}
		p = append(p, fmt.Sprintf("CM: %d %s", v, k))
	}
	local, remote, err := perfQPNs(hostOut)
	if err != nil {
		return append(p, err.Error())
	}
	if !slices.Contains(st.CMPairs, [2]uint32{local, remote}) {
		p = append(p, fmt.Sprintf("CM: no REQ/REP connected rocev2d's QP %#x with the tool's %#x (pairs {host, vm}: %#x)", local, remote, st.CMPairs))
	}
	write, read, send, atomic := []string{"RC_RDMA_WRITE_FIRST", "RC_RDMA_WRITE_ONLY"}, []string{"RC_RDMA_READ_REQUEST"},
		[]string{"RC_SEND_FIRST", "RC_SEND_ONLY"}, []string{"RC_COMPARE_SWAP", "RC_FETCH_ADD"}
	ops := map[string][]string{"write-bw": write, "read-bw": read, "send-bw": send, "atomic-bw": atomic,
		"write-lat": write, "read-lat": read, "send-lat": send, "atomic-lat": atomic}[sub]
	who := "host"
	if rocev2dServer {
		who = "vm  "
	}
	n := 0
	for _, op := range ops {
		n += st.Opcodes[who+" "+op]
	}
	if n == 0 {
		p = append(p, fmt.Sprintf("no %s from the client (%s) in the capture", strings.Join(ops, " or "), strings.TrimSpace(who)))
	}
	return p
}

func cmSideName(who string) string {
	if who == "host" {
		return "rocev2d"
	}
	return "rxe"
}

func cmWant(min, max int) string {
	switch {
	case min == 0 && max == 0:
		return "none"
	case max == min:
		return strconv.Itoa(min)
	}
	return fmt.Sprintf("at least %d", min)
}
