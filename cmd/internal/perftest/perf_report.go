package perftest

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/oob"
)

// perfResult is the measurement of one size.
type perfResult struct {
	size      int
	iters     int
	tposted   []time.Time
	tcomplete []time.Time
	start     time.Time
	end       time.Time
	recvd     uint64
}

// perfLine is perftest's RESULT_LINE.
const perfLine = "---------------------------------------------------------------------------------------\n"

// perfTitle is the test's title line text.
func perfTitle(t oob.PerfTest, atomicType string) string {
	var op string
	switch t {
	case oob.WriteBW, oob.WriteLat:
		op = "RDMA_Write"
	case oob.ReadBW, oob.ReadLat:
		op = "RDMA_Read"
	case oob.SendBW, oob.SendLat:
		op = "Send"
	case oob.AtomicBW, oob.AtomicLat:
		op = "Atomic " + atomicType
	default:
		return t.String()
	}
	if t.IsBW() {
		return op + " BW Test"
	}
	return op + " Latency Test"
}

// cHex formats like C's "%#0*x": zero is printed without the 0x prefix.
func cHex(v uint64, width int) string {
	if v == 0 {
		return fmt.Sprintf("%0*x", width, 0)
	}
	return "0x" + fmt.Sprintf("%0*x", max(width-2, 0), v)
}

// printDest prints a perftest address line and its GID line.
func (s *perfSide) printDest(w io.Writer, side string, d oob.PerfDest) {
	writePerfDest(w, s.c.test, side, d)
}

// writePerfDest prints d as perftest's ctx_print_pingpong_data does for t.
func writePerfDest(w io.Writer, t oob.PerfTest, side string, d oob.PerfDest) {
	fmt.Fprintf(w, " %s address: LID %s QPN %s PSN %s", side, cHex(uint64(d.LID), 4), cHex(uint64(d.QPN), 6), cHex(uint64(d.PSN), 6))
	switch t {
	case oob.ReadBW, oob.ReadLat:
		fmt.Fprintf(w, " OUT %s", cHex(uint64(d.OutReads), 4))
		fallthrough
	case oob.WriteBW, oob.WriteLat:
		fmt.Fprintf(w, " RKey %s VAddr %s", cHex(uint64(d.RKey), 8), cHex(d.VAddr, 16))
	}
	fmt.Fprintln(w)
	parts := make([]string, 16)
	for i, b := range d.GID {
		parts[i] = fmt.Sprintf("%02d", b)
	}
	fmt.Fprintf(w, " GID: %s\n", strings.Join(parts, ":"))
}

// printHeader prints perftest's test description block.
func (s *perfSide) printHeader(w io.Writer) {
	c := s.c
	gid := c.gidIdx
	if gid < 0 {
		gid = 1
	}
	writePerfHeader(w, perfHeader{test: c.test, atomicType: c.atomicType, dev: c.dev, role: c.role(),
		txDepth: s.txDepth(), rxDepth: c.rxDepth, mtu: s.params.MTU.Bytes(), gidIdx: gid, outReads: int(s.local.OutReads),
		rdmaCM: c.rdmaCM, bidi: c.bidi, qps: len(s.qps), cqMod: c.cqMod, postList: c.postList, srq: c.useSRQ})
}

// perfHeader are the values of perftest's description block.
type perfHeader struct {
	test       oob.PerfTest
	atomicType string
	dev        string
	role       oob.Role
	txDepth    int
	rxDepth    int
	mtu        int
	gidIdx     int
	outReads   int
	rdmaCM     bool // -R
	bidi       bool // -b
	qps        int  // -q (0: 1)
	cqMod      int  // -Q, perftest's effective value (0: 1)
	postList   int  // -l (0: 1)
	srq        bool // --use-srq
}

// writePerfHeader prints the block in perftest 4.5's layout.
func writePerfHeader(w io.Writer, h perfHeader) {
	fmt.Fprint(w, perfLine)
	title := perfTitle(h.test, h.atomicType)
	if h.bidi {
		title = strings.Replace(title, " BW Test", " Bidirectional BW Test", 1)
	}
	if h.postList > 1 && h.test.IsBW() {
		title = strings.Replace(title, " BW Test", " Post List BW Test", 1)
	}
	fmt.Fprintf(w, "                    %s\n", title)
	dev := h.dev
	if dev == "" {
		dev = "rocev2"
	}
	fmt.Fprintf(w, " Dual-port       : OFF\t\tDevice         : %s\n", dev)
	fmt.Fprintf(w, " Number of qps   : %d\t\tTransport type : IB\n", max(h.qps, 1))
	fmt.Fprintf(w, " Connection type : RC\t\tUsing SRQ      : %s\n", map[bool]string{false: "OFF", true: "ON"}[h.srq])
	fmt.Fprintf(w, " PCIe relax order: OFF\n")
	fmt.Fprintf(w, " ibv_wr* API     : OFF\n")
	send := h.test == oob.SendBW || h.test == oob.SendLat
	if h.role == oob.Client || !h.test.IsBW() || h.bidi {
		fmt.Fprintf(w, " TX depth        : %d\n", h.txDepth)
	}
	if h.postList > 1 {
		fmt.Fprintf(w, " Post List       : %d\n", h.postList)
	}
	if (h.role == oob.Server || h.bidi) && send {
		fmt.Fprintf(w, " RX depth        : %d\n", h.rxDepth)
	}
	if h.test.IsBW() {
		fmt.Fprintf(w, " CQ Moderation   : %d\n", max(h.cqMod, 1))
	}
	fmt.Fprintf(w, " Mtu             : %d[B]\n", h.mtu)
	fmt.Fprintf(w, " Link type       : Ethernet\n")
	fmt.Fprintf(w, " GID index       : %d\n", h.gidIdx)
	reads := h.test == oob.ReadBW || h.test == oob.AtomicBW || h.test == oob.ReadLat || h.test == oob.AtomicLat
	if reads {
		fmt.Fprintf(w, " Outstand reads  : %d\n", h.outReads)
	} else {
		fmt.Fprintf(w, " Max inline data : 0[B]\n")
	}
	if !h.rdmaCM {
		fmt.Fprintf(w, " rdma_cm QPs\t : OFF\n")
		fmt.Fprintf(w, " Data ex. method : Ethernet\n")
		fmt.Fprint(w, perfLine)
		return
	}
	fmt.Fprintf(w, " rdma_cm QPs\t : ON\n")
	fmt.Fprintf(w, " Data ex. method : rdma_cm\n")
	if h.role == oob.Server {
		// perftest says so once the client is connected, as here.
		fmt.Fprint(w, perfLine)
		fmt.Fprintf(w, " Waiting for client rdma_cm QP to connect\n")
		fmt.Fprintf(w, " Please run the same command with the IB/RoCE interface IP\n")
	}
	fmt.Fprint(w, perfLine)
}

// bwReport computes perftest's bandwidth report: the average over the run
// (first post to last completion) and the peak, the best time per message
// (tcompleted[j]-tposted[i])/(j-i+1) over runs of consecutive messages (up to
// max(window, 1024) long, and the whole run).
// The bandwidth columns are in MiB/s (2^20 bytes per second, perftest's
// "MB/sec"), or with --report_gbits in Gb/s (10^9 bits per second): perftest's
// format_factor, 0x100000 or 125000000 bytes.
func bwReport(r perfResult, window int, gbits bool) oob.Report {
	rep := oob.Report{Size: uint64(r.size), Iters: uint64(r.iters)}
	dur := r.end.Sub(r.start)
	if len(r.tcomplete) > 0 && len(r.tposted) > 0 {
		dur = r.tcomplete[len(r.tcomplete)-1].Sub(r.tposted[0])
	}
	if dur <= 0 {
		dur = time.Nanosecond
	}
	usec := float64(dur.Nanoseconds()) / 1e3
	unit := float64(1 << 20)
	if gbits {
		unit = 125e6
	}
	rep.BWAvg = float64(r.size) * float64(r.iters) / (usec / 1e6) / unit
	rep.MsgRate = float64(r.iters) / usec
	if n := min(len(r.tposted), len(r.tcomplete)); n > 0 {
		// The whole run is one candidate, so the peak is never below the
		// average.
		best := float64(r.tcomplete[n-1].Sub(r.tposted[0]).Nanoseconds()) / float64(n)
		span := max(window, 1024)
		for i := 0; i < n; i++ {
			for j := i; j < n && j < i+span; j++ {
				d := float64(r.tcomplete[j].Sub(r.tposted[i]).Nanoseconds()) / float64(j-i+1)
				if d > 0 && d < best {
					best = d
				}
			}
		}
		if !math.IsInf(best, 1) {
			rep.BWPeak = float64(r.size) / (best / 1e9) / unit
		}
	}
	return rep
}

// printBWLine prints the send-bw server's own measurement.
func printBWLine(w io.Writer, r perfResult, c *perfConfig) {
	rep := bwReport(r, 1, c.gbits)
	rep.BWPeak = 0 // perftest's server reports no peak
	c.bwRow(w, rep)
}

// bwRow prints a bandwidth result: the row, or with --output its average
// bandwidth or message rate alone, as perftest's "%lf\n".
func (c *perfConfig) bwRow(w io.Writer, r oob.Report) {
	switch c.output {
	case "bandwidth":
		fmt.Fprintf(w, "%f\n", r.BWAvg)
	case "message_rate":
		fmt.Fprintf(w, "%f\n", r.MsgRate)
	default:
		writeBWLine(w, r)
	}
}

// bwColumns is the bandwidth tests' column header, perftest's RESULT_FMT
// (RESULT_FMT_G with --report_gbits).
func bwColumns(gbits bool) string {
	unit := "MB"
	if gbits {
		unit = "Gb"
	}
	return " #bytes     #iterations    BW peak[" + unit + "/sec]    BW average[" + unit + "/sec]   MsgRate[Mpps]"
}

// writeBWLine prints a bandwidth result line (perftest's REPORT_FMT).
func writeBWLine(w io.Writer, r oob.Report) {
	fmt.Fprintf(w, " %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f\n", r.Size, r.Iters, r.BWPeak, r.BWAvg, r.MsgRate)
}

// printLat prints perftest's latency line from the post timestamps: the
// intervals between consecutive posts divided by rtt (2 for ping-pong
// tests), sorted, the two largest dropped (LAT_MEASURE_TAIL), then min, max,
// median, average, standard deviation and the 99% / 99.9% percentiles.
//
// With unsorted (-U) it first prints every latency in the order measured,
// with histogram (-H) the sorted ones without the tail, each as perftest's
// "N, %g" lines under "#, usec"; then the column header again, as perftest.
//
// With --output=latency (output) it prints the average alone, as
// perftest's "%lf\n", and no header or dashed line.
func printLat(w io.Writer, size, iters int, ts []time.Time, rtt float64, unsorted, histogram bool, output string) {
	var d []float64
	for i := 1; i < len(ts) && i <= iters; i++ {
		d = append(d, float64(ts[i].Sub(ts[i-1]).Nanoseconds())/1e3/rtt)
	}
	if unsorted {
		writeLatList(w, d)
	}
	if histogram {
		writeLatList(w, latSorted(d))
	}
	if output != "" {
		fmt.Fprintf(w, "%f\n", latAverage(latSorted(d)))
		return
	}
	if unsorted || histogram {
		fmt.Fprint(w, perfLine)
		fmt.Fprintln(w, latColumns)
	}
	writeLatLine(w, size, iters, d)
	fmt.Fprint(w, perfLine)
}

// latAverage is the mean of the reported latencies d.
func latAverage(d []float64) float64 {
	if len(d) == 0 {
		return 0
	}
	var sum float64
	for _, v := range d {
		sum += v
	}
	return sum / float64(len(d))
}

// latColumns is the latency tests' column header (perftest's
// RESULT_FMT_LAT).
const latColumns = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "

// writeLatList prints latencies (µs) as perftest's -U and -H do: "#, usec",
// then "N, value" with C's %g.
func writeLatList(w io.Writer, d []float64) {
	fmt.Fprintln(w, "#, usec")
	for i, v := range d {
		fmt.Fprintf(w, "%d, %s\n", i+1, cG(v))
	}
}

// cG formats v as C's "%g": 6 significant digits, no trailing zeros.
func cG(v float64) string { return fmt.Sprintf("%.6g", v) }

// latSorted returns the latencies sorted, without the two largest
// (LAT_MEASURE_TAIL), as perftest reports them.
func latSorted(d []float64) []float64 {
	d = slices.Clone(d)
	slices.Sort(d)
	if len(d) > 4 {
		d = d[:len(d)-2] // LAT_MEASURE_TAIL
	}
	return d
}

// writeLatLine prints the latency row for the per-iteration latencies d
// (µs), which it sorts.
func writeLatLine(w io.Writer, size, iters int, d []float64) {
	d = latSorted(d)
	if len(d) == 0 {
		d = []float64{0}
	}
	n := len(d)
	var sum float64
	for _, v := range d {
		sum += v
	}
	avg := sum / float64(n)
	var vs float64
	for _, v := range d {
		vs += (v - avg) * (v - avg)
	}
	med := d[n/2]
	if n%2 == 0 {
		med = (d[n/2-1] + d[n/2]) / 2
	}
	pct := func(p float64) float64 { return d[min(int(math.Ceil(float64(n)*p)), n-1)] }
	fmt.Fprintf(w, " %-7d %d          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f\n",
		size, iters, d[0], d[n-1], med, avg, math.Sqrt(vs/float64(n)), pct(0.99), pct(0.999))
}
