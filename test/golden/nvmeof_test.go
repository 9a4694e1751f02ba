package golden_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/nvme"
)

// nvmeofPCAP is the capture of Linux's nvme-rdma host and nvmet-rdma
// target (testdata/golden at the module root).
func nvmeofPCAP(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "..", "testdata", "golden", "nvmeof_rdma_linux.pcap"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the NVMe-oF golden capture is part of the repository: %v", err)
	}
	return p
}

// nvmeQueue is one NVMe queue of the capture (one RC connection, named by
// the UDP source port both directions use): its outstanding commands and
// the RDMA data seen since.
type nvmeQueue struct {
	cmds      map[uint16]nvme.SQE // by CID: the SQE and its in-capsule data
	send      map[bool][]byte     // SEND message being reassembled, by direction (true: from the host)
	write     []byte              // RDMA WRITE data target -> host since the last completion
	writeKey  uint32
	readResp  []byte // RDMA READ response data host -> target
	readKey   uint32 // R_Key of the last RDMA READ request
	connected bool
	ioQueue   bool
}

// nvmeTally counts what the decode saw, for the test's assertions.
type nvmeTally struct {
	cmReq, cmRep, commands, completions, inCapsule, connectData, identifyCtrl, identifyNS, sendInv, blockSize int
	opcodes                                                                                                   map[string]int
}

// TestGoldenNVMeoF decodes the capture of Linux's nvme-rdma host talking
// to Linux's nvmet-rdma target, layer by layer: every RoCEv2 packet parses
// and re-encodes byte for byte; the CM REQ/REP carry rdma_cm's header and
// the NVMe-RDMA private data (admin: qid 0, hrqsize 32, hsqsize 31); every
// command capsule (64-byte SQE, with in-capsule data on the I/O queue) and
// every completion (16-byte CQE) decodes and re-encodes byte for byte, and
// each completion answers an outstanding command of its queue; the
// Connect data fetched by RDMA READ, the Identify data written by RDMA
// WRITE and every SEND with Invalidate (its R_Key is the command's keyed
// SGL key) are checked.
func TestGoldenNVMeoF(t *testing.T) {
	pkts := loadRoCE(t, nvmeofPCAP(t))
	if len(pkts) != 492 {
		t.Fatalf("%d RoCEv2 packets, want 492", len(pkts))
	}
	host := "192.0.2.2"
	const subNQN = "nqn.2026-12.org.example:lin"
	queues := map[uint16]*nvmeQueue{}
	tally := nvmeTally{opcodes: map[string]int{}}
	for _, p := range pkts {
		where := fmt.Sprintf("#%d", p.num)
		reencode(t, where, p)
		op := p.pk.BTH.Opcode()
		info := op.Info()
		fromHost := p.src.String() == host
		if op == bth.UDSendOnly {
			checkNVMeCM(t, where, p.pk.Payload, fromHost, &tally)
			continue
		}
		q := queues[uint16(p.udp.SrcPort)]
		if q == nil {
			q = &nvmeQueue{cmds: map[uint16]nvme.SQE{}, send: map[bool][]byte{}}
			queues[uint16(p.udp.SrcPort)] = q
		}
		switch info.Kind {
		case bth.KindSend:
			if info.Pos == bth.PosFirst || info.Pos == bth.PosOnly {
				q.send[fromHost] = q.send[fromHost][:0]
			}
			q.send[fromHost] = append(q.send[fromHost], p.pk.Payload...)
			if info.Pos == bth.PosFirst || info.Pos == bth.PosMiddle {
				continue
			}
			msg := q.send[fromHost]
			if fromHost {
				checkCommand(t, where, q, msg, &tally)
			} else {
				var inv *uint32
				if info.Inv {
					k := p.pk.IETH.RKey()
					inv = &k
				}
				checkCompletion(t, where, q, msg, inv, subNQN, &tally)
			}
		case bth.KindWrite:
			if fromHost {
				t.Errorf("%s: RDMA WRITE from the host", where)
			}
			if info.Pos == bth.PosFirst || info.Pos == bth.PosOnly {
				q.write = q.write[:0]
				q.writeKey = p.pk.RETH.RKey()
			}
			q.write = append(q.write, p.pk.Payload...)
		case bth.KindReadRequest:
			if fromHost {
				t.Errorf("%s: RDMA READ from the host", where)
			}
			q.readKey = p.pk.RETH.RKey()
			q.readResp = q.readResp[:0]
		case bth.KindReadResponse:
			q.readResp = append(q.readResp, p.pk.Payload...)
		}
	}
	for port, q := range queues {
		if len(q.cmds) > 1 { // the AER stays outstanding on the admin queue
			t.Errorf("queue %d: %d commands never completed", port, len(q.cmds))
		}
	}
	t.Logf("NVMe-oF capture: %d CM REQ, %d CM REP, %d commands (%d with in-capsule data), %d completions (%d SEND with Invalidate); opcodes %v",
		tally.cmReq, tally.cmRep, tally.commands, tally.inCapsule, tally.completions, tally.sendInv, tally.opcodes)
	if tally.cmReq != 2 || tally.cmRep != 2 || tally.connectData != 2 || tally.identifyCtrl == 0 || tally.identifyNS == 0 ||
		tally.inCapsule == 0 || tally.sendInv != 18 || tally.completions < 20 || tally.opcodes["Read"] != 6 || tally.opcodes["Write"] != 3 {
		t.Errorf("the capture did not decode into what it holds: %+v", tally)
	}
}

// checkNVMeCM decodes a CM MAD and, for a REQ or REP, the NVMe-RDMA
// private data behind rdma_cm's header, and re-encodes it.
func checkNVMeCM(t *testing.T, where string, mad []byte, fromHost bool, tally *nvmeTally) {
	t.Helper()
	_, msg, err := cm.Decode(mad)
	if err != nil {
		t.Errorf("%s: cm.Decode: %v", where, err)
		return
	}
	switch m := msg.(type) {
	case *cm.REQFields:
		tally.cmReq++
		t.Logf("%s: REQ local ACK timeout %d, retry %d, rnr retry %d, responder resources %d, initiator depth %d", where, m.Primary.LocalACKTimeout, m.RetryCount, m.RNRRetryCount, m.ResponderResources, m.InitiatorDepth)
		h, err := cm.ParseCMAHeader(m.PrivateData[:])
		if err != nil || h.Src.Unmap().String() != "192.0.2.2" {
			t.Errorf("%s: rdma_cm header %+v %v", where, h, err)
		}
		pd := m.PrivateData[cm.CMAHeaderSize:]
		r, err := nvme.ParseCMReq(pd)
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		f := r.Fields()
		switch {
		case f.RecFmt != nvme.RecFmt10:
			t.Errorf("%s: recfmt %d", where, f.RecFmt)
		case f.QID == 0 && (f.HRQSize != 32 || f.HSQSize != 31):
			t.Errorf("%s: admin queue request %+v, want hrqsize 32 hsqsize 31", where, f)
		case f.QID == 1 && (f.HRQSize != 128 || f.HSQSize != 127):
			t.Errorf("%s: I/O queue request %+v, want hrqsize 128 hsqsize 127", where, f)
		case f.QID > 1:
			t.Errorf("%s: qid %d", where, f.QID)
		}
		enc := make([]byte, nvme.CMReqSize)
		nvme.CMReq(enc).Encode(&f)
		if !bytes.Equal(enc, pd[:nvme.CMReqSize]) {
			t.Errorf("%s: CM request re-encoded\n got %x\nwant %x", where, enc, pd[:nvme.CMReqSize])
		}
		if !fromHost {
			t.Errorf("%s: REQ from the target", where)
		}
	case *cm.REPFields:
		tally.cmRep++
		r, err := nvme.ParseCMRep(m.PrivateData[:])
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		f := r.Fields()
		if f.RecFmt != 0 || (f.CRQSize != 32 && f.CRQSize != 128) {
			t.Errorf("%s: CM reply %+v", where, f)
		}
		enc := make([]byte, nvme.CMRepSize)
		nvme.CMRep(enc).Encode(&f)
		if !bytes.Equal(enc, m.PrivateData[:nvme.CMRepSize]) {
			t.Errorf("%s: CM reply re-encoded\n got %x\nwant %x", where, enc, m.PrivateData[:nvme.CMRepSize])
		}
	}
}

func opName(s nvme.SQE, io bool) string {
	if s.Opcode() == nvme.OpcodeFabrics {
		return fmt.Sprintf("Fabrics/%d", s.FCType())
	}
	if io {
		switch s.Opcode() {
		case nvme.IORead:
			return "Read"
		case nvme.IOWrite:
			return "Write"
		case nvme.IOFlush:
			return "Flush"
		}
	}
	return fmt.Sprintf("admin/%#x", uint8(s.Opcode()))
}

// checkCommand decodes a command capsule: SQE re-encoded byte for byte,
// its SGL, in-capsule data.
func checkCommand(t *testing.T, where string, q *nvmeQueue, msg []byte, tally *nvmeTally) {
	t.Helper()
	s, err := nvme.ParseSQE(msg)
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return
	}
	tally.commands++
	f := s.Fields()
	enc := make(nvme.SQE, nvme.SQESize)
	enc.Encode(&f)
	if !bytes.Equal(enc, s) {
		t.Errorf("%s: SQE re-encoded\n got %x\nwant %x", where, []byte(enc), []byte(s))
	}
	if f.Flags&nvme.FlagPSDTMask != nvme.FlagSGLMetabuf {
		t.Errorf("%s: flags %#x, want SGLs (PSDT 01)", where, f.Flags)
	}
	if err := f.SGL.Validate(); err != nil {
		t.Errorf("%s: %v", where, err)
	}
	sgl := s.SGL()
	switch sgl.ID() {
	case nvme.SGLInCapsule:
		tally.inCapsule++
		if sgl.Addr() != 0 || int(sgl.Length()) != len(msg)-nvme.SQESize {
			t.Errorf("%s: in-capsule SGL %+v with %d bytes of data", where, f.SGL, len(msg)-nvme.SQESize)
		}
	case nvme.SGLKeyed, nvme.SGLKeyedInvalidate:
		if len(msg) != nvme.SQESize {
			t.Errorf("%s: keyed SGL command with %d bytes of capsule", where, len(msg))
		}
	default:
		t.Errorf("%s: SGL id %#x", where, sgl.ID())
	}
	if s.Opcode() == nvme.OpcodeFabrics && s.FCType() == nvme.FCConnect {
		c := nvme.ConnectOf(s)
		q.connected = true
		q.ioQueue = c.QID != 0
		if c.RecFmt != 0 || (c.QID == 0 && c.SQSize != 31) || (c.QID == 1 && c.SQSize != 127) {
			t.Errorf("%s: Connect %+v", where, c)
		}
		cs := make(nvme.SQE, nvme.SQESize)
		enc.Encode(&f) // the same SQE again, rebuilt through the typed Connect
		c.Put(cs)
		if !bytes.Equal(cs[40:52], s[40:52]) {
			t.Errorf("%s: Connect.Put %x, want %x", where, []byte(cs[40:52]), []byte(s[40:52]))
		}
	} else if !q.connected {
		t.Errorf("%s: command before Connect", where)
	}
	if s.Opcode() == nvme.AdminIdentify && !isIOQueue(q) {
		id := nvme.IdentifyOf(s)
		var is nvme.SQE = make([]byte, nvme.SQESize)
		is.Encode(&f)
		id.Put(is)
		if !bytes.Equal(is, s) {
			t.Errorf("%s: Identify.Put changed the SQE", where)
		}
	}
	if _, dup := q.cmds[s.CID()]; dup {
		t.Errorf("%s: CID %d reused while outstanding", where, s.CID())
	}
	q.cmds[s.CID()] = append([]byte(nil), msg...) // SQE and in-capsule data
	tally.opcodes[opName(s, isIOQueue(q))]++
}

// isIOQueue: the capture's I/O queue is the one whose Connect said qid 1;
// until then every queue is taken as the admin queue.
func isIOQueue(q *nvmeQueue) bool {
	return q.ioQueue
}

// checkCompletion decodes a response capsule, matches it to its command,
// and checks the data the command moved.
func checkCompletion(t *testing.T, where string, q *nvmeQueue, msg []byte, inv *uint32, subNQN string, tally *nvmeTally) {
	t.Helper()
	if len(msg) != nvme.CQESize {
		t.Errorf("%s: response capsule of %d bytes", where, len(msg))
		return
	}
	c, _ := nvme.ParseCQE(msg)
	tally.completions++
	f := c.Fields()
	enc := make(nvme.CQE, nvme.CQESize)
	enc.Encode(&f)
	if !bytes.Equal(enc, c) {
		t.Errorf("%s: CQE re-encoded\n got %x\nwant %x", where, []byte(enc), []byte(c))
	}
	if !f.Status.OK() {
		t.Errorf("%s: status %v", where, f.Status)
	}
	s, ok := q.cmds[f.CID]
	if !ok {
		t.Errorf("%s: completion for CID %d, not outstanding", where, f.CID)
		return
	}
	delete(q.cmds, f.CID)
	sgl := nvme.SQE(s).SGL()
	if inv != nil {
		tally.sendInv++
		if sgl.ID() != nvme.SGLKeyedInvalidate || *inv != sgl.Key() {
			t.Errorf("%s: SEND with Invalidate of %#x for SGL %#x key %#x", where, *inv, sgl.ID(), sgl.Key())
		}
	} else if sgl.ID() == nvme.SGLKeyedInvalidate && sgl.Length() > 0 {
		t.Errorf("%s: no remote invalidation for a 0x4F SGL of %d bytes", where, sgl.Length())
	}
	switch {
	case s.Opcode() == nvme.OpcodeFabrics && s.FCType() == nvme.FCConnect:
		data := q.readResp
		if sgl.ID() == nvme.SGLInCapsule {
			data = s[nvme.SQESize:]
		} else if q.readKey != sgl.Key() {
			t.Errorf("%s: Connect data: READ of key %#x; SGL key %#x", where, q.readKey, sgl.Key())
			return
		}
		if len(data) != nvme.ConnectDataSize {
			t.Errorf("%s: Connect data of %d bytes", where, len(data))
			return
		}
		tally.connectData++
		d, _ := nvme.ParseConnectData(data)
		df := d.Fields()
		cn := nvme.ConnectOf(s)
		if df.SubNQN != subNQN || df.HostNQN == "" || (cn.QID == 0 && df.CNTLID != nvme.DynamicCNTLID) ||
			(cn.QID != 0 && df.CNTLID != uint16(f.Result)) {
			t.Errorf("%s: Connect data %+v for %+v, completion cntlid %d", where, df, cn, uint16(f.Result))
		}
		re := make([]byte, nvme.ConnectDataSize)
		nvme.ConnectData(re).Encode(&df)
		if !bytes.Equal(re, data) {
			t.Errorf("%s: Connect data re-encoded differs", where)
		}
	case s.Opcode() == nvme.AdminIdentify && !isIOQueue(q):
		id := nvme.IdentifyOf(s)
		if len(q.write) != int(sgl.Length()) || q.writeKey != sgl.Key() {
			t.Errorf("%s: Identify CNS %d: %d bytes written with key %#x, SGL %d bytes key %#x", where, id.CNS, len(q.write), q.writeKey, sgl.Length(), sgl.Key())
			return
		}
		switch id.CNS {
		case nvme.CNSController:
			tally.identifyCtrl++
			ic, err := nvme.ParseIdentifyController(q.write)
			if err != nil {
				t.Fatal(err)
			}
			cf := ic.Fields()
			// What Linux's host requires of a fabrics controller.
			if cf.SGLS&nvme.SGLSKeyed == 0 || cf.ICDOFF != 0 || cf.KAS == 0 || cf.IOCCSZ < 4 || cf.IORCSZ != 1 ||
				cf.SubNQN != subNQN || cf.MDTS == 0 || cf.SQES != 0x66 || cf.CQES != 0x44 {
				t.Errorf("%s: Identify Controller %+v", where, cf)
			}
			roundTrip := make([]byte, nvme.IdentifySize)
			nvme.IdentifyController(roundTrip).Encode(&cf)
			if g := nvme.IdentifyController(roundTrip).Fields(); g != cf {
				t.Errorf("%s: Identify Controller round trip\n got %+v\nwant %+v", where, g, cf)
			}
			t.Logf("%s: Identify Controller: mdts %d cntlid %d ver %#x kas %d maxcmd %d nn %d sgls %#x ioccsz %d oncs %#x vwc %d",
				where, cf.MDTS, cf.CNTLID, cf.VER, cf.KAS, cf.MAXCMD, cf.NN, cf.SGLS, cf.IOCCSZ, cf.ONCS, cf.VWC)
		case nvme.CNSNamespace:
			tally.identifyNS++
			ns, _ := nvme.ParseIdentifyNamespace(q.write)
			nf := ns.Fields()
			tally.blockSize = 1 << nf.BlockShift()
			if nf.NSZE == 0 || nf.BlockShift() < 9 {
				t.Errorf("%s: Identify Namespace %+v", where, nf)
			}
			roundTrip := make([]byte, nvme.IdentifySize)
			nvme.IdentifyNamespace(roundTrip).Encode(&nf)
			if g := nvme.IdentifyNamespace(roundTrip).Fields(); g != nf {
				t.Errorf("%s: Identify Namespace round trip", where)
			}
		case nvme.CNSActiveNSList:
			if l := nvme.ActiveNSList(q.write); len(l) != 1 || l[0] != 1 {
				t.Errorf("%s: active namespaces %v", where, l)
			}
		case nvme.CNSNSDescList:
			ds, err := nvme.NSDescriptors(q.write)
			if err != nil || len(ds) == 0 {
				t.Errorf("%s: namespace descriptors %v %v", where, ds, err)
			}
			re := make([]byte, len(q.write))
			if _, err := nvme.PutNSDescriptors(re, ds); err != nil || !bytes.Equal(re, q.write) {
				t.Errorf("%s: namespace descriptors re-encoded differ (%v)", where, err)
			}
		}
	case isIOQueue(q) && s.Opcode() == nvme.IORead:
		rw := nvme.RWOf(s)
		if len(q.write) != int(sgl.Length()) || int(rw.Blocks())*tally.blockSize != len(q.write) {
			t.Errorf("%s: Read %+v moved %d bytes (SGL %d)", where, rw, len(q.write), sgl.Length())
		}
	case isIOQueue(q) && s.Opcode() == nvme.IOWrite && sgl.Keyed():
		if q.readKey != sgl.Key() || len(q.readResp) != int(sgl.Length()) {
			t.Errorf("%s: Write: READ of key %#x, %d bytes; SGL %d bytes key %#x", where, q.readKey, len(q.readResp), sgl.Length(), sgl.Key())
		}
	case s.Opcode() == nvme.OpcodeFabrics && s.FCType() == nvme.FCPropertyGet:
		p := nvme.PropertyOf(s)
		if p.Offset == nvme.PropCAP {
			c := nvme.ParseCAP(f.Result)
			if !c.CSSNVM || c.MQES == 0 || c.TO == 0 {
				t.Errorf("%s: CAP %#x = %+v", where, f.Result, c)
			}
		}
	}
}
