//go:build linux

package interop

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/cm"
)

// The connection-storm cells: rocev2d's cmtime and ucmatose against
// librdmacm's of rdma-core 44 in the VM, both roles, through runCMCell (the
// checks of every rdma_cm cell, the capture's MADs counted per kind).
// cmtime: cmtimeConns connections requested at once, then disconnected at
// once by the client, no data; its server never ends by itself (rocev2d's
// is stopped with SIGTERM, the tool killed). ucmatose: -c connections at
// once, -C messages of -S bytes each way on each (the server's first),
// then every connection disconnected by the server.

func init() { labSuites = append(labSuites, cmStormSuite) }

const (
	// cmtimeConns is cmtime's default -c; cmtimeMany the storm's.
	cmtimeConns, cmtimeMany = 100, 1000
	// cmtimePort, ucmatosePort: both tools' default port.
	cmtimePort, ucmatosePort = 7471, 7471
)

// ucmatoseRun is one ucmatose cell's -c, -C and -S.
type ucmatoseRun struct{ conns, count, size int }

func (u ucmatoseRun) args() string { return fmt.Sprintf("-c %d -C %d -S %d", u.conns, u.count, u.size) }

// ucmatoseRuns: -c 10 with the default messages, more and larger
// messages, multi-packet ones, and a disconnect storm from the server (100
// connections, one message each way). The bursts stay below what the
// 1-vCPU TCG VM takes in one piece (about 256 packets: its virtio ring):
// -c 10 -C 50 -S 8192 put 10 QPs x 128 packets (each QP's window) on the
// wire at once and rxe's rcvd_pkts fell 262 short of the tap's, which
// the go-back-N resends then repaired (the VM dropped them, not rxe's
// protocol: rxe sends as much from its side).
var ucmatoseRuns = []ucmatoseRun{{10, 10, 100}, {10, 20, 1024}, {2, 10, 8192}, {100, 1, 64}}

func cmStormSuite(t *testing.T, ctx context.Context, lab *Lab, img *Image, add func(row)) {
	for _, c := range cmStormCells() {
		t.Run(c.name, func(t *testing.T) {
			dir := "rocev2d client -> tool server (VM)"
			if c.rocev2dServer {
				dir = "rocev2d server <- tool client (VM)"
			}
			r := row{cell: c.label, direction: dir, result: "FAIL"}
			defer func() {
				if r.result == "FAIL" && r.packets == "" {
					r.counters = "stopped before the checks: " + r.counters
				}
				add(r)
			}()
			runCMCell(t, ctx, lab, img, c, &r)
		})
	}
}

func cmStormCells() []cmCell {
	var cs []cmCell
	for _, server := range []bool{true, false} {
		role := map[bool]string{true: "server", false: "client"}[server]
		clientHost := !server
		for _, n := range []int{cmtimeConns, cmtimeMany} {
			// 1000 requests at once take the VM's cmtime server ~1.8 s
			// to answer: rocev2d resends the REQs it has no answer to
			// after the 1.07 s its REQ advertises (rdmacm.Options; Linux waits
			// ~5 s), and rxe's CM answers each duplicate with an MRA;
			// so with its DREQs (seen: 206 resent, one answered twice).
			resends := n == cmtimeMany && clientHost
			c := cmCell{name: "cmtime_c" + strconv.Itoa(n) + "_rocev2d_" + role, toolName: "cmtime", rocev2dServer: server,
				label: fmt.Sprintf("cmtime -c %d (connect all, disconnect all)", n), vmListenPS: "TCP",
				check: func(hostOut, vmOut string) []string { return checkCmtimeOutputs(hostOut, vmOut, clientHost, n) },
				wire:  func() wireCheck { return cmStormWire(clientHost, n, false, 0, 0, resends) },
			}
			if server {
				c.host = []string{"cmtime", "-b", HostIP, "--counters"}
				c.vm = fmt.Sprintf("cmtime -s %s -c %d", HostIP, n)
				c.stopHost = true
			} else {
				c.host = []string{"cmtime", "-s", VMIP, "-b", HostIP, "-c", strconv.Itoa(n), "--timeout", "120s", "--counters"}
				c.vm = "cmtime -b " + VMIP
				c.vmListen, c.killVM, c.wantVM = cmtimePort, true, -1
			}
			cs = append(cs, c)
		}

		for _, u := range ucmatoseRuns {
			c := cmCell{name: fmt.Sprintf("ucmatose_c%d_C%d_S%d_rocev2d_%s", u.conns, u.count, u.size, role), toolName: "ucmatose", rocev2dServer: server,
				label: "ucmatose " + u.args(), vmListenPS: "TCP",
				check: func(hostOut, vmOut string) []string { return checkUcmatoseOutputs(hostOut, vmOut, clientHost) },
				wire:  func() wireCheck { return cmStormWire(clientHost, u.conns, true, u.count, u.size, false) },
			}
			if server {
				c.host = append([]string{"ucmatose", "-b", HostIP, "--timeout", "120s", "--counters"}, strings.Fields(u.args())...)
				c.vm = fmt.Sprintf("ucmatose -s %s %s", HostIP, u.args())
			} else {
				c.host = append([]string{"ucmatose", "-s", VMIP, "-b", HostIP, "--timeout", "120s", "--counters"}, strings.Fields(u.args())...)
				c.vm = fmt.Sprintf("ucmatose -b %s %s", VMIP, u.args())
				c.vmListen = ucmatosePort
			}
			cs = append(cs, c)
		}

		// The client asks for a traffic class (-t 32: DSCP 8); the
		// server, which sets none, must answer in it (Linux's CM takes
		// the passive path from the REQ).
		u := ucmatoseRun{2, 10, 1024}
		c := cmCell{name: "ucmatose_tos32_rocev2d_" + role, toolName: "ucmatose", rocev2dServer: server,
			label: "ucmatose " + u.args() + " -t 32 (client)", vmListenPS: "TCP", dscp: 8,
			check: func(hostOut, vmOut string) []string { return checkUcmatoseOutputs(hostOut, vmOut, clientHost) },
			wire:  func() wireCheck { return cmStormWire(clientHost, u.conns, true, u.count, u.size, false) },
		}
		if server {
			c.host = append([]string{"ucmatose", "-b", HostIP, "--timeout", "120s", "--counters"}, strings.Fields(u.args())...)
			c.vm = fmt.Sprintf("ucmatose -s %s %s -t 32", HostIP, u.args())
		} else {
			c.host = append([]string{"ucmatose", "-s", VMIP, "-b", HostIP, "-t", "32", "--timeout", "120s", "--counters"}, strings.Fields(u.args())...)
			c.vm = fmt.Sprintf("ucmatose -b %s %s", VMIP, u.args())
			c.vmListen = ucmatosePort
		}
		cs = append(cs, c)
	}

	// One connection more than the VM's ucmatose server takes (-c 1, the
	// rocev2d client's -c 2): cmatose's connect_handler rejects it with
	// rdma_reject, which Linux's rdma_cm sends as REJ "consumer reject"
	// (28) — what rocev2d's ucmatose server now sends too — and the
	// rocev2d client reports status 28. The VM's server then ends with
	// connect_handler's -ENOMEM (return status -12: exit 244).
	cs = append(cs, cmCell{name: "ucmatose_extra_rejected_rocev2d_client", toolName: "ucmatose",
		label:    "ucmatose -c 2 -C 0 -> server -c 1 (one refused)",
		host:     []string{"ucmatose", "-s", VMIP, "-b", HostIP, "-c", "2", "-C", "0", "--timeout", "120s", "--counters"},
		vm:       fmt.Sprintf("ucmatose -b %s -c 1 -C 0", VMIP),
		vmListen: ucmatosePort, vmListenPS: "TCP", wantHost: 28, wantVM: 244,
		check: func(hostOut, vmOut string) []string {
			var p []string
			if !strings.Contains(hostOut, "cmatose: event: RDMA_CM_EVENT_REJECTED, error: 28\n") {
				p = append(p, "rocev2d: no \"RDMA_CM_EVENT_REJECTED, error: 28\" (consumer reject)")
			}
			if !strings.Contains(vmOut, "cmatose: failing connection request") {
				p = append(p, "ucmatose: no \"failing connection request\"")
			}
			return p
		},
		wire: func() wireCheck {
			var recs []madRec
			check := func(p Payload) string {
				if isMAD, msg := madCheck(p, &recs); isMAD {
					return msg
				}
				return fmt.Sprintf("%s: no data with -C 0", p.Opcode)
			}
			done := func() []string {
				p := checkMADs(recs, []madSpec{{true, "REQ", 2, -1}, {false, "MRA", 0, -1}, {false, "REP", 1, -1}, {true, "RTU", 1, -1},
					{false, "REJ", 1, -1}, {true, "REJ", 0, -1}, {false, "DREQ", 0, -1}, {true, "DREP", 0, -1}, {true, "DREQ", 0, -1}, {false, "DREP", 0, -1}})
				for _, m := range recs {
					if m.name == "REJ" && !m.fromHost && m.detail != cm.RejConsumer.String() {
						p = append(p, fmt.Sprintf("rxe's REJ reason %q, want %q", m.detail, cm.RejConsumer))
					}
				}
				return p
			}
			return wireCheck{check: check, done: done, mads: &recs, what: "two REQs, one REP, one REJ (consumer reject)"}
		},
	})
	return cs
}

var (
	reCmtimeRow    = regexp.MustCompile(`(?m)^(create id|bind addr|resolve addr|resolve route|create qp|connect|disconnect|destroy) *:( +[0-9.]+){4}$`)
	reCmtimeServed = regexp.MustCompile(`(?m)^cmtime: served (\d+) connections, (\d+) disconnected by their client$`)
	reCmtimeOpen   = regexp.MustCompile(`(?m)^cmtime: open at exit: (\d+) QPs, `)
)

// checkCmtimeOutputs: the client's step lines and table (no failed
// connection: no "event:" line), rocev2d's server's count of connections
// served and disconnected by the client, and no QP left.
func checkCmtimeOutputs(hostOut, vmOut string, clientHost bool, conns int) []string {
	client, who := vmOut, "cmtime (VM)"
	if clientHost {
		client, who = hostOut, "rocev2d cmtime"
	}
	var p []string
	for _, l := range []string{"creating id", "resolving address", "resolving route", "creating qp", "connecting", "disconnecting", "destroying id",
		"step              total ms     max ms     min us  us / conn"} {
		if !strings.Contains(client, l+"\n") {
			p = append(p, fmt.Sprintf("%s: no %q line", who, l))
		}
	}
	if n := len(reCmtimeRow.FindAllString(client, -1)); n < 7 {
		p = append(p, fmt.Sprintf("%s: %d rows in its table, want 7 (8 with -b)", who, n))
	}
	if strings.Contains(client, "event:") || strings.Contains(client, "failure") {
		p = append(p, who+": a connection failed")
	}
	if !clientHost {
		m := reCmtimeServed.FindStringSubmatch(hostOut)
		if m == nil || m[1] != strconv.Itoa(conns) || m[2] != strconv.Itoa(conns) {
			p = append(p, fmt.Sprintf("rocev2d cmtime server: %q, want %d served and disconnected by their client", m, conns))
		}
		if m := reCmtimeOpen.FindStringSubmatch(hostOut); m == nil || m[1] != "0" {
			p = append(p, fmt.Sprintf("rocev2d cmtime server: QPs left at exit: %q", m))
		}
	}
	return p
}

// checkUcmatoseOutputs: both sides' progress lines and "return status 0".
func checkUcmatoseOutputs(hostOut, vmOut string, clientHost bool) []string {
	client, server := vmOut, hostOut
	if clientHost {
		client, server = hostOut, vmOut
	}
	var p []string
	for _, x := range []struct {
		who, out string
		lines    []string
	}{
		{"ucmatose client", client, []string{"cmatose: starting client", "cmatose: connecting", "receiving data transfers", "sending replies", "data transfers complete", "test complete", "return status 0"}},
		{"ucmatose server", server, []string{"cmatose: starting server", "initiating data transfers", "completing sends", "receiving data transfers", "data transfers complete", "cmatose: disconnecting", "disconnected", "test complete", "return status 0"}},
	} {
		at := 0
		for _, l := range x.lines {
			i := strings.Index(x.out[at:], l+"\n")
			if i < 0 {
				p = append(p, fmt.Sprintf("%s: no %q line (after the earlier ones)", x.who, l))
				break
			}
			at += i + len(l) + 1
		}
		if strings.Contains(x.out, "event:") || strings.Contains(x.out, "failed") {
			p = append(p, x.who+": a failure line")
		}
	}
	return p
}

// cmStormWire checks the MADs of conns connections — a REQ, REP and RTU
// each; cmtime: a DREQ from the client and a DREP from the server each;
// ucmatose: the reverse — and, with data, count messages of size bytes
// from each side on each connection (RC SENDs; no other data). resends
// allows the client's REQs and DREQs more than once, the server's MRAs
// for the REQs and its DREPs for the DREQs.
func cmStormWire(clientHost bool, conns int, data bool, count, size int, resends bool) wireCheck {
	var recs []madRec
	msgs := map[bool]int{}
	bytesBy := map[bool]int{}
	check := func(p Payload) string {
		if isMAD, msg := madCheck(p, &recs); isMAD {
			return msg
		}
		op := p.Opcode.String()
		if !data || !strings.HasPrefix(op, "RC_SEND_") {
			return fmt.Sprintf("%s: no data but ucmatose's SENDs may flow", op)
		}
		if p.Resent {
			return ""
		}
		bytesBy[p.FromHost] += len(p.Data)
		if op == "RC_SEND_ONLY" || op == "RC_SEND_LAST" {
			msgs[p.FromHost]++
		}
		return ""
	}
	done := func() []string {
		c, s := clientHost, !clientHost
		dreq, drep := c, s
		if data {
			dreq, drep = s, c
		}
		specs := []madSpec{{c, "REQ", conns, conns}, {s, "REP", conns, conns}, {c, "RTU", conns, conns},
			{dreq, "DREQ", conns, conns}, {drep, "DREP", conns, conns}}
		if resends {
			// REQs and DREQs sent again after rocev2d's 1.07 s response
			// timeout (each answered once more: an MRA, a DREP); and on
			// a loaded host (a CI-like run beside other labs: 20 of
			// 1000) REPs that rxe's CM sent again before the RTU of a
			// slow client came, each answered by one more RTU.
			specs[0].max, specs[1].max, specs[2].max, specs[3].max, specs[4].max = -1, -1, -1, -1, -1
			specs = append(specs, madSpec{s, "MRA", 0, -1})
		}
		p := checkMADs(recs, specs)
		if data {
			for _, side := range []bool{true, false} {
				who := map[bool]string{true: "rocev2d", false: "rxe"}[side]
				if msgs[side] != conns*count || bytesBy[side] != conns*count*size {
					p = append(p, fmt.Sprintf("%s sent %d SEND messages, %d bytes; want %d x %d of %d bytes", who, msgs[side], bytesBy[side], conns, count, size))
				}
			}
		}
		return p
	}
	what := fmt.Sprintf("%d connections' REQ/REP/RTU and DREQ/DREP", conns)
	if data {
		what += fmt.Sprintf(", %d x %d SENDs of %d bytes each way", conns, count, size)
	}
	return wireCheck{check: check, done: done, mads: &recs, what: what}
}
