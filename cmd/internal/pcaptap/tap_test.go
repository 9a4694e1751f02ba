package pcaptap

import (
	"bytes"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/google/gopacket/pcapgo"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/rocelayer"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// build returns a RoCEv2 SEND_ONLY payload with n payload bytes.
func build(t testing.TB, n int, psn uint32) []byte {
	t.Helper()
	buf := make([]byte, udp.MaxPacketSize)
	f := packet.Fields{BTH: bth.Fields{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, DestQP: 0x11, PSN: bth.PSN(psn), AckReq: true},
		Payload: bytes.Repeat([]byte{byte(n)}, n)}
	l, err := packet.Build(buf, &f)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:l]
}

// TestTapMemNetwork sends packets both ways between two MemLinks, each
// wrapped in a Tap recording both directions, and checks that every frame
// in the capture decodes as Ethernet/IP/UDP/BTH with a valid ICRC.
func TestTapMemNetwork(t *testing.T) {
	for _, addrs := range [][2]string{{"192.0.2.1", "192.0.2.2"}, {"2001:db8::1", "2001:db8::2"}} {
		var out bytes.Buffer
		w, err := NewWriter(&out)
		if err != nil {
			t.Fatal(err)
		}
		n := memnet.NewMemNetwork(memnet.Faults{})
		a, b := netip.MustParseAddr(addrs[0]), netip.MustParseAddr(addrs[1])
		la, _ := n.Link(a)
		lb, _ := n.Link(b)
		ta, tb := New(la, w, Both), New(lb, w, Both)
		const count = 6
		for i := 0; i < count; i++ {
			p := []udp.Packet{{Buf: build(t, 100*i+1, uint32(i)), Addr: b, SrcPort: 0xc123, TOS: 2}}
			if err := ta.Send(p); err != nil {
				t.Fatal(err)
			}
			rp := []udp.Packet{{Buf: make([]byte, udp.MaxPacketSize)}}
			if k, err := tb.Recv(rp); err != nil || k != 1 {
				t.Fatal(k, err)
			}
		}
		if w.Packets() != 2*count || w.Unverified() != 0 {
			t.Fatalf("%v: %d packets, %d unverified", addrs, w.Packets(), w.Unverified())
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		r, err := pcapgo.NewReader(&out)
		if err != nil {
			t.Fatal(err)
		}
		frames := 0
		for {
			data, _, err := r.ReadPacketData()
			if err != nil {
				break
			}
			frames++
			p := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default)
			if p.Layer(rocelayer.LayerTypeBTH) == nil {
				t.Fatalf("frame %d: no BTH: %v", frames, p)
			}
			if err := rocelayer.VerifyICRC(p); err != nil {
				t.Fatalf("frame %d: %v", frames, err)
			}
		}
		if frames != 2*count {
			t.Fatalf("%d frames", frames)
		}
	}
}

// TestWriterUnverified: a payload whose ICRC no header explains is written
// and counted.
func TestWriterUnverified(t *testing.T) {
	var out bytes.Buffer
	w, _ := NewWriter(&out)
	p := build(t, 10, 1) // ICRC still zero
	if err := w.WritePacket(netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), 0xc000, 0, p); err != nil {
		t.Fatal(err)
	}
	if w.Unverified() != 1 || w.Packets() != 1 {
		t.Fatalf("unverified %d packets %d", w.Unverified(), w.Packets())
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.WritePacket(netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), 0xc000, 0, p); err != ErrClosed {
		t.Fatalf("after close: %v", err)
	}
}

// countRecords returns the number of records of a classic pcap file.
func countRecords(t *testing.T, b []byte) int {
	t.Helper()
	r, err := pcapgo.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		if _, _, err := r.ReadPacketData(); err != nil {
			return n
		}
		n++
	}
}

// TestWriterCountsAndSnapLen: traffic both ways between two tapped links,
// recorded whole and headers-only (snap length 128): each file holds as
// many records as its writer and its taps counted, which equal the links'
// own counters; a headers-only record is the whole record's first 128
// bytes with the frame's real length.
func TestWriterCountsAndSnapLen(t *testing.T) {
	var whole, cut bytes.Buffer
	ww, err := NewWriter(&whole)
	if err != nil {
		t.Fatal(err)
	}
	wc, err := NewWriterSnap(&cut, 128)
	if err != nil {
		t.Fatal(err)
	}
	if wc.SnapLen() != 128 {
		t.Fatalf("SnapLen %d", wc.SnapLen())
	}
	n := memnet.NewMemNetwork(memnet.Faults{})
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	la, _ := n.Link(a)
	lb, _ := n.Link(b)
	// Each link under two taps, one per writer.
	ta := New(New(la, ww, Both), wc, Both)
	tb := New(New(lb, ww, Both), wc, Both)
	const count = 20
	rp := []udp.Packet{{Buf: make([]byte, udp.MaxPacketSize)}}
	for i := 0; i < count; i++ {
		from, to, dst := ta, tb, b
		if i%2 == 1 {
			from, to, dst = tb, ta, a
		}
		if err := from.Send([]udp.Packet{{Buf: build(t, 37*i+1, uint32(i)), Addr: dst, SrcPort: 0xc123}}); err != nil {
			t.Fatal(err)
		}
		rp[0].Buf = rp[0].Buf[:cap(rp[0].Buf)]
		if k, err := to.Recv(rp); err != nil || k != 1 {
			t.Fatal(k, err)
		}
	}
	for _, w := range []*Writer{ww, wc} {
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	sa, ra := ta.Recorded()
	sb, rb := tb.Recorded()
	links := la.Stats().SentPkts + la.Stats().RcvdPkts + lb.Stats().SentPkts + lb.Stats().RcvdPkts
	for _, c := range []struct {
		name string
		w    *Writer
		file []byte
	}{{"whole", ww, whole.Bytes()}, {"snaplen 128", wc, cut.Bytes()}} {
		if recs := countRecords(t, c.file); uint64(recs) != c.w.Packets() || c.w.Packets() != 2*count || links != 2*count {
			t.Errorf("%s: %d records, writer counted %d, links %d, want %d", c.name, recs, c.w.Packets(), links, 2*count)
		}
	}
	if sa+ra+sb+rb != 2*count {
		t.Errorf("taps recorded %d+%d+%d+%d, want %d", sa, ra, sb, rb, 2*count)
	}
	rw, _ := pcapgo.NewReader(bytes.NewReader(whole.Bytes()))
	rc, _ := pcapgo.NewReader(bytes.NewReader(cut.Bytes()))
	if rc.Snaplen() != 128 {
		t.Errorf("file snap length %d", rc.Snaplen())
	}
	for i := 0; ; i++ {
		dw, ciw, errw := rw.ReadPacketData()
		dc, cic, errc := rc.ReadPacketData()
		if errw != nil || errc != nil {
			if errw != errc {
				t.Errorf("record %d: %v / %v", i, errw, errc)
			}
			break
		}
		if cic.Length != ciw.Length || len(dc) != min(128, len(dw)) || !bytes.Equal(dc, dw[:len(dc)]) {
			t.Errorf("record %d: cut %d of %d bytes, whole %d of %d; prefixes differ: %v", i, len(dc), cic.Length, len(dw), ciw.Length, !bytes.Equal(dc, dw[:min(len(dc), len(dw))]))
		}
	}
	if _, err := NewWriterSnap(&cut, -1); err == nil {
		t.Error("negative snap length accepted")
	}
}

// TestWriterFlushes: a record reaches the file within FlushInterval with no
// Flush or Close, and Flush writes at once.
func TestWriterFlushes(t *testing.T) {
	var mu sync.Mutex
	var out bytes.Buffer
	w, err := NewWriter(lockedWriter{&mu, &out})
	if err != nil {
		t.Fatal(err)
	}
	size := func() int { mu.Lock(); defer mu.Unlock(); return out.Len() }
	head := size()
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	if err := w.WritePacket(a, b, 0xc000, 0, build(t, 10, 1)); err != nil {
		t.Fatal(err)
	}
	if size() != head {
		t.Fatal("written at once: not buffered")
	}
	deadline := time.Now().Add(FlushInterval + 2*time.Second)
	for size() == head && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if size() == head {
		t.Fatalf("not in the file %v after it was recorded", FlushInterval+2*time.Second)
	}
	one := size()
	w.WritePacket(a, b, 0xc000, 0, build(t, 10, 2))
	if err := w.Flush(); err != nil || size() != 2*one-head {
		t.Errorf("Flush: %v, file %d bytes, want %d", err, size(), 2*one-head)
	}
	w.Close()
}

// lockedWriter is a bytes.Buffer written by the file goroutine and read by
// the test.
type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
