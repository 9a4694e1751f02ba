//go:build linux

package interop

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket/pcapgo"

	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/udp/faults"
)

// ECN and CNP cells (issue 17: rxe as a peer of our congestion control),
// a labSuite run by runCell with every check of a clean cell:
//
//   - ib_write_bw_4096_ecn_rocev2d_{server,client}: rocev2d sends ECT(0)
//     (its default). The capture must show every one of rocev2d's RoCEv2
//     packets ECT(0), none CE, and no CNP either way; rxe's counters and
//     the data check stay clean (rxe ignores the ECN field: its receive
//     path never reads it).
//   - ib_write_bw_4096_ce_rocev2d_server and ib_read_bw_4096_ce_rocev2d_client:
//     the eBPF injector on the tap's ingress (VM -> host) marks every
//     RoCEv2 packet of rxe CE (CEAll: rxe sends Not-ECT). rxe's WRITEs,
//     resp. its READ responses, reach rocev2d marked, so its notification
//     point answers with CNPs: np_ecn_marked_roce_packets must equal the
//     injector's marks, np_cnp_sent must be > 0 and equal the CNPs in the
//     capture, each of them opcode 0x81 with BECN, P_Key 0xffff, PSN 0,
//     DestQP = rxe's QPN, Not-ECT with DSCP 48, from the QP's UDP source
//     port, with a valid ICRC, and decoded by tshark as a CNP.
//
// What rxe does with a CNP: rxe_rcv() -> hdr_check() -> check_type_state()
// (drivers/infiniband/sw/rxe/rxe_recv.c) requires opcode & 0xe0 to be the
// QP type's class (0x00 for RC); a CNP's is 0x80, so the packet is dropped
// there — silently in the lab's 6.1 kernel (older ones print "bad qp type";
// the cell logs the VM's rxe kernel lines to show it) — before the ICRC
// check and before rcvd_pkts is counted. No rxe counter moves, no QP state changes, and rxe
// has no reaction point: its sending rate is unchanged. The cells check
// that rxe's rcvd_pkts equals what rocev2d sent minus its CNPs, and that
// the test completes with clean counters and data.
func init() { labSuites = append(labSuites, ecnSuite) }

// ecnCell is one cell of the suite: a matrix cell renamed, and whether the
// injector marks rxe's packets CE.
type ecnCell struct {
	c  cell
	ce bool
}

func ecnCells(gidIndex int) []ecnCell {
	byName := map[string]cell{}
	for _, c := range cells(gidIndex) {
		byName[c.name] = c
	}
	var out []ecnCell
	for _, e := range []struct {
		from, tag string
		ce        bool
	}{
		{"ib_write_bw_4096_rocev2d_server", "ecn", false},
		{"ib_write_bw_4096_rocev2d_client", "ecn", false},
		{"ib_write_bw_4096_rocev2d_server", "ce", true},
		{"ib_read_bw_4096_rocev2d_client", "ce", true},
	} {
		c, ok := byName[e.from]
		if !ok {
			panic("ecn cells: no matrix cell " + e.from)
		}
		c.name = strings.Replace(c.name, "_rocev2d_", "_"+e.tag+"_rocev2d_", 1)
		if e.ce {
			c.label += " (CE on rxe's packets)"
		} else {
			c.label += " (rocev2d ECT(0))"
		}
		out = append(out, ecnCell{c, e.ce})
	}
	return out
}

func ecnSuite(t *testing.T, ctx context.Context, lab *Lab, img *Image, add func(row)) {
	for _, e := range ecnCells(lab.GIDIndex) {
		c := e.c
		t.Run(c.name, func(t *testing.T) {
			r := row{cell: c.label, direction: c.direction(), result: "FAIL"}
			defer func() {
				if r.result == "FAIL" && r.packets == "" {
					r.counters = "stopped before the checks: " + r.counters
				}
				add(r)
			}()
			var inj *faults.Injector
			if e.ce {
				var err error
				inj, err = faults.AttachWith(Tap, faults.Config{CERate: 1, CEAll: true}, &faults.Options{Netns: lab.NS, Ingress: true})
				if err != nil {
					r.counters = err.Error()
					t.Fatalf("fault injector: %v", err)
				}
				defer inj.Close()
			}
			pcapFile := filepath.Join(lab.Dir, c.name+".pcap")
			var summary string
			defer func() {
				if summary != "" {
					r.counters += " | " + summary
				}
			}()
			inner := c.captureCheck
			c.captureCheck = func(st *CaptureStats, hostOut, vmOut string) []string {
				var p []string
				if inner != nil {
					p = inner(st, hostOut, vmOut)
				}
				es, err := ecnCensus(pcapFile)
				if err != nil {
					return append(p, "ECN census: "+err.Error())
				}
				ours, err := ourCounters(hostOut)
				if err != nil {
					return append(p, err.Error())
				}
				var mk faults.Counters
				if inj != nil {
					mk, _ = inj.HookCounters(faults.Ingress)
				}
				summary = fmt.Sprintf("rocev2d ECN %s; rxe ECN %s (before the injector); CNPs rocev2d %d rxe %d; np_ecn_marked_roce_packets %d np_cnp_sent %d; injector CE %d",
					es.host, es.vm, len(es.hostCNPs), es.vmCNPs, ours["np_ecn_marked_roce_packets"], ours["np_cnp_sent"], mk.CEMarked)
				t.Logf("%s: %s", c.name, summary)
				p = append(p, es.problems(st, ours, hostOut, e.ce, mk)...)
				if n := len(es.hostCNPs); n > 0 {
					got, err := tsharkCNPs(ctx, pcapFile)
					switch {
					case errors.Is(err, exec.ErrNotFound):
						if os.Getenv("CI") == "true" {
							p = append(p, "tshark is not installed (CI=true requires the CNP decode check)")
						}
					case err != nil:
						p = append(p, "tshark: "+err.Error())
					case got != n:
						p = append(p, fmt.Sprintf("tshark decodes %d CNPs, the capture holds %d from rocev2d", got, n))
					}
				}
				return p
			}
			runCell(t, ctx, lab, img, c, &r)
			if e.ce {
				// What the VM's kernel said about the CNPs (shown, not
				// checked: 6.1's rxe drops them without a word).
				if v, err := lab.Run(ctx, "dmesg 2>&1 | grep -iE 'rxe|qp type' | tail -5", 10*time.Second); err == nil {
					t.Logf("%s: VM kernel log (rxe lines, last 5): %q", c.name, strings.TrimSpace(v.Output))
				}
			}
		})
	}
}

// ecnCounts counts packets per ECN codepoint.
type ecnCounts [4]int

func (e ecnCounts) String() string {
	return fmt.Sprintf("Not-ECT %d ECT(1) %d ECT(0) %d CE %d", e[0], e[1], e[2], e[3])
}

// cnpSeen is a CNP in the capture.
type cnpSeen struct {
	frame   int
	tos     uint8
	becn    bool
	pkey    uint16
	destQP  uint32
	psn     uint32
	srcPort uint16
	udpLen  int
	icrcErr error
}

// ecnStats is the ECN census of a capture: the codepoints of each side's
// RoCEv2 packets other than CNPs, and the CNPs.
type ecnStats struct {
	host, vm  ecnCounts
	hostCNPs  []cnpSeen
	vmCNPs    int
	hostPorts map[uint16]int // UDP source ports of rocev2d's non-CNP packets
}

// ecnCensus reads an IPv4 capture of the lab's wire.
func ecnCensus(file string) (*ecnStats, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		return nil, err
	}
	if r.Snaplen() > maxSnaplen {
		r.SetSnaplen(maxSnaplen)
	}
	es := &ecnStats{hostPorts: map[uint16]int{}}
	for frame := 1; ; frame++ {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return es, nil
		}
		if err != nil {
			return es, fmt.Errorf("frame %d: %w", frame, err)
		}
		if len(data) < 14+20+8+12 || binary.BigEndian.Uint16(data[12:]) != 0x0800 {
			continue
		}
		ip := data[14:]
		ihl := int(ip[0]&0x0f) * 4
		tot := int(binary.BigEndian.Uint16(ip[2:]))
		if ip[9] != 17 || ihl < 20 || tot > len(ip) || tot < ihl+8+12 {
			continue
		}
		ip = ip[:tot]
		udp := ip[ihl:]
		if binary.BigEndian.Uint16(udp[2:]) != 4791 {
			continue
		}
		fromHost := fmt.Sprintf("%d.%d.%d.%d", ip[12], ip[13], ip[14], ip[15]) == HostIP
		bth := udp[8:]
		if bth[0] == 0x81 {
			if !fromHost {
				es.vmCNPs++
				continue
			}
			es.hostCNPs = append(es.hostCNPs, cnpSeen{frame: frame, tos: ip[1], becn: bth[4]&0x40 != 0,
				pkey: binary.BigEndian.Uint16(bth[2:]), destQP: binary.BigEndian.Uint32(bth[4:]) & 0xffffff,
				psn: binary.BigEndian.Uint32(bth[8:]) & 0xffffff, srcPort: binary.BigEndian.Uint16(udp[0:]),
				udpLen: len(udp), icrcErr: icrc.Verify(ip)})
			continue
		}
		if fromHost {
			es.host[ip[1]&3]++
			es.hostPorts[binary.BigEndian.Uint16(udp[0:])]++
		} else {
			es.vm[ip[1]&3]++
		}
	}
}

// problems checks the census: rocev2d's packets ECT(0), and CNPs exactly
// when (and as many as) rocev2d says it sent them, each well formed.
func (es *ecnStats) problems(st *CaptureStats, ours map[string]int64, hostOut string, ce bool, mk faults.Counters) []string {
	var p []string
	total := es.host[0] + es.host[1] + es.host[2] + es.host[3]
	if total == 0 || es.host[2] != total {
		p = append(p, fmt.Sprintf("rocev2d's RoCEv2 packets (CNPs aside) are not all ECT(0): %s", es.host))
	}
	if es.vmCNPs > 0 {
		p = append(p, fmt.Sprintf("%d CNPs from rxe (it has no notification point)", es.vmCNPs))
	}
	marked, sent := ours["np_ecn_marked_roce_packets"], ours["np_cnp_sent"]
	if !ce {
		if marked != 0 || sent != 0 || len(es.hostCNPs) != 0 || es.host[3] != 0 || es.vm[3] != 0 {
			p = append(p, fmt.Sprintf("CE or CNPs on a wire without marking: np_ecn_marked_roce_packets %d np_cnp_sent %d, %d CNPs captured", marked, sent, len(es.hostCNPs)))
		}
		return p
	}
	if mk.CEMarked == 0 || mk.Errors != 0 || mk.CENotECT != 0 {
		p = append(p, fmt.Sprintf("injector did not mark rxe's packets: %v", mk))
	}
	if marked != int64(mk.CEMarked) {
		p = append(p, fmt.Sprintf("rocev2d counted %d CE-marked packets (np_ecn_marked_roce_packets), the injector marked %d", marked, mk.CEMarked))
	}
	if sent == 0 || sent != int64(len(es.hostCNPs)) {
		p = append(p, fmt.Sprintf("rocev2d np_cnp_sent %d, the capture holds %d CNPs from it", sent, len(es.hostCNPs)))
	}
	if got := st.Opcodes["host CNP"]; got != len(es.hostCNPs) {
		p = append(p, fmt.Sprintf("the capture analysis counts %d host CNPs, the census %d", got, len(es.hostCNPs)))
	}
	_, rxeQPN, err := perfQPNs(hostOut)
	if err != nil {
		return append(p, err.Error())
	}
	bad := 0
	for _, c := range es.hostCNPs {
		var why []string
		if c.tos != 48<<2 {
			why = append(why, fmt.Sprintf("TOS %#02x, want DSCP 48 Not-ECT (0xc0)", c.tos))
		}
		if !c.becn {
			why = append(why, "BECN clear")
		}
		if c.pkey != 0xffff {
			why = append(why, fmt.Sprintf("P_Key %#04x", c.pkey))
		}
		if c.destQP != rxeQPN {
			why = append(why, fmt.Sprintf("DestQP %#x, rxe's QPN is %#x", c.destQP, rxeQPN))
		}
		if c.psn != 0 {
			why = append(why, fmt.Sprintf("PSN %d", c.psn))
		}
		if c.udpLen != 8+12+16+4 {
			why = append(why, fmt.Sprintf("UDP length %d, want 40 (BTH, 16 reserved bytes, ICRC)", c.udpLen))
		}
		if es.hostPorts[c.srcPort] == 0 {
			why = append(why, fmt.Sprintf("UDP source port %d is not one of rocev2d's data ports %v", c.srcPort, topKeys(es.hostPorts)))
		}
		if c.icrcErr != nil {
			why = append(why, "ICRC "+c.icrcErr.Error())
		}
		if len(why) > 0 {
			bad++
			if bad <= 5 {
				p = append(p, fmt.Sprintf("CNP in frame %d: %s", c.frame, strings.Join(why, ", ")))
			}
		}
	}
	if bad > 5 {
		p = append(p, fmt.Sprintf("... %d CNPs wrong in all", bad))
	}
	return p
}

// tsharkCNPs counts the frames tshark decodes as RoCE CNPs (BTH opcode
// 129).
func tsharkCNPs(ctx context.Context, file string) (int, error) {
	if _, err := exec.LookPath("tshark"); err != nil {
		return 0, err
	}
	out, err := exec.CommandContext(ctx, "tshark", "-n", "-r", file, "-Y", "infiniband.bth.opcode == 129",
		"-T", "fields", "-e", "frame.number").Output()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, l := range strings.Split(string(out), "\n") {
		if _, err := strconv.Atoi(strings.TrimSpace(l)); err == nil {
			n++
		}
	}
	return n, nil
}
