//go:build linux

package interop

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/reth"
)

// timed is one frame of a synthetic capture at a time after its start.
type timed struct {
	at    time.Duration
	frame []byte
}

func pcapTimed(t *testing.T, frames ...timed) []byte {
	t.Helper()
	var b bytes.Buffer
	w := pcapgo.NewWriter(&b)
	if err := w.WriteFileHeader(65536, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	ts := time.Unix(1700000000, 0)
	for _, f := range frames {
		ci := gopacket.CaptureInfo{Timestamp: ts.Add(f.at), CaptureLength: len(f.frame), Length: len(f.frame)}
		if err := w.WritePacket(ci, f.frame); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

func write(psn uint32, op bth.Opcode, payload []byte) packet.Fields {
	f := send(psn, op, payload)
	if op == bth.RCWriteFirst || op == bth.RCWriteOnly {
		f.RETH = reth.Fields{VA: 0x1000, RKey: 0x55, DMALength: uint32(len(payload))}
	}
	return f
}

func ackOf(psn uint32, syn aeth.Syndrome) packet.Fields {
	return packet.Fields{BTH: bth.Fields{Opcode: bth.RCAck, PKey: 0xffff, DestQP: 0x12, PSN: bth.PSN(psn)},
		AETH: aeth.Fields{Syndrome: syn, MSN: 1}}
}

func ms(x float64) time.Duration { return time.Duration(x * float64(time.Millisecond)) }

// TestJudgeResends: rocev2d's resends (repeated request PSNs from the
// host) are justified only a full local ACK timeout (less 5 %) after their
// previous copy and before any response covering the PSN; a go-back-N
// flight is judged by its first packet.
func TestJudgeResends(t *testing.T) {
	to := AckTimeout(14)
	pay := make([]byte, 64)
	mtu := make([]byte, 1024)
	hostW := func(at float64, psn uint32) timed {
		return timed{ms(at), frame(t, true, write(psn, bth.RCWriteOnly, pay))}
	}
	hostS := func(at float64, psn uint32, op bth.Opcode) timed {
		return timed{ms(at), frame(t, true, send(psn, op, mtu))}
	}
	vmAck := func(at float64, psn uint32) timed {
		return timed{ms(at), frame(t, false, ackOf(psn, aeth.ACK(31)))}
	}
	vmReq := func(at float64, psn uint32) timed {
		return timed{ms(at), frame(t, false, send(psn, bth.RCSendOnly, pay))}
	}
	// An 8-packet READ at PSN 10 (responses 10-17), re-requested from
	// PSN first: the RETH starts at that packet's data.
	hostRead := func(at float64, first uint32) timed {
		return timed{ms(at), frame(t, true, packet.Fields{BTH: bth.Fields{Opcode: bth.RCReadRequest, PKey: 0xffff, DestQP: 0x11, PSN: bth.PSN(first)},
			RETH: reth.Fields{VA: 0x1000 + uint64(first-10)*1024, RKey: 0x55, DMALength: (18 - first) * 1024}})}
	}
	vmResp := func(at float64, psn uint32) timed {
		op := bth.RCReadResponseMiddle
		switch psn {
		case 10:
			op = bth.RCReadResponseFirst
		case 17:
			op = bth.RCReadResponseLast
		}
		f := packet.Fields{BTH: bth.Fields{Opcode: op, PKey: 0xffff, DestQP: 0x12, PSN: bth.PSN(psn)}, Payload: mtu}
		if op != bth.RCReadResponseMiddle {
			f.AETH = aeth.Fields{Syndrome: aeth.ACK(31), MSN: 1}
		}
		return timed{ms(at), frame(t, false, f)}
	}
	// The READ's flight with response 12 lost before the tap: 10, 11,
	// then 13-17 (the gap opens at 13, +1.3 ms).
	gapFlight := []timed{hostRead(0, 10), vmResp(1, 10), vmResp(1.1, 11), vmResp(1.3, 13), vmResp(1.4, 14)}
	stale := []timed{vmResp(1.6, 15), vmResp(1.7, 16), vmResp(1.8, 17)}
	reread := func(at float64) []timed {
		var out []timed
		for k := uint32(12); k <= 17; k++ {
			out = append(out, vmResp(at+0.1*float64(k-12), k))
		}
		return out
	}
	for _, tc := range []struct {
		name              string
		frames            []timed
		resent, flights   int
		justified, spurio int
		want              []string // substrings of the lines, in order
	}{
		{
			name:   "stall: one WRITE resent after the timeout, peer silent",
			frames: []timed{vmReq(0, 500), hostW(1, 10), hostW(71, 10), vmAck(313, 10)},
			resent: 1, flights: 1, justified: 1,
			want: []string{"rocev2d resent RC_RDMA_WRITE_ONLY psn=0x00000a (1 packets) at +71.0ms, 70.0ms after its previous copy", "rxe silent for 71.0ms", "justified"},
		},
		{
			name: "go-back-N flight of 3 after the timeout is one flight",
			frames: []timed{hostS(0, 10, bth.RCSendFirst), hostS(0.1, 11, bth.RCSendMiddle), hostS(0.2, 12, bth.RCSendLast), vmReq(2, 500),
				hostS(66, 10, bth.RCSendFirst), hostS(66.3, 11, bth.RCSendMiddle), hostS(66.6, 12, bth.RCSendLast), vmAck(200, 12)},
			resent: 3, flights: 1, justified: 1,
			want: []string{"psn=0x00000a (3 packets)", "66.0ms after its previous copy", "rxe silent for 64.0ms", "justified"},
		},
		{
			// 63.8 ms = 95 % of 67.1 ms: the tolerance edge.
			name:   "within the 5 % tolerance",
			frames: []timed{hostW(0, 10), hostW(63.8, 10)},
			resent: 1, flights: 1, justified: 1,
		},
		{
			name:   "too early: resent 30 ms after the original",
			frames: []timed{hostW(0, 10), hostW(30, 10), vmAck(31, 10)},
			resent: 1, flights: 1, spurio: 1,
			want: []string{"30.0ms after its previous copy", "SPURIOUS"},
		},
		{
			name:   "after the covering ACK",
			frames: []timed{hostW(0, 10), vmAck(1, 10), hostW(80, 10)},
			resent: 1, flights: 1, spurio: 1,
			want: []string{"rxe had acknowledged it at +1.0ms", "SPURIOUS"},
		},
		{
			name:   "a coalesced ACK beyond the PSN covers it",
			frames: []timed{hostW(0, 10), hostW(0.1, 11), hostW(0.2, 12), vmAck(1, 12), hostW(90, 11)},
			resent: 1, flights: 1, spurio: 1,
			want: []string{"psn=0x00000b", "acknowledged it at +1.0ms"},
		},
		{
			name: "a NAK covers only the PSNs before it",
			frames: []timed{hostW(0, 9), hostW(0.1, 10), timed{ms(1), frame(t, false, ackOf(10, aeth.NAK(aeth.NAKPSNSeqError)))},
				hostW(70, 10)},
			resent: 1, flights: 1, justified: 1,
		},
		{
			name:   "two timeouts in a row are both justified",
			frames: []timed{hostW(0, 10), hostW(68, 10), hostW(136, 10), vmAck(300, 10)},
			resent: 2, flights: 2, justified: 2,
			want: []string{"68.0ms after its previous copy (68.0ms after the original)", "68.0ms after its previous copy (136.0ms after the original)"},
		},
		{
			// Measured from the previous copy, not the original: a
			// second resend 0.1 ms after the first is no timeout.
			name:   "a resend 0.1 ms after a justified one",
			frames: []timed{hostW(0, 10), hostW(68, 10), hostW(68.1, 10)},
			resent: 2, flights: 2, justified: 1, spurio: 1,
			want: []string{"0.1ms after its previous copy (68.1ms after the original)", "SPURIOUS", "justified"},
		},
		{
			// rocev2d re-requests from the gap at once; rxe answers after
			// the rest of its old flight. Responses 13-17 beyond the gap
			// acknowledge nothing before it.
			name:   "a READ re-request from a response gap (go-back-N)",
			frames: slices.Concat(gapFlight, []timed{hostRead(1.5, 12)}, stale, reread(3)),
			resent: 1, flights: 1, justified: 1,
			want: []string{"rocev2d resent RC_RDMA_READ_REQUEST psn=0x00000c (1 packets) at +1.5ms, its original is not in the capture",
				"READ responses had a gap there since +1.3ms (go-back-N re-request)", "justified"},
		},
		{
			name:   "a second READ re-request at the same gap before the ACK timeout",
			frames: slices.Concat(gapFlight, []timed{hostRead(1.5, 12)}, stale, []timed{hostRead(10, 12)}, reread(12)),
			resent: 2, flights: 2, justified: 1, spurio: 1,
			want: []string{"+10.0ms, 8.5ms after its previous copy", "SPURIOUS", "gap there since +1.3ms", "justified"},
		},
		{
			// The re-request's answer was lost too: a timeout later the
			// second one is justified (the stale responses beyond the
			// gap do not cover it).
			name:   "a second READ re-request at the same gap after the ACK timeout",
			frames: slices.Concat(gapFlight, []timed{hostRead(1.5, 12)}, stale, []timed{hostRead(70, 12)}, reread(71)),
			resent: 2, flights: 2, justified: 2,
			want: []string{"gap there since +1.3ms", "justified", "+70.0ms, 68.5ms after its previous copy", "justified"},
		},
		{
			// Nothing beyond PSN 12 in the capture: no gap to answer.
			name:   "a READ re-request with no gap in the capture",
			frames: []timed{hostRead(0, 10), vmResp(1, 10), vmResp(1.1, 11), hostRead(1.5, 12), reread(3)[0]},
			resent: 1, flights: 1, spurio: 1,
			want: []string{"its original is not in the capture", "SPURIOUS"},
		},
		{
			name:   "a READ re-request after the gap was filled",
			frames: []timed{hostRead(0, 10), vmResp(1, 10), vmResp(1.1, 11), vmResp(1.3, 13), vmResp(1.4, 12), hostRead(1.5, 12)},
			resent: 1, flights: 1, spurio: 1,
			want: []string{"rxe had acknowledged it at +1.3ms", "SPURIOUS"},
		},
		{
			name:   "rxe's resends are not rocev2d's",
			frames: []timed{vmReq(0, 500), vmReq(1, 500)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := analyze(bytes.NewReader(pcapTimed(t, tc.frames...)))
			if err != nil {
				t.Fatal(err)
			}
			j, s := st.JudgeResends(true, to)
			if st.RetransFromHost != tc.resent || st.FlightCount(true) != tc.flights || len(j) != tc.justified || len(s) != tc.spurio {
				t.Fatalf("resent %d flights %d justified %q spurious %q, want %d %d %d %d",
					st.RetransFromHost, st.FlightCount(true), j, s, tc.resent, tc.flights, tc.justified, tc.spurio)
			}
			all := strings.Join(append(s, j...), "\n")
			pos := 0
			for _, w := range tc.want {
				i := strings.Index(all[pos:], w)
				if i < 0 {
					t.Fatalf("%q not found (in order) in\n%s", w, all)
				}
				pos += i
			}
		})
	}
}

func TestAckTimeoutAndQPTimeoutArg(t *testing.T) {
	if got := AckTimeout(14); got != 67108864*time.Nanosecond {
		t.Fatalf("AckTimeout(14) = %v", got)
	}
	if got := AckTimeout(0); got != 4096*time.Nanosecond {
		t.Fatalf("AckTimeout(0) = %v", got)
	}
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"write-bw", "-s", "4096"}, 14},
		{[]string{"write-bw", "-u", "18"}, 18},
		{[]string{"write-bw", "--qp-timeout", "12", "-v"}, 12},
		{[]string{"write-bw", "--qp-timeout=16"}, 16},
		{[]string{"write-bw", "-u", "40"}, 14},
		{[]string{"write-bw", "-u"}, 14},
	} {
		if got := qpTimeoutArg(tc.args); got != tc.want {
			t.Errorf("qpTimeoutArg(%q) = %d, want %d", tc.args, got, tc.want)
		}
	}
}
