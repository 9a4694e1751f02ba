package pcapcmd

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/google/gopacket/pcapgo"
	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/rocelayer"
)

func init() {
	commands.Register("pcap", "check RoCEv2 captures (layout and ICRC); write a sample capture", pcapUsage, runPcap)
}

const pcapUsage = `usage:
  rocev2d pcap check [-q] FILE...
  rocev2d pcap write-sample FILE

check decodes every RoCEv2 packet (UDP destination port 4791) in the pcap (also
the "modified" format, magic 0xa1b2cd34) or pcapng files (also gzip-compressed,
as tshark reads them; link types Ethernet, Linux SLL and SLL2, raw IP, IPv4,
IPv6, BSD loopback; IPv4 and IPv6), validates its layout against the opcode
table, verifies its ICRC and prints one line per packet and a total per file
and overall. Other frames are counted and skipped; RoCE v1 frames (EtherType
0x8915) are counted apart, not checked. Wireshark shows the ICRC but never checks it; this does.
VLAN tags (also QinQ 0x9100/0x9200) and tunnels (GRE, ERSPAN I-III, IP-in-IP,
VXLAN, Geneve) are looked through: the innermost RoCEv2 packet is checked
against its own IP header and shown with its addresses; an encapsulation not
decoded is named and counted apart. IPv4 and IPv6 fragments are reassembled
(at most 256 datagrams, 4 MiB). A RoCEv2 packet with a wrong IPv4 header checksum is
bad (receivers drop it); a zero one is a note (offloaded at the capture
point?). A frame that is not RoCEv2 never fails the check: a bad IP header on
one is named and counted.
A capture taken before segmentation (tcpdump on lo, a veth, or -i any, of a
sender using UDP GSO, as rocev2d does by default there) holds GSO datagrams of
several packets: each is split as the kernel segments it (one size, IPv4 IDs
numbered upward) and its packets are checked as #FRAME.K. Link types are
read from the file itself (LINUX_SLL2, 276, is what tcpdump -i any writes);
in pcapng, each frame's from its own interface, in every section.
A frame cut by the capture's snap length (tcpdump -s, rocev2d --snaplen) is
reported as truncated: the headers the capture kept are decoded and shown,
its ICRC cannot be checked, and it is counted apart, neither ok nor bad.
  -q  print only bad packets and the totals (before or after the files;
      -- ends the options)
A FILE of - is the standard input (tcpdump -w - | rocev2d pcap check -).
Exit status: 0 if every whole RoCEv2 packet is well-formed with a valid ICRC
and a sound IP header, 1 if any is not (they are listed at the end), 2 if a
file cannot be read, or ends inside a record, or has a corrupt one (the frames
before it are checked and counted). Truncated RoCEv2 packets (unless the BTH
the capture kept has a bad version or opcode), those in IP fragments not
reassembled and those after IPv6 extension headers are counted apart and do
not fail the check.

write-sample writes an Ethernet/IPv4 pcap with one packet of every RC, UC and
UD opcode and a CNP, each with a correct ICRC (the tshark test reads it), but
IBTA 1.5's RC FLUSH and ATOMIC_WRITE, which check decodes but tshark 4.0 does
not.
`

func runPcap(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, pcapUsage)
		return cli.ExitUsage
	}
	switch args[0] {
	case "check":
		return pcapCheck(ctx, args[1:], stdout, stderr)
	case "write-sample":
		return pcapWriteSample(args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "rocev2d pcap: unknown subcommand %q\n", args[0])
	fmt.Fprint(stderr, pcapUsage)
	return cli.ExitUsage
}

// pcapStats counts one file's frames.
type pcapStats struct {
	frames, roce, ok, bad, skipped int
	// badIPOther counts the frames that are not RoCEv2 and whose IP
	// header does not decode or has a wrong (or zero) IPv4 checksum.
	badIPOther int
	// fragments counts the IP fragments held for reassembly (the
	// frame completing a datagram counts as what it holds).
	fragments int
	// unsupported counts the frames in an encapsulation check does not
	// decode.
	unsupported int
	// notChecked counts the RoCEv2 packets whose ICRC cannot be checked
	// (in IPv6 fragments or after IPv6 extension headers, in IPv4
	// fragments not reassembled): in roce, neither ok nor bad.
	notChecked int
	// gso counts the UDP GSO datagrams split into their segments (each
	// segment counts in roce, ok or bad).
	gso int
	// truncated counts the RoCEv2 frames cut by the capture's snap
	// length (in roce, but neither ok nor bad: their ICRC is not checked).
	truncated int
	// undecoded counts the frames on pcapng interfaces of a link type
	// check does not decode.
	undecoded int
	// rocev1 counts the RoCE v1 frames (EtherType 0x8915, not RoCEv2:
	// neither checked nor in skipped).
	rocev1 int
}

// add adds o's counts to s.
func (s *pcapStats) add(o pcapStats) {
	s.frames += o.frames
	s.roce += o.roce
	s.ok += o.ok
	s.bad += o.bad
	s.skipped += o.skipped
	s.badIPOther += o.badIPOther
	s.fragments += o.fragments
	s.unsupported += o.unsupported
	s.notChecked += o.notChecked
	s.gso += o.gso
	s.truncated += o.truncated
	s.undecoded += o.undecoded
	s.rocev1 += o.rocev1
}

// notes returns what a file's or the total's line adds to the counts.
func (s *pcapStats) notes() string {
	return truncatedNote(s.truncated) + countNote(s.notChecked, "RoCEv2 not checked (in IP fragments or after IPv6 extension headers)") +
		gsoNote(s.gso) + countNote(s.badIPOther, "other frames with a bad IP header") +
		countNote(s.fragments, "IP fragments held for reassembly") +
		countNote(s.unsupported, "in an encapsulation not supported") + undecodedNote(s.undecoded) +
		countNote(s.rocev1, "RoCE v1 frames (EtherType 0x8915, not checked)")
}

// badPacket names a bad RoCEv2 packet.
type badPacket struct {
	file   string
	frame  int
	reason string
}

// parseInterspersed parses fs's flags wherever they stand among the
// operands (Go's flag package stops at the first operand: "check F -q" opened
// "-q" as a file) and returns the operands; after "--" everything is one.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var ops []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(ops, rest...), nil
		}
		if len(rest) == 0 {
			break
		}
		ops = append(ops, rest[0])
		args = rest[1:]
	}
	return ops, nil
}

func pcapCheck(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("rocev2d pcap check", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	quiet := fs.Bool("q", false, "print only bad packets and the totals")
	names, err := parseInterspersed(fs, args)
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d pcap check: %v\n%s", err, pcapUsage)
		return cli.ExitUsage
	}
	if len(names) == 0 {
		fmt.Fprintln(stderr, "rocev2d pcap check: no files given")
		fmt.Fprint(stderr, pcapUsage)
		return cli.ExitUsage
	}
	out := bufio.NewWriter(stdout)
	defer out.Flush()
	var total pcapStats
	var bad []badPacket
	files, unreadable, damaged := 0, 0, 0
	for _, name := range names {
		st, b, opened, err := checkFile(ctx, name, out, *quiet)
		total.add(st)
		bad = append(bad, b...)
		if opened {
			files++
			fmt.Fprintf(out, "%s: %d frames, %d RoCEv2 (ICRC ok %d, bad %d), %d other frames skipped%s\n",
				name, st.frames, st.roce, st.ok, st.bad, st.skipped, st.notes())
		}
		if err != nil {
			out.Flush()
			fmt.Fprintf(stderr, "rocev2d pcap check: %s: %v\n", name, err)
			if opened {
				damaged++
			} else {
				unreadable++
			}
			if ctx.Err() != nil {
				break
			}
		}
	}
	fmt.Fprintf(out, "total: %d files, %d frames, %d RoCEv2 packets, %d ok, %d bad, %d other frames skipped%s",
		files, total.frames, total.roce, total.ok, total.bad, total.skipped, total.notes())
	if damaged > 0 {
		fmt.Fprintf(out, ", %d files cut short or corrupt (read up to the damage)", damaged)
	}
	if unreadable > 0 {
		fmt.Fprintf(out, ", %d files unreadable", unreadable)
	}
	fmt.Fprintln(out)
	if len(bad) > 0 {
		fmt.Fprintf(out, "FAIL: %d bad RoCEv2 packets:\n", len(bad))
		for _, b := range bad {
			fmt.Fprintf(out, "  %s #%d: %s\n", b.file, b.frame, b.reason)
		}
	}
	switch {
	case unreadable+damaged > 0:
		return cli.ExitUsage
	case len(bad) > 0:
		return cli.ExitFail
	}
	return cli.ExitOK
}

// stdin is what the file name "-" reads (as tshark -r - and tcpdump -r -).
var stdin io.Reader = os.Stdin

// fileCheck is the state of one file's check.
type fileCheck struct {
	name     string
	out      io.Writer
	quiet    bool
	st       pcapStats
	bad      []badPacket
	decoders map[uint32]gopacket.Decoder
	walk     walker
}

// checkFile checks one capture. opened says whether it was a capture
// file at all; the error is non-nil if the file cannot be read to its end
// (the stats then cover the frames read before the problem).
func checkFile(ctx context.Context, name string, out io.Writer, quiet bool) (st pcapStats, bad []badPacket, opened bool, err error) {
	var in io.Reader = stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return st, nil, false, err
		}
		defer f.Close()
		in = f
	}
	r, err := openCapture(bufio.NewReaderSize(in, 1<<16))
	if err != nil {
		return st, nil, false, err
	}
	c := &fileCheck{name: name, out: out, quiet: quiet, decoders: map[uint32]gopacket.Decoder{},
		walk: walker{frags: newReassembly()}}
	for num := 1; ; num++ {
		if err := ctx.Err(); err != nil {
			return c.st, c.bad, true, err
		}
		rec, err := r.next()
		switch {
		case errors.Is(err, io.EOF):
			c.finish()
			return c.st, c.bad, true, nil
		case errors.Is(err, io.ErrUnexpectedEOF):
			return c.st, c.bad, true, fmt.Errorf("frame %d: file ends inside a record: %w", num, io.ErrUnexpectedEOF)
		case err != nil:
			return c.st, c.bad, true, fmt.Errorf("frame %d: %w", num, err)
		}
		c.frame(num, rec)
	}
}

// decoder returns the decoder of a link type (nil if unsupported).
func (c *fileCheck) decoder(lt uint32) gopacket.Decoder {
	dec, ok := c.decoders[lt]
	if !ok {
		dec, _ = rocelayer.LinkDecoder(lt)
		c.decoders[lt] = dec
	}
	return dec
}

// fail records a bad frame.
func (c *fileCheck) fail(num int, reason string) {
	c.bad = append(c.bad, badPacket{c.name, num, reason})
}

// frame checks frame num.
func (c *fileCheck) frame(num int, rec record) {
	if rec.notPacket {
		return // numbered as Wireshark does, nothing to check
	}
	c.st.frames++
	if c.decoder(rec.linkType) == nil {
		// A pcapng interface of a link type check does not decode.
		c.st.undecoded++
		c.note(num, fmt.Sprintf("not decoded: unsupported link type %d", rec.linkType))
		return
	}
	et, pkt, ok := rocelayer.NetworkPacket(rec.linkType, rec.data)
	if !ok {
		c.st.skipped++
		return
	}
	f := c.walk.frame(num, len(rec.data) < rec.origLen, et, pkt)
	switch f.kind {
	case kindOther:
		c.st.skipped++
	case kindBadIPOther:
		// Not RoCEv2 (no UDP header to port 4791 where a sound header
		// or a 20-byte one would put it): named, never a failure (a
		// capture point that offloads checksums writes 0 or garbage).
		c.st.badIPOther++
		c.note(num, "other frame with a bad IP header: "+f.why)
	case kindFragment:
		c.st.fragments++
		if f.roceFrag {
			c.note(num, f.why+" fragment of a RoCEv2 packet: held for reassembly")
		}
	case kindRoCEv1:
		// RoCE v1 (IB GRH and BTH over Ethernet): not what check
		// verifies, but named rather than lost among other frames.
		c.st.rocev1++
		c.note(num, "RoCE v1 frame (EtherType 0x8915): not RoCEv2, not checked"+viaNote(f.via))
	case kindUnsupported:
		c.st.unsupported++
		c.note(num, "encapsulation not supported: "+f.why)
	case kindNotChecked:
		c.st.roce++
		c.st.notChecked++
		c.note(num, f.why+viaNote(f.via))
	case kindRoCEBadIP:
		c.st.roce++
		c.st.bad++
		c.fail(num, "malformed IP header: "+f.why)
		fmt.Fprintf(c.out, "%s #%d BAD: malformed IP header: %s%s\n", c.name, num, f.why, viaNote(f.via))
	case kindRoCE:
		c.roce(num, f, rec)
	}
}

// note prints a line about frame num unless -q.
func (c *fileCheck) note(num int, s string) {
	if !c.quiet {
		fmt.Fprintf(c.out, "%s #%d %s\n", c.name, num, s)
	}
}

// viaNote names the encapsulations a packet was found in.
func viaNote(via []string) string {
	if len(via) == 0 {
		return ""
	}
	return " (in " + strings.Join(via, ", ") + ")"
}

// roce checks the RoCEv2 packet f of frame num.
func (c *fileCheck) roce(num int, f found, rec record) {
	name, out, st := c.name, c.out, &c.st
	st.roce++
	dec := layers.LayerTypeIPv4
	if f.ip[0]>>4 == 6 {
		dec = layers.LayerTypeIPv6
	}
	gp := gopacket.NewPacket(f.ip, dec, gopacket.DecodeOptions{NoCopy: true})
	udp, _ := gp.Layer(layers.LayerTypeUDP).(*layers.UDP)
	if nl := gp.NetworkLayer(); (udp == nil || nl != nil && len(nl.LayerPayload()) < 8) && len(rec.data) < rec.origLen {
		// The capture cut the UDP header after its destination port.
		st.truncated++
		c.note(num, cutInUDP(gp, f.ip, len(rec.data), rec.origLen)+viaNote(f.via))
		return
	}
	if udp == nil {
		st.bad++
		why := "UDP header not decodable"
		c.fail(num, why)
		fmt.Fprintf(out, "%s #%d BAD: %s%s\n", name, num, why, viaNote(f.via))
		return
	}
	ci := gopacket.CaptureInfo{CaptureLength: len(rec.data), Length: rec.origLen}
	if !ipWhole(f.ip) && ci.CaptureLength < ci.Length {
		// Cut by the capture's snap length: the headers the
		// capture kept are decoded and shown, the ICRC cannot
		// be checked, and the frame is neither ok nor bad.
		line, reason := describeCut(gp, udp, ci)
		line += viaNote(f.via)
		if reason != "" {
			st.bad++
			c.fail(num, reason)
			fmt.Fprintf(out, "%s #%d %s BAD: %s\n", name, num, line, reason)
			return
		}
		st.truncated++
		c.note(num, line)
		return
	}
	line, reason := describe(gp, udp, ci)
	if segs := gsoSplit(gp, reason); segs != nil && f.csumBad == "" {
		// One GSO datagram seen before segmentation: check the
		// packets the kernel sends of it, each on its own line.
		st.gso++
		st.roce += len(segs) - 1
		c.checkSegments(num, segs, len(udp.LayerPayload()))
		return
	}
	line += ipNotes(f)
	if reason == "" && f.csumBad != "" {
		// Every receiver drops it before RoCE sees it.
		reason = f.csumBad
	}
	if reason == "" {
		st.ok++
		c.note(num, line+" ok")
		return
	}
	st.bad++
	c.fail(num, reason)
	fmt.Fprintf(out, "%s #%d %s BAD: %s\n", name, num, line, reason)
}

// cutInUDP is the line of a RoCEv2 frame the capture cut inside its UDP
// header (ip: from the IP header on): its addresses and ports, and how much
// the capture kept.
func cutInUDP(gp gopacket.Packet, ip []byte, kept, length int) string {
	var sb strings.Builder
	if nl := gp.NetworkLayer(); nl != nil {
		s, d := nl.NetworkFlow().Endpoints()
		sa, _ := netip.AddrFromSlice(s.Raw())
		da, _ := netip.AddrFromSlice(d.Raw())
		u := ip[len(ip)-len(nl.LayerPayload()):]
		fmt.Fprintf(&sb, "%v > %v ", netip.AddrPortFrom(sa, binary.BigEndian.Uint16(u)), netip.AddrPortFrom(da, rocelayer.Port))
	}
	return sb.String() + fmt.Sprintf("truncated by the capture (%d of %d bytes, inside the UDP header): ICRC not checked", kept, length)
}

// ipNotes are the remarks on a RoCEv2 packet's IP layers: the tunnels it
// was found in, its reassembly, a zero IPv4 checksum.
func ipNotes(f found) string {
	s := viaNote(f.via)
	if f.frag != "" {
		s += " (" + f.frag + ")"
	}
	if f.csumZero {
		s += " (IPv4 checksum 0: offloaded at the capture point?)"
	}
	return s
}

// ipWhole reports whether ip holds its whole IP packet (its total or
// payload length), whatever the capture cut after it (an FCS).
func ipWhole(ip []byte) bool {
	if len(ip) < 40 && ip[0]>>4 == 6 || len(ip) < 20 {
		return false
	}
	if ip[0]>>4 == 6 {
		return len(ip) >= 40+int(binary.BigEndian.Uint16(ip[4:]))
	}
	return len(ip) >= int(binary.BigEndian.Uint16(ip[2:]))
}

// finish reports the RoCEv2 packets left in IP fragments at the file's end.
func (c *fileCheck) finish() {
	for _, e := range c.walk.frags.finish() {
		c.st.roce++
		c.st.notChecked++
		num := e.frames[len(e.frames)-1]
		c.note(num, fmt.Sprintf("RoCEv2 packet in %s fragments (frames %s): not reassembled (%s), ICRC not checked", e.version(), frameList(e.frames), e.broken))
	}
}

// truncatedNote says how many RoCEv2 frames the capture cut short, if any.
func truncatedNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(", %d truncated by the capture (ICRC not checked)", n)
}

// countNote is ", N what", or "" for none.
func countNote(n int, what string) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(", %d %s", n, what)
}

// undecodedNote says how many frames were of an unsupported link type.
func undecodedNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(", %d on interfaces of an unsupported link type (not decoded)", n)
}

// gsoNote says how many frames were GSO datagrams, if any.
func gsoNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(", %d GSO datagrams split into their packets", n)
}

// gsoSplit returns the segments of a RoCEv2 frame that is a UDP GSO
// datagram captured before segmentation (a capture on lo or a veth of a
// sender using GSO), or nil. Such a frame is bad as one packet: its ICRC
// does not match (packets with payload: every segment's ICRC must then be
// valid, rocelayer.GSOSegments) or it has bytes after a packet that
// carries none (a batch of ACKs, READ requests or atomics, split at the
// first packet's length and each segment checked on its own,
// rocelayer.GSOHeaderOnlySegments).
func gsoSplit(gp gopacket.Packet, reason string) [][]byte {
	if reason == "" {
		return nil
	}
	ip, err := rocelayer.IPPacket(gp)
	if err != nil {
		return nil
	}
	if strings.HasPrefix(reason, "ICRC mismatch") {
		return rocelayer.GSOSegments(ip)
	}
	return rocelayer.GSOHeaderOnlySegments(ip)
}

// checkSegments checks the segments of the GSO datagram of frame num
// (pay: its UDP payload's length), each on its own line #num.K.
func (c *fileCheck) checkSegments(num int, segs [][]byte, pay int) {
	for k, seg := range segs {
		dec := layers.LayerTypeIPv4
		if seg[0]>>4 == 6 {
			dec = layers.LayerTypeIPv6
		}
		sp := gopacket.NewPacket(seg, dec, gopacket.DecodeOptions{NoCopy: true})
		tag := fmt.Sprintf("(GSO segment %d/%d of a %d-byte datagram)", k+1, len(segs), pay)
		su, _ := sp.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if su == nil {
			c.st.bad++
			c.fail(num, fmt.Sprintf("GSO segment %d/%d not decoded", k+1, len(segs)))
			fmt.Fprintf(c.out, "%s #%d.%d BAD: not decoded %s\n", c.name, num, k+1, tag)
			continue
		}
		sl, sr := describe(sp, su, gopacket.CaptureInfo{CaptureLength: len(seg), Length: len(seg)})
		if sr == "" {
			c.st.ok++
			if !c.quiet {
				fmt.Fprintf(c.out, "%s #%d.%d %s ok %s\n", c.name, num, k+1, sl, tag)
			}
			continue
		}
		c.st.bad++
		c.fail(num, fmt.Sprintf("GSO segment %d/%d: %s", k+1, len(segs), sr))
		fmt.Fprintf(c.out, "%s #%d.%d %s BAD: %s %s\n", c.name, num, k+1, sl, sr, tag)
	}
}

// writeAddrs appends the frame's source and destination address and port.
func writeAddrs(sb *strings.Builder, gp gopacket.Packet, udp *layers.UDP) {
	if nl := gp.NetworkLayer(); nl != nil {
		s, d := nl.NetworkFlow().Endpoints()
		sa, _ := netip.AddrFromSlice(s.Raw())
		da, _ := netip.AddrFromSlice(d.Raw())
		fmt.Fprintf(sb, "%v > %v", netip.AddrPortFrom(sa, uint16(udp.SrcPort)), netip.AddrPortFrom(da, uint16(udp.DstPort)))
	}
}

// writeBTH appends the BTH fields of b.
func writeBTH(sb *strings.Builder, b *bth.Fields) {
	fmt.Fprintf(sb, " %s qpn=0x%06x psn=%v", b.Opcode, b.DestQP, b.PSN)
	for _, fl := range []struct {
		on   bool
		name string
	}{{b.AckReq, "A"}, {b.SolicitedEvent, "SE"}, {b.MigReq, "M"}, {b.FECN, "FECN"}, {b.BECN, "BECN"}} {
		if fl.on {
			sb.WriteString(" " + fl.name)
		}
	}
	fmt.Fprintf(sb, " pkey=0x%04x", b.PKey)
}

// describe returns the summary of a whole RoCEv2 frame and, if it is bad,
// why.
func describe(gp gopacket.Packet, udp *layers.UDP, ci gopacket.CaptureInfo) (line, reason string) {
	var sb strings.Builder
	writeAddrs(&sb, gp, udp)
	if why := udpLengthProblem(gp, udp); why != "" {
		// The UDP header cuts the packet elsewhere than the IP header:
		// what is "payload" and "ICRC" depends on which is believed.
		return sb.String(), why
	}
	b, _ := gp.Layer(rocelayer.LayerTypeBTH).(*rocelayer.BTH)
	if b == nil {
		why := "not decoded"
		if el := gp.ErrorLayer(); el != nil {
			why = el.Error().Error()
		}
		return sb.String(), "malformed: " + why
	}
	pk := b.Packet()
	writeBTH(&sb, &b.Fields)
	writeExt(&sb, pk)
	fmt.Fprintf(&sb, " pay=%d icrc=0x%08x", len(pk.Payload), b.ICRC)
	if err := rocelayer.VerifyICRC(gp); err != nil {
		if errors.Is(err, icrc.ErrMismatch) {
			ip, _ := rocelayer.IPPacket(gp)
			want, _ := icrc.Compute(ip)
			return sb.String(), fmt.Sprintf("ICRC mismatch: stored 0x%08x, computed 0x%08x", b.ICRC, want)
		}
		return sb.String(), "ICRC not verifiable: " + err.Error()
	}
	return sb.String(), ""
}

// udpLengthProblem says how the UDP length disagrees with the IP
// header's payload length, or "".
func udpLengthProblem(gp gopacket.Packet, udp *layers.UDP) string {
	ipPay := -1
	switch ip := gp.NetworkLayer().(type) {
	case *layers.IPv4:
		ipPay = int(ip.Length) - int(ip.IHL)*4
	case *layers.IPv6:
		ipPay = int(ip.Length)
	}
	if ipPay < 0 || int(udp.Length) == ipPay {
		return ""
	}
	return fmt.Sprintf("malformed: UDP length %d disagrees with the IP payload length %d", udp.Length, ipPay)
}

// describeCut returns the summary of a RoCEv2 frame cut by the capture's
// snap length: the BTH and extension headers as far as the capture kept
// them, the payload length the UDP header gives, and how much the capture
// kept. Its ICRC cannot be checked; reason is non-empty only if the kept
// BTH is itself malformed (a transport header version other than 0 or an
// undefined opcode), which no snap length explains.
func describeCut(gp gopacket.Packet, udp *layers.UDP, ci gopacket.CaptureInfo) (line, reason string) {
	var sb strings.Builder
	writeAddrs(&sb, gp, udp)
	cut := fmt.Sprintf("truncated by the capture (%d of %d bytes", ci.CaptureLength, ci.Length)
	data := udp.LayerPayload() // what the capture kept of the UDP payload
	if len(data) < bth.Size {
		return sb.String() + " " + cut + ", inside the BTH): ICRC not checked", ""
	}
	h := bth.BTH(data[:bth.Size])
	op := h.Opcode()
	info := op.Info()
	if h.TVer() != 0 {
		return sb.String(), fmt.Sprintf("malformed: TVer %d in %v packet, want 0", h.TVer(), op)
	}
	if !info.Valid {
		return sb.String(), fmt.Sprintf("malformed: opcode 0x%02x", uint8(op))
	}
	f := h.Fields()
	writeBTH(&sb, &f)
	need := bth.Size + info.HeaderLen
	if len(data) < need {
		return sb.String() + " " + cut + fmt.Sprintf(", inside its %v): ICRC not checked", info.Headers), ""
	}
	// The headers are whole: parse them as a packet of their own (pad
	// count 0, no payload, a zero ICRC) to show them as a whole frame's.
	// An RC ACKNOWLEDGE's SACK block is kept if the capture holds all of it.
	wire := int(udp.Length) - 8 // the UDP payload's length on the wire (-8: unknown)
	keep := need
	if end := wire - packet.ICRCSize; op == bth.RCAck && end > need && end <= len(data) && aeth.IsSACK(data[need:end]) {
		keep = end
	}
	hdrs := make([]byte, keep+packet.ICRCSize)
	copy(hdrs, data[:keep])
	bth.BTH(hdrs[:bth.Size]).SetPadCount(0)
	var pk packet.Packet
	if err := pk.Parse(hdrs); err != nil { // cannot happen: opcode and lengths checked
		return sb.String(), "malformed: " + err.Error()
	}
	writeExt(&sb, &pk)
	if pay := wire - need - h.PadCount() - packet.ICRCSize; pay >= 0 {
		fmt.Fprintf(&sb, " pay=%d", pay)
	}
	return sb.String() + " " + cut + "): ICRC not checked", ""
}

// writeExt appends the extension header fields of pk.
func writeExt(sb *strings.Builder, pk *packet.Packet) {
	if pk.DETH != nil {
		fmt.Fprintf(sb, " DETH[qkey=0x%08x srcqp=0x%06x]", pk.DETH.QKey(), pk.DETH.SrcQP())
	}
	if pk.FETH != nil {
		w := binary.BigEndian.Uint32(pk.FETH)
		fmt.Fprintf(sb, " FETH[sel=%d plt=%d]", w>>4&3, w&0xf)
	}
	if pk.RETH != nil {
		fmt.Fprintf(sb, " RETH[va=0x%x rkey=0x%08x len=%d]", pk.RETH.VA(), pk.RETH.RKey(), pk.RETH.DMALength())
	}
	if pk.AtomicETH != nil {
		fmt.Fprintf(sb, " AtomicETH[va=0x%x rkey=0x%08x swap_add=0x%x compare=0x%x]",
			pk.AtomicETH.VA(), pk.AtomicETH.RKey(), pk.AtomicETH.SwapAdd(), pk.AtomicETH.Compare())
	}
	if pk.AETH != nil {
		fmt.Fprintf(sb, " AETH[%v msn=%d]", pk.AETH.Syndrome(), pk.AETH.MSN())
	}
	if pk.AtomicAck != nil {
		fmt.Fprintf(sb, " AtomicAckETH[orig=0x%x]", pk.AtomicAck.OrigData())
	}
	if pk.AETH != nil && len(pk.Payload) > 0 && aeth.IsSACK(pk.Payload) {
		writeSACK(sb, pk.BTH.PSN(), aeth.SACK(pk.Payload))
	}
	if pk.ImmDt != nil {
		fmt.Fprintf(sb, " ImmDt=0x%08x", pk.ImmDt.Imm())
	}
	if pk.IETH != nil {
		fmt.Fprintf(sb, " IETH[rkey=0x%08x]", pk.IETH.RKey())
	}
}

// sampleEpoch is the timestamp of the first sample frame (fixed, so the
// file is reproducible).
var sampleEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func pcapWriteSample(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintln(stderr, "usage: rocev2d pcap write-sample FILE")
		return cli.ExitUsage
	}
	if strings.HasPrefix(args[0], "-") {
		fmt.Fprintf(stderr, "rocev2d pcap write-sample: %q is not a file name (write-sample takes no options; ./%s names such a file)\n", args[0], args[0])
		return cli.ExitUsage
	}
	samples, err := rocelayer.SampleFrames()
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d pcap write-sample: %v\n", err)
		return cli.ExitFail
	}
	if err := writeSamples(args[0], samples); err != nil {
		fmt.Fprintf(stderr, "rocev2d pcap write-sample: %v\n", err)
		return cli.ExitUsage
	}
	fmt.Fprintf(stdout, "wrote %d frames (every RC but FLUSH and ATOMIC_WRITE, UC and UD opcode and a CNP) to %s\n", len(samples), args[0])
	return cli.ExitOK
}

func writeSamples(name string, samples []rocelayer.Sample) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	w := pcapgo.NewWriter(f)
	err = w.WriteFileHeader(65535, layers.LinkTypeEthernet)
	for i, s := range samples {
		if err != nil {
			break
		}
		ci := gopacket.CaptureInfo{Timestamp: sampleEpoch.Add(time.Duration(i) * time.Millisecond),
			CaptureLength: len(s.Frame), Length: len(s.Frame)}
		err = w.WritePacket(ci, s.Frame)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// writeSACK appends a selective repeat SACK block (aeth.SACK, after the
// AETH of a selective NAK): the PSNs the responder holds beyond base, as
// ranges (at most 8 shown).
func writeSACK(sb *strings.Builder, base bth.PSN, s aeth.SACK) {
	fmt.Fprintf(sb, " SACK[v%d bits=%d held=", aeth.SACKVersion, s.Bits())
	n := 0
	for j := 0; j < s.Bits(); j++ {
		if !s.Has(j) || (j > 0 && s.Has(j-1)) {
			continue
		}
		e := j
		for e+1 < s.Bits() && s.Has(e+1) {
			e++
		}
		if n == 8 {
			sb.WriteString(",...")
			break
		}
		if n > 0 {
			sb.WriteString(",")
		}
		if e == j {
			fmt.Fprintf(sb, "%v", base.Add(1+j))
		} else {
			fmt.Fprintf(sb, "%v-%v", base.Add(1+j), base.Add(1+e))
		}
		n++
	}
	if n == 0 {
		sb.WriteString("none")
	}
	sb.WriteString("]")
}
