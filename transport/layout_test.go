package transport

import (
	"reflect"
	"strings"
	"testing"
	"unsafe"
)

// The fields a 64 KiB WRITE's path reads or writes on each QP, from
// cachegrind's misses per source line of BenchmarkScaleActiveMem
// (scripts/miss-scale.sh): every packet's input, a post, the scheduler's
// turn and account on the requester; a WRITE's packets and its ACK on the
// responder. Paths into embedded structs are dotted (unexported fields
// of other packages' structs included: dcqcn.RP's limited and held).
var (
	qpHotCommon = []string{
		"dev", "mu", "qpn", "transport", "destroyed", "rxBatch", "cqLost", "commEst", "rxQueued", "outSmall",
		"rxIn", "sr", "trace", "mtu", "timeout", "heard",
		"attr.State", "attr.AccessFlags", "attr.DestQPN", "attr.AV", "attr.MaxQPRdAtomic",
		"peer", "pd", "rv", "sendCQ", "srcPort", "init",
		"out", "outBufs", "nout", "slabs", "slabOff", "ackSlot", "zcTaken",
	}
	qpHotRequester = []string{
		"sq", "sqHead", "sqCur", "sqEnd", "sqMask", "probes", "roomWait", "roomSig",
		"req", "comp", "tq", "tmr",
		"schedQueued", "schedTurn", "schedMore", "schedInBatch", "schedMarked", "schedStale",
		"schedLeft", "schedInflight", "schedHolder", "schedMarkPSN", "schedMarkAt",
		"schedFromTurn", "schedMarkLo", "schedIdleAt",
		"cc.paceArmed", "cc.rp.limited", "cc.rp.held",
	}
	qpHotResponder = []string{
		"resp.qp", "resp.psn", "resp.msn", "resp.nakSent", "resp.op", "resp.wqeActive", "resp.wlen", "resp.offset",
		"resp.wt", "resp.rd.active", "resp.held.q", "resp.held.head",
	}
)

// qpSinkT keeps QPs allocated by the test on the heap.
type qpSinkT []*QP

var qpSink qpSinkT

func (s *qpSinkT) new() *QP {
	q := new(QP)
	*s = append(*s, q)
	return q
}

// qpFieldSpan returns the offset and size in QP of the field at path.
func qpFieldSpan(t *testing.T, path string) (off, size uintptr) {
	t.Helper()
	typ := reflect.TypeOf(QP{})
	for _, name := range strings.Split(path, ".") {
		f, ok := typ.FieldByName(name)
		if !ok {
			t.Fatalf("%s: no field %s in %v", path, name, typ)
		}
		off += f.Offset
		typ = f.Type
	}
	return off, typ.Size()
}

// qpLines returns the 64-byte cache lines of a QP that starts base bytes
// into a line that the fields at paths touch.
func qpLines(t *testing.T, base uintptr, paths ...[]string) map[uintptr]bool {
	lines := map[uintptr]bool{}
	for _, ps := range paths {
		for _, p := range ps {
			off, size := qpFieldSpan(t, p)
			off += base
			for l := off / 64; l <= (off+size-1)/64; l++ {
				lines[l] = true
			}
		}
	}
	return lines
}

// TestQPHotLayout pins the QP's layout for many QPs (issue 30 item 4).
// With 10,000 active QPs no QP's state stays in the CPU's caches between
// its messages, so every cache line a WRITE's path touches on it is a
// miss (several: the post, the scheduler's turn and the ACK come far
// apart). The fields that path uses are grouped at the front of the QP
// and of its embedded roles; this test fails when a change spreads them
// over more lines again (a new field in the middle of the hot group, a
// hot field moved to the cold end): at 2cdb760 a requester's path touched
// 19 of the QP's lines and a responder's 15, against 12 and 9 here. A
// change that needs a new hot field should put it in the hot group and,
// if a budget below must grow, say why.
func TestQPHotLayout(t *testing.T) {
	// Where in a line a QP starts: Go's allocator puts an object of this
	// size at a multiple of its size class (1,792 bytes; the classes above
	// 1 KiB are multiples of 64) from an 8 KiB-aligned span, and since Go
	// 1.22 an object above 512 bytes that holds pointers starts after an
	// 8-byte header there: a QP starts 8 bytes into a line, the same for
	// every QP.
	base := uintptr(unsafe.Pointer(qpSink.new())) % 64
	for range 4 {
		if b := uintptr(unsafe.Pointer(qpSink.new())) % 64; b != base {
			t.Fatalf("QPs start %d and %d bytes into a cache line", base, b)
		}
	}
	qpSink = nil
	req := qpLines(t, base, qpHotCommon, qpHotRequester)
	resp := qpLines(t, base, qpHotCommon, qpHotResponder)
	t.Logf("a QP starts %d bytes into a line; a requester's WRITE path touches %d of its lines, a responder's %d", base, len(req), len(resp))
	if len(req) > 12 {
		t.Errorf("a requester's WRITE path touches %d cache lines of its QP, want at most 12", len(req))
	}
	if len(resp) > 9 {
		t.Errorf("a responder's WRITE path touches %d cache lines of its QP, want at most 9", len(resp))
	}
	// The cold tail: the scratch Fields of READ/atomic/NAK packets and
	// the fields of errors and events come after every hot field.
	var last uintptr
	for _, ps := range [][]string{qpHotCommon, qpHotRequester, qpHotResponder} {
		for _, p := range ps {
			off, size := qpFieldSpan(t, p)
			last = max(last, off+size)
		}
	}
	for _, cold := range []string{"reqF", "respF", "failErr", "destroyCause", "commEstCh", "resp.rsl", "resp.srqWQE"} {
		if off, _ := qpFieldSpan(t, cold); off < last {
			t.Errorf("%s at offset %d, before the last hot field's end %d", cold, off, last)
		}
	}
}

// TestSendWQEHotLayout: a send queue slot keeps what a WRITE's post,
// turns and ACK read (its header fields, and wr's fields up to RKey) in
// its first 136 bytes, at most three cache lines wherever the slot
// starts; wr's rarely used fields (atomics, UD, memory windows) and the
// READ's scatter list come after. At 2cdb760 wr came first and the
// header after its 144 bytes, so a WRITE read bytes 0-72, 144-194 and
// 288-296 of a 296-byte slot: four or five lines.
func TestSendWQEHotLayout(t *testing.T) {
	typ := reflect.TypeOf(sendWQE{})
	var end uintptr
	for _, name := range []string{"sges", "ref", "npkts", "length", "firstPSN", "signaled", "rdCounted", "done", "localDone", "probe", "status"} {
		f, _ := typ.FieldByName(name)
		end = max(end, f.Offset+f.Type.Size())
	}
	wr, _ := typ.FieldByName("wr")
	for _, name := range []string{"WRID", "Opcode", "SGEs", "Flags", "Imm", "InvRKey", "RemoteAddr", "RKey"} {
		f, _ := wr.Type.FieldByName(name)
		end = max(end, wr.Offset+f.Offset+f.Type.Size())
	}
	if end > 136 {
		t.Errorf("a WRITE reads the first %d bytes of a send WQE, want at most 136", end)
	}
	for _, cold := range []string{"rsl"} {
		if f, _ := typ.FieldByName(cold); f.Offset < end {
			t.Errorf("%s at offset %d, inside the hot %d bytes", cold, f.Offset, end)
		}
	}
}
