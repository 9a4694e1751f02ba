package perftest

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/cmd/internal/oob"
	"github.com/gorocev2/rocev2/transport"
)

// latReadAtomic is the client of read-lat / atomic-lat: one operation at a
// time.
func (s *perfSide) latReadAtomic(ctx context.Context, size int, stdout io.Writer, prog *perfProgress) error {
	c := s.c
	ts := make([]time.Time, 0, c.iters+1)
	var wc [1]transport.WC
	for n := 0; n < c.iters; n++ {
		prog.tick(n)
		ts = append(ts, time.Now())
		if err := s.postSendWait(ctx, s.sendWR(size, uint64(n)), wc[:], n, "completion", n); err != nil {
			return err
		}
	}
	s.latDone(stdout, size, ts, 1)
	return nil
}

// postSendWait posts wr and waits for its completion on the send CQ, using
// wc[0]. postN, waitWhat and waitN word the errors.
func (s *perfSide) postSendWait(ctx context.Context, wr transport.SendWR, wc []transport.WC, postN int, waitWhat string, waitN int) error {
	if err := s.QP.PostSend(wr); err != nil {
		return fmt.Errorf("couldn't post send %d: %w", postN, err)
	}
	if _, err := s.SCQ.Wait(ctx, wc[:1]); err != nil {
		return fmt.Errorf("waiting for %s %d: %w", waitWhat, waitN, err)
	}
	if wc[0].Status != transport.WCSuccess {
		return cli.WCError(wc[0], "send")
	}
	return nil
}

// latDone ends a latency run: it stamps the end of the last iteration,
// records the result and prints the latency line.
func (s *perfSide) latDone(stdout io.Writer, size int, ts []time.Time, rtt float64) {
	ts = append(ts, time.Now())
	s.results = append(s.results, perfResult{size: size, iters: s.c.iters})
	printLat(stdout, size, s.c.iters, ts, rtt, s.c.unsorted, s.c.histogram, s.c.output)
}

// perfProgressEvery is the interval between progress lines on stderr of a
// long run (a variable so tests can shorten it).
var perfProgressEvery = 2 * time.Second

// perfProgress prints a line to stderr every perfProgressEvery of a long
// latency run.
type perfProgress struct {
	w           io.Writer
	size, iters int
	start, last time.Time
}

func newPerfProgress(w io.Writer, size, iters int) *perfProgress {
	now := time.Now()
	return &perfProgress{w: w, size: size, iters: iters, start: now, last: now}
}

// tick reports that n iterations are done.
func (p *perfProgress) tick(n int) {
	if n&63 != 0 {
		return
	}
	now := time.Now()
	if now.Sub(p.last) < perfProgressEvery {
		return
	}
	p.last = now
	fmt.Fprintf(p.w, " ... %d bytes: %d of %d iterations in %.1fs\n", p.size, n, p.iters, now.Sub(p.start).Seconds())
}

// pollByte spins until mem[off] equals v (the peer's RDMA WRITE lands
// in mmap'd memory, as a NIC's DMA would). Between looks it lets dev
// handle what its link received (Device.Progress: with busy polling the
// arriving WRITE is placed right here, as transport's documentation asks
// of a memory-polling application) and yields the processor, so that
// the device's receive goroutine runs when the link does not busy-poll.
// It never sleeps on a timer: Go's timers fire about a millisecond late
// when the process is otherwise idle (a 1 µs time.Sleep here took ~400 µs,
// and each one that met the peer's WRITE added that to the round trip).
//
// Every 65536 spins it also calls stalled, if not nil, and gives up with
// its error.
func pollByte(ctx context.Context, dev *transport.Device, mem []byte, off int, v byte, stalled func() error) error {
	word := (*uint32)(unsafe.Pointer(&mem[off&^3]))
	shift := uint(off&3) * 8
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		shift = uint(3-off&3) * 8
	}
	for spins := 0; ; spins++ {
		if byte(atomic.LoadUint32(word)>>shift) == v {
			return nil
		}
		if spins&63 == 63 {
			if spins&65535 == 65535 {
				if err := ctx.Err(); err != nil {
					return err
				}
				if stalled != nil {
					if err := stalled(); err != nil {
						return err
					}
				}
			}
			if dev.Progress() == 0 {
				runtime.Gosched()
			}
		}
	}
}

// latWrite is write-lat: each side writes size bytes into the peer's buffer,
// whose last byte is the iteration count, and spins on its own buffer's last
// byte for the peer's write (perftest's run_iter_lat_write). The server
// waits for the client's first write before writing.
func (s *perfSide) latWrite(ctx context.Context, size int, role oob.Role, stdout io.Writer, prog *perfProgress) error {
	c := s.c
	ts := make([]time.Time, 0, c.iters+1)
	post := size - 1
	poll := s.dstOff(0) + size - 1
	var wc [1]transport.WC
	var scnt, rcnt int
	// stalled looks for a write of another size once the peer's write
	// rcnt is perfLatStall late (the time is taken from the first look).
	stallN, stallSince := 0, time.Time{}
	stalled := func() error {
		if stallN != rcnt {
			stallN, stallSince = rcnt, time.Now()
			return nil
		}
		if time.Since(stallSince) < perfLatStall {
			return nil
		}
		return s.writeLatOtherSize(size, rcnt, len(s.results) == 0)
	}
	for scnt < c.iters || rcnt < c.iters {
		// The server writes first (perftest: the client polls first).
		if rcnt < c.iters && !(scnt < 1 && role == oob.Server) {
			rcnt++
			if err := pollByte(ctx, s.Dev, s.mem, poll, byte(rcnt), stalled); err != nil {
				return fmt.Errorf("waiting for the peer's write %d: %w", rcnt, err)
			}
		}
		if scnt < c.iters {
			prog.tick(scnt)
			ts = append(ts, time.Now())
			scnt++
			s.mem[post] = byte(scnt)
			if err := s.postSendWait(ctx, s.sendWR(size, 0), wc[:], scnt, "completion", scnt); err != nil {
				return err
			}
		}
	}
	s.latDone(stdout, size, ts, 2)
	return nil
}

// perfLatStall is how long write-lat waits for the peer's write before it
// looks for a write of another size in its buffer (a variable so tests can
// shorten it).
var perfLatStall = 2 * time.Second

// writeLatOtherSize looks at the target of write-lat, which has waited
// for the peer's write n of size bytes at its last byte, for the peer's
// write ending elsewhere: the last non-zero byte of the target holding
// the count n (the target starts zeroed, and the peer's writes all start
// at its first byte). A write that ends before the last byte is only
// taken for one at the first size (first): later sizes leave the ends of
// the smaller ones behind. It returns nil when nothing says so.
func (s *perfSide) writeLatOtherSize(size, n int, first bool) error {
	target := s.dst(0)
	end := len(target) - 1
	for end >= 0 && target[end] == 0 {
		end--
	}
	if end < 0 || end == size-1 || target[end] != byte(n) || end < size-1 && !first {
		return nil
	}
	return fmt.Errorf("the peer's write %d ended at byte %d of this side's buffer instead of at byte %d: "+
		"the peer writes %d-byte messages, this side %d (-s differs? both sides need the same -s)", n, end, size-1, end+1, size)
}

// recvSizeError is the error for receive n (from 1) of got bytes where
// the run's messages have want.
func recvSizeError(n int, got uint32, want int) error {
	return fmt.Errorf("receive %d: the peer sent %d bytes, this side expects %d (-s differs? both sides need the same -s)", n, got, want)
}

// latSend is send-lat: the client sends, the server answers each message
// with one of its own (perftest's run_iter_lat_send).
func (s *perfSide) latSend(ctx context.Context, size int, role oob.Role, stdout io.Writer, prog *perfProgress) error {
	c := s.c
	ts := make([]time.Time, 0, c.iters+1)
	var scnt, rcnt int
	wcs := make([]transport.WC, 4)
	waitRecv := func() error {
		n, err := s.RCQ.Wait(ctx, wcs[:1])
		if err != nil {
			return fmt.Errorf("waiting for receive %d: %w", rcnt+1, err)
		}
		wc := wcs[0]
		_ = n
		if wc.Status != transport.WCSuccess {
			return cli.WCError(wc, "receive")
		}
		if wc.ByteLen != uint32(size) {
			return recvSizeError(rcnt+1, wc.ByteLen, size)
		}
		rcnt++
		s.qps[0].posted--
		if s.qps[0].posted < s.recvDepth() && rcnt+s.qps[0].posted < c.iters {
			return s.postRecv(0)
		}
		return nil
	}
	for scnt < c.iters || rcnt < c.iters {
		if rcnt < c.iters && !(scnt < 1 && role == oob.Client) {
			if err := waitRecv(); err != nil {
				return err
			}
		}
		if scnt < c.iters {
			prog.tick(scnt)
			ts = append(ts, time.Now())
			if err := s.postSendWait(ctx, s.sendWR(size, 0), wcs, scnt, "send completion", scnt+1); err != nil {
				return err
			}
			scnt++
		}
	}
	s.latDone(stdout, size, ts, 2)
	return nil
}
