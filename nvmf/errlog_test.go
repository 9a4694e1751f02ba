package nvmf

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/nvme"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestErrorLog: the commands a controller answers with an error are in
// its Error Information log page, newest first (error count, queue,
// command ID, status with the phase bit's place, LBA, namespace), as far
// as Identify's ELPE says, and their number in the SMART log, as nvmet
// keeps them: `nvme error-log` after a failed command shows it, and
// `nvme smart-log` counts it. (Both pages were all zero: nvme error-log
// showed one empty entry whatever had failed.)
func TestErrorLog(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 1, QueueSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	id := make([]byte, nvme.IdentifySize)
	if _, err := h.admin(ctx, &request{in: id, build: (&nvme.Identify{CNS: nvme.CNSController}).Put}); err != nil {
		t.Fatal(err)
	}
	if elpe := nvme.IdentifyController(id).Fields().ELPE; elpe != errLogSlots-1 {
		t.Errorf("ELPE %d, want %d", elpe, errLogSlots-1)
	}
	// An admin command the controller refuses: Get Features of FID 0x55.
	if _, err := h.admin(ctx, &request{build: func(s nvme.SQE) { (&nvme.Features{FID: 0x55}).Put(s, nvme.AdminGetFeatures) }}); !errors.Is(err, nvme.StatusInvalidField|nvme.StatusDNR) {
		t.Fatalf("Get Features 0x55: %v", err)
	}
	// An I/O command past the end (the host's own checks bypassed):
	// Write Zeroes at LBA 16384 of a 16384-block namespace.
	h.mu.Lock()
	q := h.cur.io[0]
	h.mu.Unlock()
	rw := nvme.RW{NSID: 1, SLBA: 16384, NLB: 7}
	if _, err := q.do(ctx, &request{build: func(s nvme.SQE) { rw.Put(s, nvme.IOWriteZeroes) }}); !errors.Is(err, nvme.StatusLBARange|nvme.StatusDNR) {
		t.Fatalf("Write Zeroes past the end: %v", err)
	}
	page := make([]byte, errLogSlots*errEntrySize)
	if err := h.logPage(ctx, nvme.LogError, page); err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	type entry struct {
		count  uint64
		sqid   uint16
		status uint16
		loc    uint16
		lba    uint64
		nsid   uint32
	}
	get := func(i int) entry {
		b := page[i*errEntrySize:]
		return entry{le.Uint64(b), le.Uint16(b[8:]), le.Uint16(b[12:]), le.Uint16(b[14:]), le.Uint64(b[16:]), le.Uint32(b[24:])}
	}
	for i, want := range []entry{
		{count: 2, sqid: 1, status: uint16(nvme.StatusLBARange|nvme.StatusDNR) << 1, loc: 0xffff, lba: 16384, nsid: 1},
		{count: 1, sqid: 0, status: uint16(nvme.StatusInvalidField|nvme.StatusDNR) << 1, loc: 0xffff},
		{},
	} {
		if got := get(i); got != want { // command IDs are the host's: not compared
			t.Errorf("error log entry %d: %+v, want %+v", i, got, want)
		}
	}
	smart := make([]byte, 512)
	if err := h.logPage(ctx, nvme.LogSMART, smart); err != nil {
		t.Fatal(err)
	}
	if n := le.Uint64(smart[176:]); n != 2 {
		t.Errorf("SMART: %d error log entries, want 2", n)
	}
}

// TestErrorLogWraps: past errLogSlots errors the page holds the newest
// errLogSlots, newest first.
func TestErrorLogWraps(t *testing.T) {
	c := &tctrl{}
	for i := 0; i < errLogSlots+5; i++ {
		c.logError(0, uint16(i), nvme.StatusInvalidField, nil)
	}
	page := c.errorLog()
	for i := 0; i < errLogSlots; i++ {
		b := page[i*errEntrySize:]
		if n, cid := binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint16(b[10:]); n != uint64(errLogSlots+5-i) || cid != uint16(errLogSlots+4-i) {
			t.Fatalf("entry %d: count %d cid %d", i, n, cid)
		}
	}
	if n := binary.LittleEndian.Uint64(c.smartLog()[176:]); n != errLogSlots+5 {
		t.Errorf("SMART count %d", n)
	}
}

// TestErrorMoreBit: a command answered with an error status carries the
// More bit (its Error Information log entry), as nvmet_set_error sets
// it; a success does not; the host's error is the status without it.
func TestErrorMoreBit(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	adm, _ := tgtAdmin(t, p, testNQN, 0)
	null := nvme.SGLFields{Type: nvme.SGLTypeKeyedDataBlock} // no data, as nvme_rdma_set_sg_null
	capsule := sqeWith(func(s nvme.SQE) { (&nvme.Features{FID: 0x55}).Put(s, nvme.AdminGetFeatures); s.SGL().Encode(&null) })
	if err := rawStatus(ctx, adm, capsule); !errors.Is(err, nvme.StatusInvalidField|nvme.StatusDNR) || !adm.lastMore {
		t.Fatalf("Get Features 0x55: %v, More bit %v; want Invalid Field, DNR with More", err, adm.lastMore)
	}
	capsule = sqeWith(func(s nvme.SQE) {
		(&nvme.Features{FID: nvme.FeatKATO}).Put(s, nvme.AdminGetFeatures)
		s.SGL().Encode(&null)
	})
	if err := rawStatus(ctx, adm, capsule); err != nil || adm.lastMore {
		t.Fatalf("Get Features KATO: %v, More bit %v", err, adm.lastMore)
	}
	if errLogSlots != 128 {
		t.Errorf("%d error log entries kept, nvmet keeps 128", errLogSlots)
	}
}
