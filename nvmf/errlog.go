package nvmf

import (
	"encoding/binary"

	"github.com/gorocev2/rocev2/nvme"
)

// errLogSlots is how many Error Information log entries a controller
// keeps (Identify's ELPE is one less): the newest, as nvmet keeps its
// last NVMET_ERROR_LOG_SLOTS. The error's completion carries the More
// bit, as nvmet_set_error sets it.
const errLogSlots = 128

// errEntrySize is the size of an Error Information log entry.
const errEntrySize = 64

// errEntry is one Error Information log entry: a command the controller
// completed with an error status.
type errEntry struct {
	count  uint64 // the controller's error count when it happened, from 1
	sqid   uint16
	cid    uint16
	status nvme.Status
	lba    uint64
	nsid   uint32
}

// put encodes the entry (NVMe Base, Error Information Log Entry): the
// status field is the status shifted past the phase tag, as in a
// completion; the parameter error location FFFFh (not tracked).
func (e *errEntry) put(b []byte) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], e.count)
	le.PutUint16(b[8:], e.sqid)
	le.PutUint16(b[10:], e.cid)
	le.PutUint16(b[12:], uint16(e.status)<<1)
	le.PutUint16(b[14:], 0xffff)
	le.PutUint64(b[16:], e.lba)
	le.PutUint32(b[24:], e.nsid)
}

// logError records that the command s (on queue qid) ended with status
// st. A Read, Write or Write Zeroes names its starting LBA.
func (c *tctrl) logError(qid uint16, cid uint16, st nvme.Status, s nvme.SQE) {
	e := errEntry{sqid: qid, cid: cid, status: st}
	if s != nil && s.Opcode() != nvme.OpcodeFabrics {
		e.nsid = s.NSID()
		if qid != 0 {
			switch s.Opcode() {
			case nvme.IORead, nvme.IOWrite, nvme.IOWriteZeroes:
				e.lba = nvme.RWOf(s).SLBA
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errCount++
	e.count = c.errCount
	c.errLog[c.errNext] = e
	c.errNext = (c.errNext + 1) % errLogSlots
}

// errorLog builds the Error Information log page: the controller's last
// errLogSlots errors, newest first, then zero entries.
func (c *tctrl) errorLog() []byte {
	page := make([]byte, errLogSlots*errEntrySize)
	c.mu.Lock()
	defer c.mu.Unlock()
	n := int(min(c.errCount, errLogSlots))
	for i := 0; i < n; i++ {
		e := c.errLog[(c.errNext-1-i+errLogSlots)%errLogSlots]
		e.put(page[i*errEntrySize:])
	}
	return page
}

// smartLog builds the SMART / Health Information log page: all zero
// (no temperature, spare or media figures for a file or memory) but the
// number of Error Information log entries the controller has had.
func (c *tctrl) smartLog() []byte {
	page := make([]byte, 512)
	c.mu.Lock()
	binary.LittleEndian.PutUint64(page[176:], c.errCount)
	c.mu.Unlock()
	return page
}
