//go:build linux

package faults

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"testing"
)

// needRoot skips (or, with CI=true, fails) when BPF programs cannot be
// loaded.
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("loading BPF programs needs root (CI=true: not skipping)")
		}
		t.Skip("SKIPPED LOUDLY: loading BPF programs needs root")
	}
}

func load(t testing.TB, cfg Config) *Injector {
	t.Helper()
	needRoot(t)
	inj, err := Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inj.Close() })
	return inj
}

// skbCtx is a prefix of struct __sk_buff up to gso_size, for test runs.
type skbCtx [45]uint32

func (c *skbCtx) setMark(v uint32)    { c[skbMark/4] = v }
func (c *skbCtx) setGSOSegs(v uint32) { c[skbGSOSegs/4] = v; c[176/4] = 1000 }

// frame options.
type frameOpts struct {
	v6      bool
	proto   uint8 // default UDP
	dport   uint16
	opcode  uint8
	psn     uint32
	destQP  uint32
	tos     uint8 // IPv4 TOS or IPv6 traffic class
	payload int
	frag    bool
}

// frame builds an Ethernet frame; RoCE by default (UDP 4791, BTH).
func frame(o frameOpts) []byte {
	if o.proto == 0 {
		o.proto = 17
	}
	if o.dport == 0 {
		o.dport = 4791
	}
	eth := []byte{0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00}
	l4 := make([]byte, 8+12+o.payload+4)
	binary.BigEndian.PutUint16(l4[0:], 0xc123)
	binary.BigEndian.PutUint16(l4[2:], o.dport)
	binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
	b := l4[8:]
	b[0] = o.opcode
	binary.BigEndian.PutUint16(b[2:], 0xffff)
	binary.BigEndian.PutUint32(b[4:], o.destQP&0xffffff)
	binary.BigEndian.PutUint32(b[8:], o.psn&0xffffff)
	for i := range o.payload {
		b[12+i] = byte(i * 7)
	}
	var ip []byte
	if o.v6 {
		eth[12], eth[13] = 0x86, 0xdd
		ip = make([]byte, 40)
		binary.BigEndian.PutUint32(ip[0:], 6<<28|uint32(o.tos)<<20|0xabcde)
		binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
		ip[6], ip[7] = o.proto, 64
		copy(ip[8:], []byte{0x20, 0x01, 0x0d, 0xb8, 15: 1})
		copy(ip[24:], []byte{0x20, 0x01, 0x0d, 0xb8, 15: 2})
	} else {
		ip = make([]byte, 20)
		ip[0], ip[1] = 0x45, o.tos
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
		binary.BigEndian.PutUint16(ip[4:], 0x1234)
		if o.frag {
			binary.BigEndian.PutUint16(ip[6:], 0x2000|0x10)
		} else {
			binary.BigEndian.PutUint16(ip[6:], 0x4000)
		}
		ip[8], ip[9] = 64, o.proto
		copy(ip[12:], []byte{198, 51, 100, 1, 198, 51, 100, 2})
		binary.BigEndian.PutUint16(ip[10:], ipv4Checksum(ip))
	}
	return append(append(eth, ip...), l4...)
}

// ipv4Checksum returns the header checksum of h (with its checksum field
// counted as is; a valid header sums to 0).
func ipv4Checksum(h []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(h); i += 2 {
		s += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// run runs hook h's program once on data and returns the verdict (as
// int32) and the output frame.
func run(t testing.TB, inj *Injector, h Hook, data []byte, ctx *skbCtx) (int32, []byte) {
	t.Helper()
	out := make([]byte, len(data)+holdMax+256)
	opts := ebpfRun(data, out, ctx)
	ret, err := inj.Program(h).Run(opts)
	if err != nil {
		t.Fatalf("prog.Run: %v", err)
	}
	if h == Egress && ret == actRedirect {
		// An egress drop is a redirect to its second pass (shot); a
		// test run does not redirect, so it is the drop's verdict.
		ret = actShot
	}
	return int32(ret), opts.DataOut
}

// actRedirect is TC_ACT_REDIRECT / TCX_REDIRECT.
const actRedirect = 7

// TestEgressDropSilent: an egress drop redirects the packet (the sender's
// send succeeds) marked for the second pass, which drops it without
// counting it again; an ingress drop is TC_ACT_SHOT.
func TestEgressDropSilent(t *testing.T) {
	inj := load(t, Config{DropRate: 1})
	f := frame(frameOpts{})
	opts := ebpfRun(f, nil, nil)
	ret, err := inj.Program(Egress).Run(opts)
	if err != nil || ret != actRedirect {
		t.Fatalf("egress drop: verdict %d %v, want the redirect %d", ret, err, actRedirect)
	}
	var ctx skbCtx
	ctx.setMark(dropMark)
	opts = ebpfRun(f, nil, &ctx)
	if ret, err := inj.Program(Egress).Run(opts); err != nil || ret != actShot {
		t.Fatalf("second pass: verdict %d %v, want %d", ret, err, actShot)
	}
	if ret, err := inj.Program(Ingress).Run(ebpfRun(f, nil, nil)); err != nil || ret != actShot {
		t.Fatalf("ingress drop: verdict %d %v, want %d", ret, err, actShot)
	}
	if c := counters(t, inj, Egress); c.Seen != 1 || c.DropRandom != 1 {
		t.Errorf("egress counters %+v: the second pass must not count", c)
	}
}

func counters(t testing.TB, inj *Injector, h Hook) Counters {
	t.Helper()
	c, err := inj.HookCounters(h)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNonRoCEPassesUntouched(t *testing.T) {
	inj := load(t, Config{DropRate: 1, DupRate: 1, ReorderRate: 1, CERate: 1, CEAll: true, DropEveryN: 1})
	arp := append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 0, 1, 0x08, 0x06}, make([]byte, 28)...)
	cases := []struct {
		name string
		f    []byte
	}{
		{"ipv4-udp53", frame(frameOpts{dport: 53})},
		{"ipv6-udp4792", frame(frameOpts{v6: true, dport: 4792})},
		{"ipv4-tcp4791", frame(frameOpts{proto: 6})},
		{"ipv6-tcp4791", frame(frameOpts{v6: true, proto: 6})},
		{"ipv4-fragment", frame(frameOpts{frag: true})},
		{"arp", arp},
		{"short-ipv4", frame(frameOpts{})[:14+20+4]},
	}
	for _, h := range []Hook{Egress, Ingress} {
		for i, c := range cases {
			t.Run(h.String()+"/"+c.name, func(t *testing.T) {
				ret, out := run(t, inj, h, c.f, nil)
				if ret != actUnspec {
					t.Errorf("verdict %d, want %d (pass)", ret, actUnspec)
				}
				if !bytes.Equal(out, c.f) {
					t.Errorf("frame changed:\n got %x\nwant %x", out, c.f)
				}
				if got := counters(t, inj, h); got.Other != uint64(i+1) || got.Seen != 0 || got.Dropped() != 0 {
					t.Errorf("counters %+v, want other=%d and nothing else", got, i+1)
				}
			})
		}
	}
}

func TestRandomDrop(t *testing.T) {
	const n = 20000
	for _, v6 := range []bool{false, true} {
		for _, rate := range []float64{0, 0.01, 0.05, 0.25, 1} {
			inj := load(t, Config{DropRate: rate})
			f := frame(frameOpts{v6: v6, opcode: 0x0a, payload: 64})
			opts := ebpfRun(f, nil, nil)
			opts.Repeat = n
			// A signal (the Go runtime's preemption, SIGURG) can end a
			// repeated run early with EINTR after some repetitions have
			// counted; cilium/ebpf then runs all n again. Start the
			// counters afresh for that run (CI: "seen 20002, want 20000").
			opts.Reset = func() {
				if err := inj.ResetCounters(); err != nil {
					t.Error(err)
				}
			}
			// The ingress hook: a repeated test run keeps its skb, and an
			// egress drop marks it for its second pass (shot).
			if _, err := inj.Program(Ingress).Run(opts); err != nil {
				t.Fatal(err)
			}
			c := counters(t, inj, Ingress)
			if c.Seen != n {
				t.Fatalf("v6=%v rate %v: seen %d, want %d", v6, rate, c.Seen, n)
			}
			want := rate * n
			sigma := math.Sqrt(n * rate * (1 - rate))
			if d := math.Abs(float64(c.DropRandom) - want); d > 5*sigma+0.5 {
				t.Errorf("v6=%v rate %v: dropped %d of %d, want %.0f ± %.0f", v6, rate, c.DropRandom, n, want, 5*sigma)
			}
			if c.DropRequests != c.DropRandom {
				t.Errorf("WRITE_ONLY drops: requests %d, want %d", c.DropRequests, c.DropRandom)
			}
			t.Logf("v6=%v rate %v: dropped %d of %d", v6, rate, c.DropRandom, n)
		}
	}
}

func TestDropEveryNth(t *testing.T) {
	inj := load(t, Config{DropEveryN: 7})
	for i := 1; i <= 100; i++ {
		ret, _ := run(t, inj, Egress, frame(frameOpts{v6: i%2 == 0, psn: uint32(i)}), nil)
		if dropped := ret == actShot; dropped != (i%7 == 0) {
			t.Fatalf("packet %d: verdict %d", i, ret)
		}
	}
	if c := counters(t, inj, Egress); c.DropNth != 14 || c.Seen != 100 {
		t.Fatalf("counters %+v, want 14 nth drops of 100", c)
	}
	// The other hook counts separately.
	if c := counters(t, inj, Ingress); c.Seen != 0 {
		t.Fatalf("ingress counters %+v", c)
	}
}

func TestDropPSNRange(t *testing.T) {
	inj := load(t, Config{DropPSN: &PSNRange{First: 0xfffffe, Last: 0x000001}})
	psns := []uint32{0xfffffd, 0xfffffe, 0xffffff, 0, 1, 2, 0x800000, 0xfffffe}
	want := []bool{false, true, true, true, true, false, false, true}
	for i, psn := range psns {
		ret, _ := run(t, inj, Ingress, frame(frameOpts{v6: i%2 == 1, psn: psn, opcode: 0x11}), nil)
		if (ret == actShot) != want[i] {
			t.Errorf("PSN %#x: verdict %d, want drop=%v", psn, ret, want[i])
		}
	}
	c := counters(t, inj, Ingress)
	if c.DropPSN != 5 || c.DropRequests != 0 {
		t.Errorf("counters %+v, want 5 PSN drops, 0 requests (ACKs)", c)
	}

	// With a limit, only the first matches are dropped.
	inj = load(t, Config{DropPSN: &PSNRange{First: 100, Last: 100, Limit: 2}})
	for i, want := range []bool{true, true, false, false} {
		ret, _ := run(t, inj, Egress, frame(frameOpts{psn: 100}), nil)
		if (ret == actShot) != want {
			t.Errorf("try %d: verdict %d, want drop=%v", i, ret, want)
		}
	}
	if c := counters(t, inj, Egress); c.DropPSN != 2 || c.DropRequests != 2 {
		t.Errorf("counters %+v, want 2 PSN drops of requests", c)
	}
}

func TestDestQPFilter(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(family(v6), func(t *testing.T) {
			inj := load(t, Config{DropRate: 1, FilterDestQP: true, DestQP: 0x11})
			if ret, _ := run(t, inj, Egress, frame(frameOpts{v6: v6, destQP: 0x12}), nil); ret != actUnspec {
				t.Errorf("other QP: verdict %d", ret)
			}
			if ret, _ := run(t, inj, Egress, frame(frameOpts{v6: v6, destQP: 0x11}), nil); ret != actShot {
				t.Errorf("filtered QP: verdict %d", ret)
			}
			if c := counters(t, inj, Egress); c.Filtered != 1 || c.DropRandom != 1 {
				t.Errorf("counters %+v", c)
			}
		})
	}
}

func TestCEMarkIPv4(t *testing.T) {
	inj := load(t, Config{CERate: 1})
	for _, tos := range []uint8{0x02, 0x01, 0xb8 | 0x02} {
		in := frame(frameOpts{tos: tos, payload: 100})
		ret, out := run(t, inj, Egress, in, nil)
		if ret != actUnspec {
			t.Fatalf("verdict %d", ret)
		}
		if out[15] != tos|3 {
			t.Errorf("TOS %#x -> %#x, want %#x", tos, out[15], tos|3)
		}
		if s := ipv4Checksum(out[14:34]); s != 0 {
			t.Errorf("TOS %#x: IPv4 header checksum invalid after marking (sum %#x)", tos, s)
		}
		want := append([]byte(nil), in...)
		want[15] = tos | 3
		binary.BigEndian.PutUint16(want[24:], 0)
		binary.BigEndian.PutUint16(want[24:], ipv4Checksum(want[14:34]))
		if !bytes.Equal(out, want) {
			t.Errorf("TOS %#x: frame differs beyond TOS and checksum", tos)
		}
	}
	// Not ECN-capable: left alone unless CEAll.
	in := frame(frameOpts{tos: 0x00})
	if _, out := run(t, inj, Egress, in, nil); !bytes.Equal(out, in) {
		t.Errorf("not-ECT packet changed")
	}
	// Already CE: unchanged, not counted.
	in = frame(frameOpts{tos: 0x03})
	if _, out := run(t, inj, Egress, in, nil); !bytes.Equal(out, in) {
		t.Errorf("CE packet changed")
	}
	if c := counters(t, inj, Egress); c.CEMarked != 3 || c.CENotECT != 1 || c.Errors != 0 {
		t.Errorf("counters %+v", c)
	}
	if err := inj.Set(Config{CERate: 1, CEAll: true}); err != nil {
		t.Fatal(err)
	}
	_, out := run(t, inj, Egress, frame(frameOpts{tos: 0x00}), nil)
	if out[15] != 3 || ipv4Checksum(out[14:34]) != 0 {
		t.Errorf("CEAll: TOS %#x checksum sum %#x", out[15], ipv4Checksum(out[14:34]))
	}
}

func TestCEMarkIPv6(t *testing.T) {
	inj := load(t, Config{CERate: 1})
	in := frame(frameOpts{v6: true, tos: 0xb8 | 0x02, payload: 33})
	ret, out := run(t, inj, Ingress, in, nil)
	if ret != actUnspec {
		t.Fatalf("verdict %d", ret)
	}
	vtf := binary.BigEndian.Uint32(out[14:])
	if tc := uint8(vtf >> 20); tc != 0xbb {
		t.Errorf("traffic class %#x, want 0xbb", tc)
	}
	if vtf>>28 != 6 || vtf&0xfffff != 0xabcde {
		t.Errorf("version/flow label changed: %#08x", vtf)
	}
	if !bytes.Equal(out[18:], in[18:]) {
		t.Errorf("frame changed beyond the traffic class")
	}
	if c := counters(t, inj, Ingress); c.CEMarked != 1 {
		t.Errorf("counters %+v", c)
	}
}

func TestDuplicate(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		for _, h := range []Hook{Egress, Ingress} {
			t.Run(family(v6)+"/"+h.String(), func(t *testing.T) {
				inj := load(t, Config{DupRate: 1})
				in := frame(frameOpts{v6: v6, payload: 40, opcode: 0x04})
				ret, out := run(t, inj, h, in, nil)
				if ret != actUnspec || !bytes.Equal(out, in) {
					t.Errorf("verdict %d, frame changed %v", ret, !bytes.Equal(out, in))
				}
				c := counters(t, inj, h)
				if c.Duplicated != 1 || c.Errors != 0 || c.Seen != 1 || c.Other != 0 {
					t.Errorf("counters %+v, want 1 duplicate of 1 RoCE packet", c)
				}
				// Our clone passing the hook again is not touched.
				var ctx skbCtx
				ctx.setMark(cloneMark)
				ret, out = run(t, inj, h, in, &ctx)
				if ret != actUnspec || !bytes.Equal(out, in) {
					t.Errorf("own clone: verdict %d, frame changed %v", ret, !bytes.Equal(out, in))
				}
				if c := counters(t, inj, h); c.OwnClones != 1 || c.Duplicated != 1 || c.Seen != 1 {
					t.Errorf("counters %+v after own clone", c)
				}
			})
		}
	}
}

// family names the IP version of a crafted frame in subtest names.
func family(v6 bool) string {
	if v6 {
		return "ipv6"
	}
	return "ipv4"
}

func TestReorderHoldAndRelease(t *testing.T) {
	// Every pairing of the held frame's and the releasing frame's family:
	// the slot holds whole frames, so a frame is released byte for byte
	// behind a packet of either family (its skb is rewritten to it).
	for _, heldV6 := range []bool{false, true} {
		for _, relV6 := range []bool{false, true} {
			for _, h := range []Hook{Egress, Ingress} {
				t.Run(family(heldV6)+"-behind-"+family(relV6)+"/"+h.String(), func(t *testing.T) {
					inj := load(t, Config{ReorderRate: 1})
					p := frame(frameOpts{v6: heldV6, psn: 10, payload: 1024, opcode: 0x07})
					q := frame(frameOpts{v6: relV6, psn: 11, payload: 8, opcode: 0x08})
					if ret, _ := run(t, inj, h, p, nil); ret != actShot {
						t.Fatalf("held packet: verdict %d, want shot", ret)
					}
					if err := inj.Set(Config{}); err != nil {
						t.Fatal(err)
					}
					ret, out := run(t, inj, h, q, nil)
					if ret != actUnspec {
						t.Fatalf("releasing packet: verdict %d", ret)
					}
					if !bytes.Equal(out, p) {
						t.Fatalf("released frame is not the held one (len %d, want %d)", len(out), len(p))
					}
					// Nothing held now: the next packet passes as itself.
					if _, out := run(t, inj, h, q, nil); !bytes.Equal(out, q) {
						t.Fatalf("slot not emptied")
					}
					c := counters(t, inj, h)
					if c.Held != 1 || c.Released != 1 || c.Errors != 0 || c.Dropped() != 0 || c.Seen != 3 {
						t.Errorf("counters %+v, want 3 seen, 1 held, 1 released", c)
					}
				})
			}
		}
	}
}

func TestResetCounters(t *testing.T) {
	inj := load(t, Config{DropEveryN: 2})
	for range 3 {
		run(t, inj, Egress, frame(frameOpts{}), nil)
	}
	if err := inj.ResetCounters(); err != nil {
		t.Fatal(err)
	}
	if c, err := inj.Counters(); err != nil || c != (Counters{}) {
		t.Fatalf("after reset: %+v %v", c, err)
	}
	// The sequence restarts too: the 2nd packet is dropped.
	r1, _ := run(t, inj, Egress, frame(frameOpts{}), nil)
	r2, _ := run(t, inj, Egress, frame(frameOpts{}), nil)
	if r1 != actUnspec || r2 != actShot {
		t.Fatalf("verdicts %d %d", r1, r2)
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []Config{
		{DropRate: -0.1}, {DupRate: 1.5}, {ReorderRate: math.NaN()}, {CERate: 2},
		{DropPSN: &PSNRange{First: 1 << 24}}, {FilterDestQP: true, DestQP: 1 << 24},
	}
	for _, c := range bad {
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v, want ErrConfig", c, err)
		}
	}
	if err := (&Config{DropRate: 1, DupRate: 0.5}).Validate(); err != nil {
		t.Error(err)
	}
	if threshold(1) != math.MaxUint32 || threshold(0) != 0 || threshold(0.5) != 1<<31 {
		t.Error("threshold")
	}
}

func TestInstructionsMarshal(t *testing.T) {
	// The fetch bit of the atomics must survive marshalling (cilium/ebpf
	// v0.22.0 can drop it unless ins.Constant is set: see fetchAdd).
	for _, h := range []Hook{Egress, Ingress} {
		var buf bytes.Buffer
		if err := Instructions(h).Marshal(&buf, binary.LittleEndian); err != nil {
			t.Fatal(err)
		}
		raw := buf.Bytes()
		fetches := 0
		for i := 0; i+8 <= len(raw); i += 8 {
			if raw[i] == 0xdb { // BPF_STX | BPF_ATOMIC | BPF_DW
				imm := binary.NativeEndian.Uint32(raw[i+4:])
				if imm&1 != 0 {
					fetches++
				}
			}
		}
		// Packet path: 2 fetch-adds + 3 cmpxchgs; GSO path: 2 + 2.
		if fetches != 9 {
			t.Errorf("%s: %d atomics with the fetch bit, want 9", h, fetches)
		}
	}
}

// FuzzProgram runs the injector (every action on) on arbitrary frames: the
// program never fails to run, its verdict is pass or drop, and a frame
// that is not RoCEv2 by the program's own rules is never changed.
func FuzzProgram(f *testing.F) {
	for _, o := range []frameOpts{{}, {v6: true}, {dport: 53}, {proto: 6}, {frag: true}, {tos: 2, payload: 9}, {v6: true, tos: 1}} {
		f.Add(frame(o), uint8(0))
	}
	f.Add([]byte{0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x06}, uint8(1))
	needRoot(f)
	inj, err := Load(Config{DropRate: 0.2, DropEveryN: 5, DropPSN: &PSNRange{First: 0, Last: 0xff}, DupRate: 0.2, ReorderRate: 0.2, CERate: 0.5,
		Congestion: &Congestion{Rate: 1e6, Limit: 1 << 16, Kmin: 1000, Kmax: 30000, Pmax: 0.5}})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { inj.Close() })
	f.Fuzz(func(t *testing.T, data []byte, hook uint8) {
		if len(data) <= 14 || len(data) > 3000 { // test runs take more than an Ethernet header, less than a page
			return
		}
		h := Hook(hook & 1)
		// BPF_PROG_TEST_RUN itself refuses an IPv4/IPv6 ethertype without
		// a whole IP header.
		if et := binary.BigEndian.Uint16(data[12:]); (et == 0x0800 && len(data) < 34) || (et == 0x86dd && len(data) < 54) {
			return
		}
		before, _ := inj.HookCounters(h)
		ret, out := run(t, inj, h, data, nil)
		if ret != actUnspec && ret != actShot {
			t.Fatalf("verdict %d", ret)
		}
		after, _ := inj.HookCounters(h)
		if after.Other > before.Other && (ret != actUnspec || !bytes.Equal(out, data)) {
			t.Fatalf("non-RoCE frame: verdict %d, changed %v", ret, !bytes.Equal(out, data))
		}
		if after.Errors != before.Errors {
			t.Fatalf("helper error on %x", data)
		}
	})
}
