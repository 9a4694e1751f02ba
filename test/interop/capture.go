//go:build linux

package interop

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/pcapgo"
	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/rocelayer"
)

// CaptureStats summarises the RoCEv2 traffic of a capture on the lab wire.
type CaptureStats struct {
	Frames   int // every frame in the file
	RoCE     int // IPv4/UDP frames to port 4791
	FromHost int // RoCEv2 packets sent by HostIP
	FromVM   int // RoCEv2 packets sent by the VM
	BadICRC  int
	Bad      int // malformed BTH/headers
	// Opcodes counts packets per direction and opcode, "host RC_SEND_ONLY".
	Opcodes map[string]int
	// HostIPIDs, HostSrcPorts, HostTTLs, HostDF describe the IPv4/UDP
	// headers of the host's packets (what rxe's ICRC check covers).
	HostIPIDs    map[uint16]int
	HostSrcPorts map[uint16]int
	HostDF       int
	// VMSrcPorts and VMTTLs describe the UDP source ports and IPv4 TTLs
	// (IPv6: hop limits) of rxe's packets.
	VMSrcPorts map[uint16]int
	VMTTLs     map[uint16]int
	// DSCP counts each side's RoCEv2 packets by the DSCP of their IP
	// traffic class (ECN bits off), keyed "host 8" / "vm 8".
	DSCP map[string]int
	// IPv6 counts the RoCEv2 packets over IPv6 (the rest are IPv4). For
	// them, HostTTLs are the host's hop limits, HostFlowLabels and
	// VMFlowLabels each side's flow labels, HostUDPCsumZero and
	// VMUDPCsumZero the packets each side sent with UDP checksum 0.
	IPv6                           int
	HostTTLs                       map[uint16]int
	HostFlowLabels, VMFlowLabels   map[uint32]int
	HostUDPCsumZero, VMUDPCsumZero int
	// HostMaxPayload and VMMaxPayload are the largest RoCEv2 payloads
	// each side sent; HostMiddlePayloads and VMMiddlePayloads count the
	// payload sizes of their FIRST and MIDDLE packets (which carry
	// exactly the path MTU).
	HostMaxPayload, VMMaxPayload         int
	HostMiddlePayloads, VMMiddlePayloads map[int]int
	// Lines is a one-line decode of the first packets and of every bad one.
	Lines []string
	// RetransFromHost and RetransFromVM count request packets whose PSN
	// lies behind the next PSN their sender had already reached on that QP
	// (resends: go-back-N, timer expiries); RetransLines describes the
	// first few (sender, opcode, PSN, time since the first RoCEv2 packet).
	RetransFromHost, RetransFromVM int
	RetransLines                   []string
	// Flights groups the resent request packets into retransmission
	// flights (a go-back-N resends several PSNs at once), in capture
	// order, with the timing JudgeResends needs.
	Flights []ResendFlight
	// DataChecked and DataBad count the packets given to the DataCheck of
	// AnalyzeCaptureWith and those it found wrong; DataLines are its
	// first few findings.
	DataChecked, DataBad int
	DataLines            []string
	// DataUnplaced counts SEND/WRITE packets whose message's first packet
	// was not in the capture before them (their data could not be placed
	// and was not checked).
	DataUnplaced int
	// Messages counts the RC and UC request messages each side sent, by
	// sender and kind ("host SEND", "vm RDMA_WRITE", "host
	// RDMA_READ_REQUEST"): a SEND or WRITE at its LAST or ONLY packet, a
	// READ or atomic at its request. Resends are not counted.
	Messages map[string]int
	// NAKs counts the NAKs and RNR NAKs each side sent, by sender and
	// syndrome ("vm NAK REMOTE_ACCESS_ERROR", "host RNR_NAK timer=12").
	NAKs map[string]int
	// CM counts the connection manager's MADs (UD to QP1, decoded by
	// package cm) per sender and message, "host REQ", "vm REP", and the
	// REJs also per reason, "vm REJ invalid service ID"; CMLines
	// describes each (the first few), CMPairs the QPNs the REQs and REPs
	// connected, each pair once: {host's QPN, VM's QPN}. A MAD to QP1
	// that does not decode counts in Bad.
	CM      map[string]int
	CMLines []string
	CMPairs [][2]uint32
}

// ResendFlight is one retransmission seen in the capture: the resent
// request packets a sender emitted back to back (each within flightGap of
// the previous one, PSNs ascending), judged by the first.
type ResendFlight struct {
	FromHost bool
	FirstPSN uint32
	Opcode   bth.Opcode // of the first packet
	At       time.Duration
	Packets  int
	// HasPrev is set when an earlier copy of FirstPSN is in the capture;
	// SincePrev is the time since the last one, SinceOrig since the first.
	HasPrev              bool
	SincePrev, SinceOrig time.Duration
	// PeerSilent is the time since the peer's last packet (any) before
	// the flight, or since the capture's start when it sent none.
	PeerSilent time.Duration
	// Covered is set when a response of the peer acknowledging FirstPSN
	// (an ACK, READ response or atomic ACK with a PSN at or after it, or
	// a NAK after it) had arrived before the flight; CoveredAt is when.
	Covered   bool
	CoveredAt time.Duration
	// ReadGap is set when the flight's first packet is a READ request
	// for FirstPSN inside an earlier READ's response range and the
	// capture had shown a gap there since FirstPSN was last requested:
	// a READ response beyond it arrived (at GapAt) while the response
	// at FirstPSN had not. That is a go-back-N re-request from the gap
	// (the responses beyond it do not acknowledge FirstPSN).
	ReadGap bool
	GapAt   time.Duration
}

// flightGap is how close in time resent packets must follow each other
// to belong to one flight.
const flightGap = 5 * time.Millisecond

// ackTimeoutTolerance is the share of the local ACK timeout a resend may
// come early and still count as a timeout (timer granularity).
const ackTimeoutTolerance = 0.05

// AckTimeout is the IB local ACK timeout for the QP attribute timeout:
// 4.096 µs × 2^timeout (14: 67.1 ms).
func AckTimeout(exp int) time.Duration {
	return time.Duration(4096) << exp * time.Nanosecond
}

// Justified reports whether a resend flight is a correct local ACK
// timeout for timeout: its first PSN's previous copy was sent at least
// the timeout (less ackTimeoutTolerance) before, and no response
// covering that PSN had arrived; or a go-back-N READ re-request from a
// response gap the capture shows (ReadGap).
func (f ResendFlight) Justified(timeout time.Duration) bool {
	if f.ReadGap {
		return true
	}
	min := time.Duration(float64(timeout) * (1 - ackTimeoutTolerance))
	return f.HasPrev && f.SincePrev >= min && !f.Covered
}

// Describe is one line about the flight: who, which PSN, when, the
// peer's silence, and the verdict for timeout.
func (f ResendFlight) Describe(timeout time.Duration) string {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
	who, peer := "rxe", "rocev2d"
	if f.FromHost {
		who, peer = "rocev2d", "rxe"
	}
	b := fmt.Sprintf("%s resent %s psn=%#06x (%d packets) at +%.1fms", who, f.Opcode, f.FirstPSN, f.Packets, ms(f.At))
	if f.HasPrev {
		b += fmt.Sprintf(", %.1fms after its previous copy (%.1fms after the original)", ms(f.SincePrev), ms(f.SinceOrig))
	} else {
		b += ", its original is not in the capture"
	}
	b += fmt.Sprintf("; %s silent for %.1fms", peer, ms(f.PeerSilent))
	if f.ReadGap {
		b += fmt.Sprintf("; %s's READ responses had a gap there since +%.1fms (go-back-N re-request)", peer, ms(f.GapAt))
	} else if f.Covered {
		b += fmt.Sprintf("; %s had acknowledged it at +%.1fms", peer, ms(f.CoveredAt))
	}
	verdict := "SPURIOUS"
	if f.Justified(timeout) {
		verdict = "justified"
	}
	return b + fmt.Sprintf("; ACK timeout %.1fms: %s", ms(timeout), verdict)
}

// JudgeResends splits the flights of one sender (fromHost) into those
// justified by its local ACK timeout and the spurious ones, as lines.
func (s *CaptureStats) JudgeResends(fromHost bool, timeout time.Duration) (justified, spurious []string) {
	for _, f := range s.Flights {
		if f.FromHost != fromHost {
			continue
		}
		if f.Justified(timeout) {
			justified = append(justified, f.Describe(timeout))
		} else {
			spurious = append(spurious, f.Describe(timeout))
		}
	}
	return justified, spurious
}

// ReadGapCount is the number of go-back-N READ re-requests (ReadGap)
// among the resend flights of one sender: resends started by a response
// gap, not by the ACK timer.
func (s *CaptureStats) ReadGapCount(fromHost bool) int {
	n := 0
	for _, f := range s.Flights {
		if f.FromHost == fromHost && f.ReadGap {
			n++
		}
	}
	return n
}

// FlightCount is the number of resend flights by one sender.
func (s *CaptureStats) FlightCount(fromHost bool) int {
	n := 0
	for _, f := range s.Flights {
		if f.FromHost == fromHost {
			n++
		}
	}
	return n
}

// Payload describes the data of one packet for a DataCheck.
type Payload struct {
	FromHost bool
	Opcode   bth.Opcode
	PSN      uint32
	// Resent is set when the packet's PSN was already seen from its sender
	// (a retransmitted request, or a response to one).
	Resent bool
	// MsgOff is the offset of Data in its message (SEND, WRITE, READ
	// response), or -1 when the message's first packet is not in the
	// capture.
	MsgOff int
	// VA is the remote address of Data's first byte (WRITE: from the
	// RETH; READ response: from the matching READ request), valid when
	// HasVA.
	VA    uint64
	HasVA bool
	// Data is the payload (SEND, WRITE, READ response).
	Data []byte
	// RKey is the R_Key of a WRITE's RETH (its FIRST or ONLY packet) or
	// of a SEND with Invalidate's IETH, else 0.
	RKey uint32
	// Atomic is set on an ATOMIC_ACKNOWLEDGE matched to its request:
	// the request's opcode, VA, compare and swap/add values and the
	// original value the responder returned.
	Atomic *AtomicResult
	// UD is set on a UD datagram (MsgOff is 0: one packet per message).
	UD *UDInfo
	// DestQP and AckReq are the packet's BTH destination QP and AckReq
	// bit (RC and UC packets).
	DestQP uint32
	AckReq bool
}

// UDInfo is the addressing of a UD datagram: its BTH destination QP and
// its DETH.
type UDInfo struct {
	DestQP, SrcQP, QKey uint32
}

// AtomicResult is one atomic operation as seen on the wire.
type AtomicResult struct {
	Op                   bth.Opcode // RC_COMPARE_SWAP or RC_FETCH_ADD
	VA, Compare, SwapAdd uint64
	Orig                 uint64
}

// DataCheck inspects one packet's data and returns a problem, or "".
type DataCheck func(p Payload) string

// labMTU is the path MTU of the lab (rxe's active MTU on a 1500-byte
// netdev; ibv_rc_pingpong's and rocev2d's default): a READ request spans
// ceil(length/labMTU) response PSNs, and every packet of a message but the
// last carries labMTU bytes, so a packet's offset in its message is
// labMTU times its PSN distance from the message's first packet.
const labMTU = 1024

// maxMsgPkts bounds the search for a message's first packet.
const maxMsgPkts = 64

// maxSnaplen is the largest frame analyze reads (tcpdump's default snap
// length); maxReadSpan the most response packets of one READ whose data
// it checks (64 MiB at labMTU; the lab moves far less). Both keep a
// hostile capture from costing gigabytes.
const (
	maxSnaplen  = 262144
	maxReadSpan = 1 << 16
)

// maxLines bounds CaptureStats.Lines.
const maxLines = 60

// AnalyzeCapture reads an Ethernet pcap written on the lab's tap.
func AnalyzeCapture(file string) (*CaptureStats, error) {
	return AnalyzeCaptureWith(file, nil)
}

// AnalyzeCaptureWith is AnalyzeCapture that also hands the data of every
// SEND, WRITE, READ response and atomic ACK to check (when not nil).
func AnalyzeCaptureWith(file string, check DataCheck) (*CaptureStats, error) {
	return AnalyzeCapturePairs(file, check, nil)
}

// AnalyzeCapturePairs is AnalyzeCaptureWith for a capture of several RC
// QP pairs connected out of band (srq-pingpong), as pairs of {host's QPN,
// VM's QPN}: each pair's PSNs are followed on their own, as those of the
// pairs a capture's CM MADs connect.
func AnalyzeCapturePairs(file string, check DataCheck, pairs [][2]uint32) (*CaptureStats, error) {
	return AnalyzeCaptureMTU(file, check, pairs, labMTU)
}

// AnalyzeCaptureMTU is AnalyzeCapturePairs for a run at path MTU mtu (0:
// labMTU), which places the data of multi-packet messages and READ
// responses.
func AnalyzeCaptureMTU(file string, check DataCheck, pairs [][2]uint32, mtu int) (*CaptureStats, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s, err := analyzeMTU(f, check, pairs, mtu)
	if err != nil {
		return s, fmt.Errorf("%s: %w", file, err)
	}
	return s, nil
}

// analyze decodes a pcap stream; it never panics on malformed input.
func analyze(in io.Reader) (*CaptureStats, error) { return analyzeWith(in, nil) }

// flow is the per-sender state of the PSN and data tracking.
type flow struct {
	started bool
	next    uint32 // next request PSN the sender has not sent yet
	// starts maps the PSN of every FIRST/ONLY packet of a SEND or WRITE
	// to the message's VA (WRITE) — packets of a message resent from
	// its middle find their offset from it.
	starts map[uint32]msgStart
	// ends holds the PSNs of LAST/ONLY packets: the search for a
	// message's first packet stops there.
	ends map[uint32]bool
	// lastTx is when each request PSN was last sent; lastSeen when the
	// sender last sent any packet.
	lastTx   map[uint32]time.Duration
	firstTx  map[uint32]time.Duration
	lastSeen time.Duration
	seen     bool
	// acked is the highest request PSN the peer's responses have
	// acknowledged (valid when hasAck), since ackedAt.
	acked   uint32
	hasAck  bool
	ackedAt time.Duration
	// flight is the index in CaptureStats.Flights of the sender's
	// current resend flight (-1: none), flightAt and flightPSN its last
	// packet.
	flight    int
	flightAt  time.Duration
	flightPSN uint32
	// first is the flow's first request PSN. respNext is the next
	// response PSN the requester waits for (valid when respStarted):
	// a READ response beyond it while it is missing is a gap, at
	// gapPSN since gapAt (valid when hasGap).
	first       uint32
	respStarted bool
	respNext    uint32
	hasGap      bool
	gapPSN      uint32
	gapAt       time.Duration
}

type msgStart struct {
	va    uint64
	hasVA bool
}

// readAt is where the response packet of one READ PSN lands.
type readAt struct {
	va  uint64
	off int
}

// psnBefore reports whether a precedes b in 24-bit PSN order.
func psnBefore(a, b uint32) bool {
	d := (a - b) & 0xffffff
	return d != 0 && d&0x800000 != 0
}

// flowKey names one RC connection's request flow: its sender (true =
// host) and the requester's QPN. Without CM MADs in the capture (QPs
// connected out of band) the QPN is 0: one flow per direction, as a
// capture of one QP pair needs. With them, every connection the REQs and
// REPs set up is followed on its own: a perftest -R run has two (the
// exchange's and the test's), with independent PSN spaces.
type flowKey struct {
	fromHost bool
	qpn      uint32
}

// tracker holds the PSN and data tracking state of a capture.
type tracker struct {
	flows    map[flowKey]*flow
	readVA   map[flowKey]map[uint32]readAt       // READ request PSNs -> where each response PSN lands
	atomics  map[flowKey]map[uint32]AtomicResult // atomic request PSN -> the request
	respSeen map[flowKey]map[uint32]bool
	// lastSeen is when each side (true = host) last sent an RC or UC
	// packet.
	lastSeen map[bool]time.Duration
	seen     map[bool]bool
	// peerQPN maps each QPN a REQ or REP in the capture connected (by
	// its side: QPNs are per device) to its peer's; cmReqQPN a REQ's QPN
	// by its sender and communication ID.
	peerQPN  map[sideQPN]uint32
	cmReqQPN map[cmReqKey]uint32
	// mtu is the path MTU of the run (AnalyzeCaptureMTU).
	mtu uint32
}

// sideQPN is a QP of one side (true = host).
type sideQPN struct {
	host bool
	qpn  uint32
}

type cmReqKey struct {
	fromHost bool
	commID   uint32
}

func newTracker() *tracker {
	return &tracker{flows: map[flowKey]*flow{}, readVA: map[flowKey]map[uint32]readAt{},
		atomics: map[flowKey]map[uint32]AtomicResult{}, respSeen: map[flowKey]map[uint32]bool{},
		lastSeen: map[bool]time.Duration{}, seen: map[bool]bool{},
		peerQPN: map[sideQPN]uint32{}, cmReqQPN: map[cmReqKey]uint32{}}
}

// flow returns the request flow of key, creating it (and its maps).
func (t *tracker) flow(k flowKey) *flow {
	f := t.flows[k]
	if f == nil {
		f = &flow{starts: map[uint32]msgStart{}, ends: map[uint32]bool{}, lastTx: map[uint32]time.Duration{},
			firstTx: map[uint32]time.Duration{}, flight: -1}
		t.flows[k] = f
		t.readVA[k] = map[uint32]readAt{}
		t.atomics[k] = map[uint32]AtomicResult{}
		t.respSeen[k] = map[uint32]bool{}
	}
	return f
}

// requestKey is the flow of a request packet from fromHost to destQP (a
// QP of the other side): the requester's QPN is the peer the CM gave
// destQP (0 if none).
func (t *tracker) requestKey(fromHost bool, destQP uint32) flowKey {
	return flowKey{fromHost, t.peerQPN[sideQPN{!fromHost, destQP}]}
}

// responseKey is the request flow a response to destQP answers: destQP is
// the requester, on the other side.
func (t *tracker) responseKey(fromHost bool, destQP uint32) flowKey {
	if _, ok := t.peerQPN[sideQPN{!fromHost, destQP}]; ok {
		return flowKey{!fromHost, destQP}
	}
	return flowKey{!fromHost, 0}
}

// cmMAD decodes one MAD to QP1 with package cm, counts it and learns the
// QPNs a REQ and its REP connect. It returns a problem, or "".
func (s *CaptureStats) cmMAD(t *tracker, fromHost bool, frame int, at time.Duration, mad []byte) string {
	dir := "vm"
	if fromHost {
		dir = "host"
	}
	h, msg, err := cm.Decode(mad)
	if err != nil {
		return "CM MAD: " + err.Error()
	}
	name := h.AttributeID.String()
	s.CM[dir+" "+name]++
	line := fmt.Sprintf("#%d +%.1fms %s %s", frame, float64(at.Microseconds())/1e3, dir, name)
	switch f := msg.(type) {
	case *cm.REQFields:
		t.cmReqQPN[cmReqKey{fromHost, f.LocalCommID}] = f.LocalQPN
		line += fmt.Sprintf(" comm %#x qpn %#x psn %#x service %#x mtu %d resp %d init %d", f.LocalCommID, f.LocalQPN, f.StartingPSN,
			f.ServiceID, f.PathMTU.Bytes(), f.ResponderResources, f.InitiatorDepth)
	case *cm.REPFields:
		line += fmt.Sprintf(" comm %#x->%#x qpn %#x psn %#x resp %d init %d", f.LocalCommID, f.RemoteCommID, f.LocalQPN, f.StartingPSN,
			f.ResponderResources, f.InitiatorDepth)
		if q, ok := t.cmReqQPN[cmReqKey{!fromHost, f.RemoteCommID}]; ok {
			req, rep := sideQPN{!fromHost, q}, sideQPN{fromHost, f.LocalQPN}
			if p, ok := t.peerQPN[req]; !ok || p != rep.qpn { // not a duplicate REP
				pair := [2]uint32{q, f.LocalQPN}
				if fromHost {
					pair = [2]uint32{f.LocalQPN, q}
				}
				s.CMPairs = append(s.CMPairs, pair)
			}
			t.peerQPN[req], t.peerQPN[rep] = rep.qpn, req.qpn
		}
	case *cm.REJFields:
		line += fmt.Sprintf(" comm %#x->%#x %v of %v", f.LocalCommID, f.RemoteCommID, f.Reason, f.MessageRejected)
		s.CM[fmt.Sprintf("%s REJ %v", dir, f.Reason)]++
	case *cm.RTUFields:
		line += fmt.Sprintf(" comm %#x->%#x", f.LocalCommID, f.RemoteCommID)
	case *cm.DREQFields:
		line += fmt.Sprintf(" comm %#x->%#x qpn %#x", f.LocalCommID, f.RemoteCommID, f.RemoteQPN)
	case *cm.DREPFields:
		line += fmt.Sprintf(" comm %#x->%#x", f.LocalCommID, f.RemoteCommID)
	}
	if len(s.CMLines) < 40 {
		s.CMLines = append(s.CMLines, line)
	}
	// rxe is a go-back-N peer: rocev2d never offers nor answers ECE
	// (selective repeat) in these cells.
	var vendor uint32
	switch f := msg.(type) {
	case *cm.REQFields:
		vendor = f.VendorID
	case *cm.REPFields:
		vendor = f.VendorID
	}
	if fromHost && (vendor != 0 || h.AttributeModifier != 0) {
		return fmt.Sprintf("CM %s from rocev2d carries ECE (vendor %#x, options %#x): rxe must see standard CM messages", name, vendor, h.AttributeModifier)
	}
	return ""
}

func analyzeWith(in io.Reader, check DataCheck) (*CaptureStats, error) {
	return analyzePairs(in, check, nil)
}

// analyzePairs is analyzeWith with the QP pairs of AnalyzeCapturePairs.
func analyzePairs(in io.Reader, check DataCheck, pairs [][2]uint32) (*CaptureStats, error) {
	return analyzeMTU(in, check, pairs, labMTU)
}

// captureFile is what the analyzer needs of pcapgo's pcap and pcapng readers.
type captureFile interface {
	ReadPacketData() ([]byte, gopacket.CaptureInfo, error)
}

// openCapture opens a pcap or pcapng capture and returns its full link type,
// read from the file (gopacket's LinkType is 8 bits: LINUX_SLL2, 276, what
// tcpdump -i any writes, would read as 20). A classic pcap's snap length is
// bounded by maxSnaplen (see analyzeMTU).
func openCapture(in io.Reader) (captureFile, uint32, error) {
	br := bufio.NewReaderSize(in, 1<<16)
	head, _ := br.Peek(4096)
	lt, ltErr := rocelayer.FileLinkType(head)
	if len(head) >= 4 && binary.LittleEndian.Uint32(head) == 0x0a0d0d0a {
		r, err := pcapgo.NewNgReader(br, pcapgo.DefaultNgReaderOptions)
		if err != nil {
			return nil, 0, err
		}
		if ltErr != nil {
			lt = uint32(r.LinkType())
		}
		return r, lt, nil
	}
	r, err := pcapgo.NewReader(br)
	if err != nil {
		return nil, 0, err
	}
	// pcapgo allocates each frame's capture length up front, bounded only by
	// the header's snap length, which may say anything up to 4 GiB; real
	// frames stay far below tcpdump's default 262144, so that is the bound.
	if r.Snaplen() > maxSnaplen {
		r.SetSnaplen(maxSnaplen)
	}
	if ltErr != nil {
		lt = uint32(r.LinkType())
	}
	return r, lt, nil
}

// analyzeMTU is analyzePairs for a run at path MTU mtu (0: labMTU). It
// reads frames of IPv4 or IPv6 (no extension headers) RoCEv2 from a pcap or
// pcapng capture of any link type rocelayer.NetworkPacket knows (Ethernet
// from the lab's tap; Linux SLL and SLL2, raw IP, loopback from elsewhere);
// the host's packets come from HostIP or HostLL.
func analyzeMTU(in io.Reader, check DataCheck, pairs [][2]uint32, mtu int) (*CaptureStats, error) {
	r, linkType, err := openCapture(in)
	if err != nil {
		return nil, err
	}
	s := &CaptureStats{Opcodes: map[string]int{}, HostIPIDs: map[uint16]int{}, HostSrcPorts: map[uint16]int{},
		VMSrcPorts: map[uint16]int{}, VMTTLs: map[uint16]int{}, CM: map[string]int{}, DSCP: map[string]int{}}
	s.Messages, s.NAKs = map[string]int{}, map[string]int{}
	s.HostTTLs, s.HostFlowLabels, s.VMFlowLabels = map[uint16]int{}, map[uint32]int{}, map[uint32]int{}
	s.HostMiddlePayloads, s.VMMiddlePayloads = map[int]int{}, map[int]int{}
	var p packet.Packet
	t := newTracker()
	t.mtu = uint32(labMTU)
	if mtu > 0 {
		t.mtu = uint32(mtu)
	}
	hostLL := netip.MustParseAddr(HostLL).As16()
	for _, pr := range pairs {
		t.peerQPN[sideQPN{true, pr[0]}], t.peerQPN[sideQPN{false, pr[1]}] = pr[1], pr[0]
	}
	var t0 time.Time
	for {
		data, ci, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return s, fmt.Errorf("frame %d: %w", s.Frames+1, err)
		}
		s.Frames++
		etherType, netPkt, ok := rocelayer.NetworkPacket(linkType, data)
		if !ok || len(netPkt) < 20+8 {
			continue
		}
		var ip, udp []byte
		var src string
		var fromHost bool
		var ttl uint16
		switch etherType {
		case 0x0800:
			ip = netPkt
			ihl := int(ip[0]&0xf) * 4
			tot := int(binary.BigEndian.Uint16(ip[2:4]))
			if ip[0]>>4 != 4 || ip[9] != 17 || ihl < 20 || tot > len(ip) || tot < ihl+8 {
				continue
			}
			ip = ip[:tot]
			udp = ip[ihl:]
			src = fmt.Sprintf("%d.%d.%d.%d", ip[12], ip[13], ip[14], ip[15])
			fromHost, ttl = src == HostIP, uint16(ip[8])
		case 0x86dd:
			// IPv6 without extension headers (what rxe and rocev2d send).
			ip = netPkt
			if len(ip) < 40+8 || ip[0]>>4 != 6 || ip[6] != 17 {
				continue
			}
			tot := 40 + int(binary.BigEndian.Uint16(ip[4:6]))
			if tot > len(ip) || tot < 40+8 {
				continue
			}
			ip = ip[:tot]
			udp = ip[40:]
			a := netip.AddrFrom16([16]byte(ip[8:24]))
			src = a.String()
			fromHost, ttl = a.As16() == hostLL, uint16(ip[7])
		default:
			continue
		}
		if binary.BigEndian.Uint16(udp[2:4]) != 4791 {
			continue
		}
		s.RoCE++
		if s.RoCE == 1 {
			t0 = ci.Timestamp
		}
		is6 := ip[0]>>4 == 6
		udpCsum0 := binary.BigEndian.Uint16(udp[6:8]) == 0
		var flow uint32
		if is6 {
			s.IPv6++
			flow = binary.BigEndian.Uint32(ip[0:4]) & 0xfffff
		}
		tclass := ip[1] // IPv4 TOS
		if is6 {
			tclass = byte(binary.BigEndian.Uint16(ip[0:2]) >> 4)
		}
		s.DSCP[fmt.Sprintf("%s %d", map[bool]string{true: "host", false: "vm"}[fromHost], tclass>>2)]++
		dir := "vm  "
		if fromHost {
			dir = "host"
			s.FromHost++
			s.HostSrcPorts[binary.BigEndian.Uint16(udp[0:2])]++
			if is6 {
				s.HostTTLs[ttl]++
				s.HostFlowLabels[flow]++
				if udpCsum0 {
					s.HostUDPCsumZero++
				}
			} else {
				s.HostIPIDs[binary.BigEndian.Uint16(ip[4:6])]++
				if ip[6]&0x40 != 0 {
					s.HostDF++
				}
			}
		} else {
			s.FromVM++
			s.VMSrcPorts[binary.BigEndian.Uint16(udp[0:2])]++
			s.VMTTLs[ttl]++
			if is6 {
				s.VMFlowLabels[flow]++
				if udpCsum0 {
					s.VMUDPCsumZero++
				}
			}
		}
		bad := ""
		p = packet.Packet{}
		if err := p.Parse(udp[8:]); err != nil {
			s.Bad++
			bad = "MALFORMED " + err.Error()
		} else if p.BTH.Opcode() == bth.RCAck && len(p.Payload) > 0 {
			// A selective repeat NAK (aeth.SACK): never for rxe.
			s.Bad++
			bad = "selective repeat SACK block after the AETH: not a standard packet"
		}
		if err := icrc.Verify(ip); err != nil {
			s.BadICRC++
			if bad != "" {
				bad += ", "
			}
			bad += "ICRC " + err.Error()
		}
		op := "?"
		if p.BTH != nil {
			op = p.BTH.Opcode().String()
			if bad == "" && p.BTH.DestQP() == 1 && p.DETH != nil && p.Info.Transport == bth.TransportUD {
				// A MAD to the GSI: the CM's, in these captures.
				if msg := s.cmMAD(t, dir == "host", s.Frames, ci.Timestamp.Sub(t0), p.Payload); msg != "" {
					s.Bad++
					bad = msg
				}
			}
			if bad == "" {
				s.track(&p, dir == "host", ci.Timestamp.Sub(t0), t, check)
				s.payloadSize(&p, dir == "host")
			}
		}
		s.Opcodes[dir+" "+op]++
		if len(s.Lines) < maxLines && (bad != "" || s.RoCE <= 24) {
			line := fmt.Sprintf("#%d %s %s:%d > :4791 id=%#04x df=%v ttl=%d", s.Frames, dir, src,
				binary.BigEndian.Uint16(udp[0:2]), binary.BigEndian.Uint16(ip[4:6]), ip[6]&0x40 != 0, ttl)
			if is6 {
				line = fmt.Sprintf("#%d %s [%s]:%d > :4791 flow=%#05x hlim=%d udpcsum0=%v", s.Frames, dir, src,
					binary.BigEndian.Uint16(udp[0:2]), flow, ttl, udpCsum0)
			}
			if p.BTH != nil {
				line += fmt.Sprintf(" %s qp=%#06x psn=%#06x ack=%v pay=%d", p.BTH.Opcode(), p.BTH.DestQP(), uint32(p.BTH.PSN()), p.BTH.AckReq(), len(p.Payload))
				if p.AETH != nil {
					line += " " + p.AETH.Syndrome().String()
				}
			}
			if bad != "" {
				line += " BAD: " + bad
			}
			s.Lines = append(s.Lines, line)
		}
	}
	return s, nil
}

// String is a short summary: counts per direction and opcode.
func (s *CaptureStats) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d frames, %d RoCEv2 (host->vm %d, vm->host %d), bad ICRC %d, malformed %d\n",
		s.Frames, s.RoCE, s.FromHost, s.FromVM, s.BadICRC, s.Bad)
	keys := make([]string, 0, len(s.Opcodes))
	for k := range s.Opcodes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-40s %d\n", k, s.Opcodes[k])
	}
	fmt.Fprintf(&b, "  host IPv4: %d distinct IDs %s, DF on %d/%d, UDP source ports %v\n",
		len(s.HostIPIDs), topKeys(s.HostIPIDs), s.HostDF, s.FromHost, topKeys(s.HostSrcPorts))
	fmt.Fprintf(&b, "  vm IPv4: TTLs %v, UDP source ports %v\n", topKeys(s.VMTTLs), topKeys(s.VMSrcPorts))
	if s.IPv6 > 0 {
		fmt.Fprintf(&b, "  %s\n", s.IPv6Summary())
	}
	if s.RetransFromHost+s.RetransFromVM > 0 {
		fmt.Fprintf(&b, "  resent requests: rocev2d %d, rxe %d\n", s.RetransFromHost, s.RetransFromVM)
		for _, l := range s.RetransLines {
			b.WriteString("    " + l + "\n")
		}
	}
	if len(s.CMLines) > 0 {
		fmt.Fprintf(&b, "  CM MADs:\n")
		for _, l := range s.CMLines {
			b.WriteString("    " + l + "\n")
		}
	}
	if s.DataChecked > 0 {
		fmt.Fprintf(&b, "  data: %d packets checked, %d wrong, %d not placed\n", s.DataChecked, s.DataBad, s.DataUnplaced)
		for _, l := range s.DataLines {
			b.WriteString("    " + l + "\n")
		}
	}
	for _, l := range s.Lines {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

// IPv6Summary describes the IPv6 headers of the capture: how many RoCEv2
// packets were IPv6, and per side the UDP checksums that were 0, the
// flow labels and the hop limits.
func (s *CaptureStats) IPv6Summary() string {
	labels := func(m map[uint32]int) string {
		keys := make([]int, 0, len(m))
		for k := range m {
			keys = append(keys, int(k))
		}
		sort.Ints(keys)
		var out []string
		for i, k := range keys {
			if i == 4 {
				out = append(out, fmt.Sprintf("...(%d)", len(keys)))
				break
			}
			out = append(out, fmt.Sprintf("%#x", k))
		}
		return "[" + strings.Join(out, " ") + "]"
	}
	return fmt.Sprintf("IPv6 %d/%d: rxe UDP csum 0 on %d/%d, flow labels %s, hop limits %v; rocev2d UDP csum 0 on %d/%d, flow labels %s, hop limits %v",
		s.IPv6, s.RoCE, s.VMUDPCsumZero, s.FromVM, labels(s.VMFlowLabels), topKeys(s.VMTTLs),
		s.HostUDPCsumZero, s.FromHost, labels(s.HostFlowLabels), topKeys(s.HostTTLs))
}

// payloadSize records the payload size of a well-formed packet by its
// sender: the largest, and those of FIRST and MIDDLE packets.
func (s *CaptureStats) payloadSize(p *packet.Packet, fromHost bool) {
	n := len(p.Payload)
	max, mid := &s.VMMaxPayload, s.VMMiddlePayloads
	if fromHost {
		max, mid = &s.HostMaxPayload, s.HostMiddlePayloads
	}
	if n > *max {
		*max = n
	}
	if p.Info.Pos == bth.PosFirst || p.Info.Pos == bth.PosMiddle {
		mid[n]++
	}
}

// topKeys lists up to 4 keys of m.
func topKeys(m map[uint16]int) string {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, int(k))
	}
	sort.Ints(keys)
	if len(keys) > 4 {
		return fmt.Sprintf("%v...", keys[:4])
	}
	return fmt.Sprint(keys)
}

// track follows the PSNs of one parsed packet: it counts resent requests
// and hands data to check.
func (s *CaptureStats) track(p *packet.Packet, fromHost bool, at time.Duration, t *tracker, check DataCheck) {
	info := p.Info
	if info.Transport == bth.TransportUD && p.DETH != nil && check != nil {
		// A UD datagram: one packet per message, no ACKs, no resends.
		s.checkData(Payload{FromHost: fromHost, Opcode: p.BTH.Opcode(), PSN: uint32(p.BTH.PSN()), Data: p.Payload,
			UD: &UDInfo{DestQP: p.BTH.DestQP(), SrcQP: p.DETH.SrcQP(), QKey: p.DETH.QKey()}}, check)
		return
	}
	// RC, and UC: requests only (SEND, WRITE), tracked like RC's.
	if info.Transport != bth.TransportRC && info.Transport != bth.TransportUC {
		return
	}
	defer func() { t.lastSeen[fromHost], t.seen[fromHost] = at, true }()
	psn := uint32(p.BTH.PSN())
	pl := Payload{FromHost: fromHost, Opcode: p.BTH.Opcode(), PSN: psn, Data: p.Payload, DestQP: p.BTH.DestQP(), AckReq: p.BTH.AckReq()}
	dir := "vm"
	if fromHost {
		dir = "host"
	}
	if info.Request {
		switch {
		case p.RETH != nil && info.Kind == bth.KindWrite:
			pl.RKey = p.RETH.RKey()
		case p.IETH != nil:
			pl.RKey = p.IETH.RKey()
		}
		key := t.requestKey(fromHost, p.BTH.DestQP())
		f := t.flow(key)
		span := uint32(1)
		if info.Kind == bth.KindReadRequest && p.RETH != nil {
			span = max(1, (p.RETH.DMALength()+t.mtu-1)/t.mtu)
		}
		if f.started && psnBefore(psn, f.next) {
			pl.Resent = true
			if fromHost {
				s.RetransFromHost++
			} else {
				s.RetransFromVM++
			}
			if f.flight >= 0 && at-f.flightAt <= flightGap && psnBefore(f.flightPSN, psn) {
				s.Flights[f.flight].Packets++
			} else {
				fl := ResendFlight{FromHost: fromHost, FirstPSN: psn, Opcode: p.BTH.Opcode(), At: at, Packets: 1, PeerSilent: at}
				if t.seen[!fromHost] {
					fl.PeerSilent = at - t.lastSeen[!fromHost]
				}
				if t, ok := f.lastTx[psn]; ok {
					fl.HasPrev, fl.SincePrev, fl.SinceOrig = true, at-t, at-f.firstTx[psn]
				}
				if f.hasAck && !psnBefore(f.acked, psn) {
					fl.Covered, fl.CoveredAt = true, f.ackedAt
				}
				// A READ request inside an earlier READ's range, at the
				// response gap the capture shows: the responses beyond
				// the gap acknowledge nothing before it. The first
				// request there since the gap opened is the go-back-N
				// re-request; another one needs the ACK timeout.
				if _, inRead := t.readVA[key][psn]; inRead && info.Kind == bth.KindReadRequest &&
					f.hasGap && f.gapPSN == psn && !t.respSeen[key][psn] {
					fl.Covered, fl.CoveredAt = false, 0
					if last, ok := f.lastTx[psn]; !ok || last < f.gapAt {
						fl.ReadGap, fl.GapAt = true, f.gapAt
					}
				}
				s.Flights = append(s.Flights, fl)
				f.flight = len(s.Flights) - 1
			}
			f.flightAt, f.flightPSN = at, psn
			if len(s.RetransLines) < 6 {
				who := "rxe"
				if fromHost {
					who = "rocev2d"
				}
				ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
				prev := "its original is not in the capture"
				if t, ok := f.lastTx[psn]; ok {
					prev = fmt.Sprintf("%.1fms after its previous copy", ms(at-t))
				}
				s.RetransLines = append(s.RetransLines, fmt.Sprintf("%s resent %s psn=%#06x at +%.1fms, %s; the peer had been silent for %.1fms",
					who, p.BTH.Opcode(), psn, ms(at), prev, ms(at-t.lastSeen[!fromHost])))
			}
		} else {
			if !f.started {
				f.first = psn
			}
			f.started, f.next = true, (psn+span)&0xffffff
			f.flight = -1
			if info.Pos == bth.PosLast || info.Pos == bth.PosOnly {
				s.Messages[dir+" "+info.Kind.String()]++
			}
		}
		if _, ok := f.firstTx[psn]; !ok {
			f.firstTx[psn] = at
		}
		f.lastTx[psn] = at
		switch {
		case info.Kind == bth.KindReadRequest && p.RETH != nil:
			for k := uint32(0); k < min(span, maxReadSpan); k++ {
				t.readVA[key][(psn+k)&0xffffff] = readAt{p.RETH.VA() + uint64(k)*uint64(t.mtu), int(k) * int(t.mtu)}
			}
			return
		case p.AtomicETH != nil:
			t.atomics[key][psn] = AtomicResult{Op: p.BTH.Opcode(), VA: p.AtomicETH.VA(),
				Compare: p.AtomicETH.Compare(), SwapAdd: p.AtomicETH.SwapAdd()}
			return
		case !info.Payload:
			return
		}
		if info.Pos == bth.PosFirst || info.Pos == bth.PosOnly {
			st := msgStart{}
			if p.RETH != nil {
				st = msgStart{p.RETH.VA(), true}
			}
			f.starts[psn] = st
		}
		if info.Pos == bth.PosLast || info.Pos == bth.PosOnly {
			f.ends[psn] = true
		}
		found := false
		for k := uint32(0); k < maxMsgPkts && !found; k++ {
			if k > 0 {
				// Walk back only over PSNs the capture holds, none of
				// them a message's end: when a LAST and the next FIRST
				// were both lost, a MIDDLE of the second message would
				// otherwise be taken for part of the first (CI: a WRITE
				// MIDDLE under 1 % loss "carried the wrong bytes" at an
				// offset one message too far).
				if _, seen := f.firstTx[(psn-k)&0xffffff]; !seen || f.ends[(psn-k)&0xffffff] {
					break
				}
			}
			if st, ok := f.starts[(psn-k)&0xffffff]; ok {
				found = true
				pl.MsgOff = int(k) * int(t.mtu)
				pl.VA, pl.HasVA = st.va+uint64(pl.MsgOff), st.hasVA
			}
		}
		if !found {
			// The message's first packet is not in the capture (yet):
			// under loss, dropped on the host's egress before tcpdump
			// saw it; its resend comes later.
			pl.MsgOff = -1
			s.DataUnplaced++
			return
		}
	} else {
		// A response: the requester is the other side.
		// (ACKs and NAKs share PSNs with these; only data responses
		// count as seen.)
		if p.AETH != nil && p.AETH.Syndrome().Type() != aeth.TypeACK {
			s.NAKs[dir+" "+p.AETH.Syndrome().String()]++
		}
		key := t.responseKey(fromHost, p.BTH.DestQP())
		if f := t.flow(key); f.started {
			// The highest request PSN this response acknowledges:
			// an ACK, READ response or atomic ACK covers its PSN, a
			// NAK (sequence error, RNR, other) the ones before it.
			c := psn
			if p.AETH != nil && p.AETH.Syndrome().Type() != aeth.TypeACK {
				c = (psn - 1) & 0xffffff
			}
			// Only PSNs the requester has sent can be acknowledged.
			if psnBefore(c, f.next) && (!f.hasAck || psnBefore(f.acked, c)) {
				f.acked, f.hasAck, f.ackedAt = c, true, at
			}
			if psnBefore(c, f.next) {
				t.trackGap(key, f, psn, c, info.Kind == bth.KindReadResponse, at)
			}
		}
		switch {
		case p.AtomicAck != nil:
			a, ok := t.atomics[key][psn]
			if !ok {
				return
			}
			a.Orig = p.AtomicAck.OrigData()
			pl.Atomic = &a
		case info.Kind == bth.KindReadResponse:
			r, ok := t.readVA[key][psn]
			pl.VA, pl.MsgOff, pl.HasVA = r.va, r.off, ok
		default:
			return
		}
		pl.Resent = t.respSeen[key][psn]
		t.respSeen[key][psn] = true
	}
	if check == nil {
		return
	}
	s.checkData(pl, check)
}

// trackGap follows the response PSN the requester of flow f waits for,
// given a response at psn acknowledging up to c: a READ response beyond
// it while it is missing (inside a READ's range, not seen) opens a gap
// there (dated by its first such response; the rest of a stale flight
// beyond it does not date it anew); the responses that fill it move on.
func (t *tracker) trackGap(key flowKey, f *flow, psn, c uint32, read bool, at time.Duration) {
	if !f.respStarted {
		f.respStarted, f.respNext = true, f.first
	}
	switch {
	case psn == f.respNext || (!read && !psnBefore(c, f.respNext)):
		f.respNext = (c + 1) & 0xffffff
		for n := 0; n < maxReadSpan && t.respSeen[key][f.respNext] && psnBefore(f.respNext, f.next); n++ {
			f.respNext = (f.respNext + 1) & 0xffffff
		}
	case read && psnBefore(f.respNext, psn):
		if _, inRead := t.readVA[key][f.respNext]; !inRead || t.respSeen[key][f.respNext] {
			return
		}
		if !f.hasGap || f.gapPSN != f.respNext {
			f.hasGap, f.gapPSN, f.gapAt = true, f.respNext, at
		}
	}
}

// checkData hands one packet's data to check and counts the result.
func (s *CaptureStats) checkData(pl Payload, check DataCheck) {
	s.DataChecked++
	if msg := check(pl); msg != "" {
		s.DataBad++
		if len(s.DataLines) < 6 {
			who := "rxe"
			if pl.FromHost {
				who = "rocev2d"
			}
			s.DataLines = append(s.DataLines, fmt.Sprintf("%s %s psn=%#06x: %s", who, pl.Opcode, pl.PSN, msg))
		}
	}
}
