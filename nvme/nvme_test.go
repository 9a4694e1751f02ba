package nvme

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestSQERoundTrip(t *testing.T) {
	for _, f := range []SQEFields{
		{},
		{Opcode: IORead, Flags: FlagSGLMetabuf, CID: 0x1234, NSID: 1, SGL: Keyed(0xff3c22e082665800, 4096, 0x145b2, true), CDW10: 64, CDW12: 7},
		{Opcode: IOWrite, Flags: FlagSGLMetabuf, CID: 0xffff, NSID: 0xffffffff, CDW2: 1, CDW3: 2, MPTR: 3, SGL: InCapsule(0, 8192),
			CDW10: 0xffffffff, CDW11: 0xffffffff, CDW12: 0xffff, CDW13: 4, CDW14: 5, CDW15: 6},
	} {
		b := make(SQE, SQESize)
		b.Encode(&f)
		if g := b.Fields(); g != f {
			t.Errorf("round trip\n got %+v\nwant %+v", g, f)
		}
	}
}

func TestSGL(t *testing.T) {
	tests := []struct {
		name  string
		f     SGLFields
		id    uint8
		bytes string
	}{
		{"keyed", Keyed(0x1122334455667788, 0x123456, 0xaabbccdd, false), SGLKeyed, "8877665544332211563412ddccbbaa40"},
		{"keyed-invalidate", Keyed(1, 1024, 0x145b2, true), SGLKeyedInvalidate, "0100000000000000000400b24501004f"},
		{"in-capsule", InCapsule(0, 8192), SGLInCapsule, "00000000000000000020000000000001"},
		{"null", Keyed(0, 0, 0, false), SGLKeyed, "00000000000000000000000000000040"},
	}
	for _, tt := range tests {
		b := make(SGL, SGLSize)
		b.Encode(&tt.f)
		if b.ID() != tt.id {
			t.Errorf("%s: id %#x, want %#x", tt.name, b.ID(), tt.id)
		}
		if got := bytesHex(b); got != tt.bytes {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.bytes)
		}
		if g := b.Fields(); g != tt.f {
			t.Errorf("%s: fields %+v, want %+v", tt.name, g, tt.f)
		}
	}
	big := Keyed(0, MaxKeyedLength+1, 1, false)
	if err := big.Validate(); err == nil {
		t.Error("Validate accepted a 2^24-byte keyed SGL")
	}
}

func bytesHex(b []byte) string {
	const h = "0123456789abcdef"
	var s strings.Builder
	for _, c := range b {
		s.WriteByte(h[c>>4])
		s.WriteByte(h[c&15])
	}
	return s.String()
}

func TestCQE(t *testing.T) {
	for _, f := range []CQEFields{
		{Result: 1, SQID: 0, CID: 31, Status: StatusSuccess},
		{Result: 0xffffffffffffffff, SQHead: 5, SQID: 3, CID: 0xffff, Status: StatusLBARange | StatusDNR, Phase: true},
		{Status: StatusConnectInvalidParam | StatusDNR | StatusMore},
	} {
		b := make(CQE, CQESize)
		b.Encode(&f)
		if g := b.Fields(); g != f {
			t.Errorf("round trip\n got %+v\nwant %+v", g, f)
		}
	}
	// Linux's status 0x4180 (connect format, DNR) is 0x8300 on the wire.
	b := make(CQE, CQESize)
	b.Encode(&CQEFields{Status: StatusConnectFormat | StatusDNR})
	if b[14] != 0x00 || b[15] != 0x83 {
		t.Errorf("status field %x, want 0083", []byte(b[14:]))
	}
	if s := (StatusLBARange | StatusDNR); s.SCT() != 0 || s.SC() != 0x80 || !s.DNR() || s.OK() || !strings.Contains(s.String(), "LBA out of range") {
		t.Errorf("%v: sct %d sc %#x", s, s.SCT(), s.SC())
	}
	if s := StatusConnectInvalidHost; s.SCT() != 1 || s.SC() != 0x84 {
		t.Errorf("%v: sct %d sc %#x", s, s.SCT(), s.SC())
	}
}

func TestCMPrivateData(t *testing.T) {
	req := CMReqFields{QID: 1, HRQSize: 128, HSQSize: 127}
	b := make([]byte, CMReqSize)
	CMReq(b).Encode(&req)
	if bytesHex(b[:8]) != "000001008000"+"7f00" {
		t.Errorf("REQ %x", b[:8])
	}
	r, err := ParseCMReq(b)
	if err != nil || r.Fields() != req {
		t.Errorf("REQ %+v %v", r.Fields(), err)
	}
	if _, err := ParseCMReq(b[:31]); !errors.Is(err, ErrShort) {
		t.Errorf("short REQ: %v", err)
	}
	rep := CMRepFields{CRQSize: 32}
	CMRep(b).Encode(&rep)
	if p, err := ParseCMRep(b); err != nil || p.Fields() != rep {
		t.Errorf("REP %+v %v", p.Fields(), err)
	}
	rej := CMRejFields{Status: CMInvalidHSQSize}
	CMRej(b).Encode(&rej)
	if bytesHex(b[:4]) != "00000400" {
		t.Errorf("REJ %x", b[:4])
	}
	if p, err := ParseCMRej(b); err != nil || p.Fields() != rej || rej.Status.String() != "invalid host SQ size" {
		t.Errorf("REJ %+v %v", p.Fields(), err)
	}
	if _, err := ParseCMRej(b[:3]); err == nil {
		t.Error("short REJ accepted")
	}
}

func TestConnectAndProperty(t *testing.T) {
	s := make(SQE, SQESize)
	c := Connect{QID: 2, SQSize: 127, KATO: 5000}
	c.Put(s)
	if s.Opcode() != OpcodeFabrics || s.FCType() != FCConnect || ConnectOf(s) != c {
		t.Errorf("Connect %+v", ConnectOf(s))
	}
	d := make(ConnectData, ConnectDataSize)
	df := ConnectDataFields{HostID: [16]byte{1, 2}, CNTLID: DynamicCNTLID, SubNQN: "nqn.x:sub", HostNQN: strings.Repeat("h", 300)}
	d.Encode(&df)
	g := d.Fields()
	if g.SubNQN != df.SubNQN || len(g.HostNQN) != NQNSize-1 || g.CNTLID != 0xffff || g.HostID != df.HostID {
		t.Errorf("Connect data %+v", g)
	}
	p := Property{Set: true, Offset: PropCC, Value: CCEnable | CCIOSQES6IOCQ4}
	p.Put(s)
	if PropertyOf(s) != p || s.FCType() != FCPropertySet {
		t.Errorf("Property %+v", PropertyOf(s))
	}
	capv := CAP{MQES: 127, TO: 15, CSSNVM: true}
	if ParseCAP(capv.Value()) != capv || capv.Value() != 0x20_0f00_007f {
		t.Errorf("CAP %#x", capv.Value())
	}
}

func TestAdminCommands(t *testing.T) {
	s := make(SQE, SQESize)
	id := Identify{CNS: CNSNSDescList, NSID: 1, CNTID: 3}
	id.Put(s)
	if IdentifyOf(s) != id {
		t.Errorf("Identify %+v", IdentifyOf(s))
	}
	f := Features{FID: FeatNumQueues, Value: NumQueues(4, 4)}
	f.Put(s, AdminSetFeatures)
	if FeaturesOf(s) != f || f.Value != 0x30003 {
		t.Errorf("Features %+v", FeaturesOf(s))
	}
	if a, b := SplitNumQueues(0x30003); a != 4 || b != 4 {
		t.Errorf("SplitNumQueues %d %d", a, b)
	}
	for _, g := range []GetLogPage{{LID: LogDiscovery, NumD: 256}, {LID: LogDiscovery, NumD: 0x12345, Offset: 1 << 33}, {LID: LogError, NumD: 1, RAE: true, LSP: 3}} {
		g.Put(s)
		if GetLogPageOf(s) != g {
			t.Errorf("GetLogPage %+v, want %+v", GetLogPageOf(s), g)
		}
	}
	ev := AsyncEvent{Type: AENotice, Info: 0xf0, LID: LogDiscovery}
	if ParseAsyncEvent(ev.Result()) != ev {
		t.Errorf("AsyncEvent %#x", ev.Result())
	}
	rw := RW{NSID: 1, SLBA: 1<<40 + 5, NLB: 255, FUA: true}
	rw.Put(s, IOWrite)
	if RWOf(s) != rw || rw.Blocks() != 256 {
		t.Errorf("RW %+v", RWOf(s))
	}
	dsm := DSM{NSID: 1, NR: 1, Attr: DSMDeallocate}
	dsm.Put(s)
	if DSMOf(s) != dsm {
		t.Errorf("DSM %+v", DSMOf(s))
	}
	rb := make([]byte, 2*DSMRangeSize)
	PutDSMRange(rb[16:], DSMRange{NLB: 8, SLBA: 100})
	if r := DSMRanges(rb); len(r) != 2 || r[1].NLB != 8 || r[1].SLBA != 100 {
		t.Errorf("DSM ranges %+v", r)
	}
}

func TestIdentifyStructures(t *testing.T) {
	b := make([]byte, IdentifySize)
	cf := IdentifyControllerFields{SN: "sn1", MN: "rocev2", FR: "1.0", RAB: 6, MDTS: 8, CNTLID: 1, VER: Version(1, 3, 0),
		CTRATT: CtrattHostID128, KAS: 10, SQES: 0x66, CQES: 0x44, MAXCMD: 128, NN: 1, SGLS: SGLSSupported | SGLSKeyed | SGLSOffset,
		SubNQN: "nqn.x", IOCCSZ: 260, IORCSZ: 1, MSDBD: 1}
	IdentifyController(b).Encode(&cf)
	if g := IdentifyController(b).Fields(); g != cf {
		t.Errorf("controller\n got %+v\nwant %+v", g, cf)
	}
	if string(b[4:24]) != "sn1                 " {
		t.Errorf("SN %q", b[4:24])
	}
	nf := IdentifyNamespaceFields{NSZE: 1 << 20, NCAP: 1 << 20, NUSE: 1 << 20, NGUID: [16]byte{9}, LBAF: [16]LBAFormat{{LBADS: 12}}}
	IdentifyNamespace(b).Encode(&nf)
	if g := IdentifyNamespace(b).Fields(); g != nf || g.BlockShift() != 12 {
		t.Errorf("namespace %+v", g)
	}
	PutActiveNSList(b, []uint32{1, 2, 7})
	if l := ActiveNSList(b); len(l) != 3 || l[2] != 7 {
		t.Errorf("ns list %v", l)
	}
	ds := []NSDescriptor{{Type: NIDTNGUID, ID: bytes.Repeat([]byte{1}, 16)}, {Type: NIDTCSI, ID: []byte{0}}}
	n, err := PutNSDescriptors(b, ds)
	if err != nil || n != 25 {
		t.Fatalf("PutNSDescriptors %d %v", n, err)
	}
	got, err := NSDescriptors(b)
	if err != nil || len(got) != 2 || !bytes.Equal(got[0].ID, ds[0].ID) || got[1].Type != NIDTCSI {
		t.Errorf("descriptors %+v %v", got, err)
	}
	if _, err := NSDescriptors([]byte{2, 16, 0, 0, 1}); err == nil {
		t.Error("truncated descriptor accepted")
	}
	if _, err := PutNSDescriptors(make([]byte, 10), ds); err == nil {
		t.Error("descriptors overflowing the buffer accepted")
	}
}

func TestDiscoveryLog(t *testing.T) {
	b := make([]byte, DiscoveryHeaderSize+2*DiscoveryEntrySize)
	h := DiscoveryHeader{GenCtr: 3, NumRec: 2}
	h.Put(b)
	es := []DiscoveryEntry{
		{TrType: TrtypeRDMA, AdrFam: AdrfamIPv4, SubType: SubtypeNVMe, CNTLID: DynamicCNTLID, ASQSZ: 32, TrSvcID: "4420",
			SubNQN: "nqn.x:a", TrAddr: "192.0.2.1", RDMAQPType: RDMAQPTypeRC, RDMAPrType: RDMAPrtNone, RDMACMS: RDMACMSRDMA},
		{TrType: TrtypeRDMA, AdrFam: AdrfamIPv4, SubType: SubtypeDisc, PortID: 1, TrSvcID: "4420", SubNQN: DiscoveryNQN, TrAddr: "192.0.2.1"},
	}
	for i := range es {
		es[i].Put(b[DiscoveryHeaderSize+i*DiscoveryEntrySize:])
	}
	if g, err := DiscoveryHeaderOf(b); err != nil || g != h {
		t.Errorf("header %+v %v", g, err)
	}
	for i, e := range es {
		if g, err := DiscoveryEntryOf(b, i); err != nil || g != e {
			t.Errorf("entry %d\n got %+v\nwant %+v", i, g, e)
		}
	}
	if _, err := DiscoveryEntryOf(b, 2); err == nil {
		t.Error("entry past the end accepted")
	}
	if _, err := DiscoveryEntryOf(b, -1); err == nil {
		t.Error("negative entry accepted")
	}
	if string(b[DiscoveryHeaderSize+32:DiscoveryHeaderSize+40]) != "4420    " {
		t.Errorf("trsvcid %q", b[DiscoveryHeaderSize+32:DiscoveryHeaderSize+40])
	}
}

func TestOpcodeDirection(t *testing.T) {
	for _, tt := range []struct {
		o Opcode
		d Direction
	}{{IOWrite, DirHostToCtrl}, {IORead, DirCtrlToHost}, {IOFlush, DirNone}, {AdminIdentify, DirCtrlToHost},
		{AdminSetFeatures, DirHostToCtrl}, {AdminGetLogPage, DirCtrlToHost}, {AdminKeepAlive, DirNone}, {IODSM, DirHostToCtrl}} {
		if g := tt.o.DataDirection(); g != tt.d {
			t.Errorf("%#x: %d, want %d", uint8(tt.o), g, tt.d)
		}
	}
	if FCConnect.DataDirection() != DirHostToCtrl || FCPropertyGet.DataDirection() != DirNone {
		t.Error("FCType directions")
	}
}
