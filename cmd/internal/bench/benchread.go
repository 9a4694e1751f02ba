package bench

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/ipv4"
)

// The READ rows' raw UDP baseline is what an RDMA READ asks of UDP: one
// request datagram per message from the reader, the message's response
// datagrams back from the peer. A one-way stream of the response datagrams
// alone (the WRITE and SEND rows' baseline) leaves out half the datagrams a
// READ needs; at 64 B and 4 KiB, where the per-datagram cost of the kernel
// dominates, it set a bar no READ over UDP can reach. The READ rows still
// measure that stream too and print the stack's ratio to it below the
// table.

// readRequestBytes is the UDP payload of a READ request: BTH, RETH, ICRC.
const readRequestBytes = 12 + 16 + 4

// readResponseChunks returns the UDP payload sizes of the READ response
// datagrams of one message of size bytes at path MTU mtu: the first and
// the last (or the only one) carry an AETH (BTH + AETH + payload + ICRC),
// the middle ones do not (BTH + payload + ICRC).
func readResponseChunks(size, mtu int) []int {
	var chunks []int
	for left := size; left > 0; left -= mtu {
		chunks = append(chunks, min(left, mtu)+16)
	}
	chunks[0] += 4
	if len(chunks) > 1 {
		chunks[len(chunks)-1] += 4
	}
	return chunks
}

// gsoGroups cuts a stream of datagram sizes into UDP GSO datagrams as
// udp.SocketLink and rawGoodput group them: runs of equal size, the last
// of a run possibly shorter, at most gsoSegs segments and gsoBytes bytes.
// It returns each GSO datagram's total length, segment size and segment
// count.
func gsoGroups(stream []int) (total, seg, n []int) {
	for i := 0; i < len(stream); {
		s, k, t := stream[i], 0, 0
		for i < len(stream) && k < gsoSegs && stream[i] <= s && t+stream[i] <= gsoBytes {
			t += stream[i]
			k++
			short := stream[i] < s
			i++
			if short {
				break
			}
		}
		total, seg, n = append(total, t), append(seg, s), append(n, k)
	}
	return total, seg, n
}

// rawBatcher builds and sends batches of datagrams (or, with gso, GSO
// datagrams) of given sizes to one address. The content is irrelevant:
// every message points into one zeroed backing buffer.
type rawBatcher struct {
	conn    batchConn
	dst     net.Addr
	gso     bool
	backing []byte
	cmsgs   map[int][]byte // UDP_SEGMENT control message per segment size
	msgs    []ipv4.Message
}

func newRawBatcher(conn batchConn, dst net.Addr, gso bool) *rawBatcher {
	return &rawBatcher{conn: conn, dst: dst, gso: gso, backing: make([]byte, 65536), cmsgs: map[int][]byte{}}
}

// send sends the datagrams of stream (their sizes) and returns how many
// it sent; ENOBUFS/EAGAIN are retried.
func (r *rawBatcher) send(stream []int) (int, error) {
	r.msgs = r.msgs[:0]
	var counts []int
	if r.gso {
		total, seg, n := gsoGroups(stream)
		for i := range total {
			oob, ok := r.cmsgs[seg[i]]
			if !ok {
				oob = gsoCmsg(seg[i])
				r.cmsgs[seg[i]] = oob
			}
			if n[i] == 1 {
				oob = nil
			}
			r.msgs = append(r.msgs, ipv4.Message{Buffers: [][]byte{r.backing[:total[i]]}, OOB: oob, Addr: r.dst})
		}
		counts = n
	} else {
		for _, s := range stream {
			r.msgs = append(r.msgs, ipv4.Message{Buffers: [][]byte{r.backing[:s]}, Addr: r.dst})
		}
	}
	sent := 0
	for off := 0; off < len(r.msgs); {
		end := min(off+benchBatch, len(r.msgs))
		k, err := r.conn.WriteBatch(r.msgs[off:end], 0)
		for j := off; j < off+max(k, 0); j++ {
			if counts != nil {
				sent += counts[j]
			} else {
				sent++
			}
		}
		off += max(k, 0)
		if err != nil {
			if errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.EAGAIN) {
				continue
			}
			return sent, err
		}
	}
	return sent, nil
}

// datagrams returns how many datagrams a received buffer holds (a UDP_GRO
// buffer several of segment size, the last possibly shorter).
func datagrams(m *ipv4.Message) int {
	if seg := groSegment(m.OOB[:m.NN]); seg > 0 {
		return (m.N + seg - 1) / seg
	}
	return 1
}

func newRecvBatch() []ipv4.Message {
	rm := make([]ipv4.Message, benchBatch)
	for i := range rm {
		rm[i] = ipv4.Message{Buffers: [][]byte{make([]byte, 65536)}, OOB: make([]byte, 64)}
	}
	return rm
}

// rawReadGoodput runs the READ rows' raw baseline for c.dur: A keeps at
// most window messages of size bytes outstanding, asking for each with one
// request datagram; B answers every request it receives with the
// message's response datagrams, in the order received. Without gso both
// directions move batches of up to benchBatch datagrams with
// sendmmsg/recvmmsg; with gso each batch leaves as GSO datagrams (runs of
// equal size) into a UDP_GRO socket. A message counts as delivered when
// its last response datagram has arrived; a round whose responses stop
// coming for 50 ms is given up (its datagrams count as lost).
func rawReadGoodput(ctx context.Context, c *benchConfig, size, window int, gso bool) (benchRun, error) {
	sa, sb, err := rawPairGRO(c, gso, gso)
	if err != nil {
		return benchRun{}, err
	}
	defer sa.Close()
	defer sb.Close()
	chunks := readResponseChunks(size, c.MTU.Bytes())
	perMsg := len(chunks)
	// B: the responder.
	var respSent atomic.Int64 // response datagrams B sent
	var reqRcvd atomic.Int64  // request datagrams B received
	var respErr error
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rb := newBatchConn(sb, c.A.Is4())
		out := newRawBatcher(rb, sa.LocalAddr(), gso)
		rm := newRecvBatch()
		var stream []int
		for {
			sb.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			n, err := rb.ReadBatch(rm, 0)
			reqs := 0
			for i := range max(n, 0) {
				reqs += datagrams(&rm[i])
			}
			if reqs > 0 {
				reqRcvd.Add(int64(reqs))
				stream = stream[:0]
				for range reqs {
					stream = append(stream, chunks...)
				}
				k, err := out.send(stream)
				respSent.Add(int64(k))
				if err != nil {
					respErr = err
					return
				}
			}
			if err != nil {
				select {
				case <-stop:
					return
				default:
				}
			}
		}
	}()
	// A: the reader.
	ra := newBatchConn(sa, c.A.Is4())
	req := newRawBatcher(ra, sb.LocalAddr(), gso)
	rm := newRecvBatch()
	reqStream := make([]int, 0, window)
	var reqSent, respRcvd, lostDgrams int64 // datagrams
	var posted, done int64                  // messages
	cpu := startCPU()
	start := time.Now()
	deadline := start.Add(c.dur)
	for ctx.Err() == nil {
		if time.Now().Before(deadline) && posted-done < int64(window) {
			k := int(int64(window) - (posted - done))
			reqStream = reqStream[:0]
			for range k {
				reqStream = append(reqStream, readRequestBytes)
			}
			n, err := req.send(reqStream)
			reqSent += int64(n)
			posted += int64(n)
			if err != nil {
				close(stop)
				wg.Wait()
				return benchRun{}, err
			}
		}
		if posted == done {
			break
		}
		sa.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		n, err := ra.ReadBatch(rm, 0)
		for i := range max(n, 0) {
			respRcvd += int64(datagrams(&rm[i]))
		}
		done = (respRcvd + lostDgrams) / int64(perMsg)
		if err != nil && n <= 0 {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				close(stop)
				wg.Wait()
				return benchRun{}, err
			}
			// Nothing for 50 ms: what is outstanding is lost.
			lostDgrams = posted*int64(perMsg) - respRcvd
			done = posted
		}
	}
	el := time.Since(start)
	close(stop)
	wg.Wait()
	if respErr != nil {
		return benchRun{}, respErr
	}
	delivered := respRcvd / int64(perMsg)
	run := benchRun{
		bytes: float64(delivered) * float64(size),
		pkts:  float64(reqRcvd.Load() + respRcvd),
		sent:  float64(reqSent + respSent.Load()),
		el:    el,
	}
	run.cpu, run.cpuSeen = cpu.stop()
	return run, ctx.Err()
}
