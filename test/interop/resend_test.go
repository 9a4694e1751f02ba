//go:build linux

package interop

import (
	"bytes"
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
