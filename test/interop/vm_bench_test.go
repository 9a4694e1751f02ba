//go:build linux

package interop

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/test/interop/agentproto"
)

// BenchmarkVM boots two 1-vCPU VMs of the lab (vm0, vm1; VMPair) once and,
// between them, measures rxe ↔ rxe (ib_write_bw 64 KiB, ibv_rc_pingpong 8 B)
// against rocev2d ↔ rocev2d (rocev2d write-bw, rocev2d pingpong) with the
// same parameters, in its default mode and with --gso, GOMAXPROCS=2 and
// the busy-poll settings; then `rocev2d bench` (raw UDP against the stack
// over the VM's loopback) inside vm0. rxe binds UDP 4791 in the kernel from
// module load, so the rocev2d rows run with rdma_rxe unloaded in both VMs,
// and the rxe rows run again after it is loaded back (rxe_again: the
// drift of the machine during the run).
//
// Every row reports MB/s or rtt_us, the ratio to the first rxe row
// (x_rxe; ≥ 1 is better for MB/s, ≤ 1 for RTT) and the guests' CPU: busy
// ms (user+sys+irq+softirq of both VMs, from /proc/stat) per MB, or per
// round trip. The rows named profile/* repeat a row with the kernel's
// histogram triggers on raw_syscalls:sys_enter and sched:sched_switch in
// both VMs and report syscalls and context switches per packet on the
// wire (eth0's counters); their full histograms are in the log.
//
//	sudo ROCEV2_INTEROP=1 go test -run '^$' -bench BenchmarkVM -benchtime 1x -timeout 30m -v ./test/interop/
//
// ROCEV2_VMBENCH_ITERS scales the runs (default 1: write-bw -n 300, pingpong
// -n 200), ROCEV2_VMBENCH_ROUNDS sets the rounds (default 2) and
// ROCEV2_VMBENCH_ROWS (a regular expression) picks the rocev2d rows;
// ROCEV2_VMBENCH_EXTRAS=0 runs the rounds only; ROCEV2_VMBENCH_BENCH=1 adds
// `rocev2d bench` in vm0 (slow there: more than 10 minutes on a loaded host).
func BenchmarkVM(b *testing.B) {
	cfg, img := prepareBench(b)
	cache := cfg.CacheDir
	// ROCEV2_VMBENCH_ALT=DIR (another checkout, e.g. a git worktree) adds
	// its rocev2d as rocev2d-alt and an "alt" row next to each default
	// row: two versions in the same boot, against the same rxe rounds.
	alt := os.Getenv("ROCEV2_VMBENCH_ALT")
	pimg, err := PairImage(cfg, img, alt)
	if err != nil {
		b.Fatal(err)
	}
	runDir := filepath.Join(cache, "run-vm")
	os.RemoveAll(runDir)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	p, err := StartVMPair(ctx, pimg, runDir, b.Logf)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	b.Logf("pair: boot %.1fs, rxe0 GID index vm0 %d vm1 %d", p.BootTime.Seconds(), p.VM[0].GIDIndex, p.VM[1].GIDIndex)

	scale := 1
	if s := os.Getenv("ROCEV2_VMBENCH_ITERS"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			scale = n
		}
	}
	bwN, ppN := 300*scale, 200*scale
	gid := p.VM[0].GIDIndex
	rxeRows := []vmRow{
		{name: "write_bw_64KiB", kind: "bw", cmd: fmt.Sprintf("ib_write_bw -d rxe0 -x %d -F -s 65536 -n %d", gid, bwN)},
		{name: "pingpong_8B", kind: "lat", cmd: fmt.Sprintf("ibv_rc_pingpong -d rxe0 -g %d -s 8 -n %d", gid, ppN)},
	}
	wb := fmt.Sprintf("rocev2d write-bw -s 65536 -n %d -v", bwN)
	pp := fmt.Sprintf("rocev2d pingpong -s 8 -n %d -v", ppN)
	// rocev2d's defaults: GSO where the NIC does not segment (virtio-net
	// here: on), no busy polling on one CPU, the setup's garbage collected
	// before the run. The variants show what each default is worth.
	oursRows := []vmRow{
		{name: "write_bw_64KiB/default", kind: "bw", cmd: wb, base: "write_bw_64KiB"},
		{name: "write_bw_64KiB/gso=false", kind: "bw", cmd: wb + " --gso=false", base: "write_bw_64KiB"},
		{name: "write_bw_64KiB/GOGC=off", kind: "bw", cmd: wb, env: "GOGC=off", base: "write_bw_64KiB"},
		{name: "write_bw_64KiB/GOMAXPROCS=2", kind: "bw", cmd: wb, env: "GOMAXPROCS=2", base: "write_bw_64KiB"},
		{name: "pingpong_8B/default", kind: "lat", cmd: pp, base: "pingpong_8B"},
		{name: "pingpong_8B/gso=false", kind: "lat", cmd: pp + " --gso=false", base: "pingpong_8B"},
		{name: "pingpong_8B/busy-poll=100us", kind: "lat", cmd: pp + " --busy-poll=100us", base: "pingpong_8B"},
		// Polling without ever sleeping, as ibv_rc_pingpong polls its CQ
		// (a round trip here takes about a millisecond, so 100 µs of
		// spinning always ran out and then slept).
		{name: "pingpong_8B/busy-poll=20ms", kind: "lat", cmd: pp + " --busy-poll=20ms", base: "pingpong_8B"},
		{name: "pingpong_8B/GOGC=off", kind: "lat", cmd: pp, env: "GOGC=off", base: "pingpong_8B"},
		{name: "pingpong_8B/GOMAXPROCS=2", kind: "lat", cmd: pp, env: "GOMAXPROCS=2", base: "pingpong_8B"},
		// The default again, telling whether GC cycles run (the log shows
		// the runtime's gc lines of both sides).
		{name: "pingpong_8B/gctrace", kind: "lat", cmd: pp, env: "GODEBUG=gctrace=1", base: "pingpong_8B"},
	}
	if alt != "" {
		oursRows = append(oursRows,
			vmRow{name: "write_bw_64KiB/alt", kind: "bw", cmd: strings.Replace(wb, "rocev2d", "rocev2d-alt", 1), base: "write_bw_64KiB"},
			vmRow{name: "pingpong_8B/alt", kind: "lat", cmd: strings.Replace(pp, "rocev2d", "rocev2d-alt", 1), base: "pingpong_8B"})
	}
	rawRow := vmRow{name: "pingpong_8B/raw_udp", kind: "lat", srvCmd: "udpping -timeout 120s -l 0.0.0.0:7000",
		cmd: fmt.Sprintf("udpping -n %d -s 8", ppN), addrSuffix: ":7000", udp: true, base: "pingpong_8B"}
	rawBusyRow := vmRow{name: "pingpong_8B/raw_udp_busy", kind: "lat", srvCmd: "udpping -busy -timeout 120s -l 0.0.0.0:7000",
		cmd: fmt.Sprintf("udpping -busy -n %d -s 8", ppN), addrSuffix: ":7000", udp: true, base: "pingpong_8B"}
	rounds := 2
	if s := os.Getenv("ROCEV2_VMBENCH_ROUNDS"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			rounds = n
		}
	}
	// ROCEV2_VMBENCH_ROWS, a regular expression, keeps the rocev2d rows
	// whose name it matches (the rxe rows always run).
	var keep *regexp.Regexp
	if s := os.Getenv("ROCEV2_VMBENCH_ROWS"); s != "" {
		if keep, err = regexp.Compile(s); err != nil {
			b.Fatalf("ROCEV2_VMBENCH_ROWS: %v", err)
		}
	}
	// ROCEV2_VMBENCH_EXTRAS=0 leaves out the profiles and icrc.test
	// (only the rounds of rows run).
	extras := os.Getenv("ROCEV2_VMBENCH_EXTRAS") != "0"
	pick := func(rows []vmRow) []vmRow {
		var out []vmRow
		for _, r := range rows {
			if keep == nil || keep.MatchString(r.name) {
				out = append(out, r)
			}
		}
		return out
	}
	vb := &vmBench{p: p, base: map[string]float64{}, all: map[string][]float64{}}
	runRows := func(prefix string, rows []vmRow) {
		for _, r := range rows {
			b.Run(prefix+"/"+r.name, func(b *testing.B) { vb.bench(ctx, b, prefix, r) })
		}
	}
	profile := func(prefix string, r vmRow) {
		b.Run("profile/"+prefix+"/"+r.name, func(b *testing.B) { vb.profile(ctx, b, r) })
	}
	// Rounds: rxe, then rocev2d with rdma_rxe unloaded, then rxe again
	// after the last round, so that every rocev2d round lies between two
	// rxe rounds of the same boot (the summary compares with their mean).
	for round := 1; round <= rounds+1; round++ {
		vb.base = map[string]float64{}
		runRows(fmt.Sprintf("r%d/rxe", round), rxeRows)
		if round == 1 && extras {
			profile("rxe", rxeRows[0])
			profile("rxe", rxeRows[1])
		}
		if round > rounds {
			break
		}
		if err := p.rxe(ctx, false); err != nil {
			b.Fatal(err)
		}
		runRows(fmt.Sprintf("r%d/rocev2d", round), pick(append(oursRows, rawRow, rawBusyRow)))
		if round == 1 && extras {
			profile("rocev2d", oursRows[0])
			profile("rocev2d", oursRows[1])
			profile("rocev2d", oursRows[4])
			profile("udpping", rawRow)
		}
		if round == rounds && extras {
			b.Run("icrc_in_vm0", func(b *testing.B) { vb.icrcInVM(ctx, b) })
		}
		if round == rounds && os.Getenv("ROCEV2_VMBENCH_BENCH") == "1" {
			for _, gso := range []string{"", " --gso"} {
				b.Run("bench_in_vm0"+strings.ReplaceAll(gso, " --", "/"), func(b *testing.B) { vb.benchInVM(ctx, b, gso) })
			}
		}
		if err := p.rxe(ctx, true); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("rows (same boot, in order):\n%s", vb.summary())
	b.Logf("means over the rounds, ratio to the mean of every rxe round:\n%s", vb.means())
}

// vmRow is one measurement between the VMs: cmd runs in vm0 as the server
// and in vm1 as the client (with vm0's address appended), under env.
type vmRow struct {
	name, kind, cmd, env string
	base                 string // the rxe row it is compared with
	srvCmd               string // the server's command when it differs from cmd
	addrSuffix           string // appended to vm0's address on the client's command line
	udp                  bool   // the server listens on UDP: no TCP listener to wait for
}

// vmBench holds the results of one BenchmarkVM run.
type vmBench struct {
	p    *VMPair
	base map[string]float64   // this round's rxe figure per row name
	all  map[string][]float64 // every figure per row name (rxe rows as "rxe/NAME")
	rows []string             // summary lines
	keys []string             // row names in first-seen order
}

// vmStat is a VM's /proc/stat cpu line and eth0 packet counters.
type vmStat struct {
	busy, total uint64 // jiffies
	pkts        uint64 // eth0 rx + tx
}

var reVMStat = regexp.MustCompile(`(?m)^VMSTAT cpu +([0-9 ]+?) PKTS (\d+) (\d+)$`)

// vmStatCmd prints a VMSTAT line.
const vmStatCmd = `echo "VMSTAT $(head -1 /proc/stat) PKTS $(cat /sys/class/net/eth0/statistics/rx_packets) $(cat /sys/class/net/eth0/statistics/tx_packets)"; ` +
	`echo "RXERETRY $(cat /sys/class/infiniband/rxe0/ports/1/hw_counters/completer_retry_err 2>/dev/null || echo none)"`

var (
	reRxeRetry = regexp.MustCompile(`(?m)^RXERETRY (\d+)$`)
	reOurRetry = regexp.MustCompile(`(?m)^\s+completer_retry_err\s+(\d+)$`)
)

// retries returns the requester's retransmission rounds (timeouts and
// sequence NAKs) in a side's output: rxe's completer_retry_err across the
// run, or rocev2d's from its -v counters.
func retries(out string) int {
	if m := reRxeRetry.FindAllStringSubmatch(out, -1); len(m) >= 2 {
		a, _ := strconv.Atoi(m[0][1])
		z, _ := strconv.Atoi(m[len(m)-1][1])
		return z - a
	}
	if m := reOurRetry.FindStringSubmatch(out); m != nil {
		n, _ := strconv.Atoi(m[1])
		return n
	}
	return 0
}

// parseVMStats returns the first and last VMSTAT lines of out.
func parseVMStats(out string) (first, last vmStat, ok bool) {
	m := reVMStat.FindAllStringSubmatch(out, -1)
	if len(m) < 2 {
		return first, last, false
	}
	parse := func(s []string) vmStat {
		var v vmStat
		for i, f := range strings.Fields(s[1]) {
			n, _ := strconv.ParseUint(f, 10, 64)
			v.total += n
			// user nice system idle iowait irq softirq steal ...
			if i != 3 && i != 4 {
				v.busy += n
			}
		}
		rx, _ := strconv.ParseUint(s[2], 10, 64)
		tx, _ := strconv.ParseUint(s[3], 10, 64)
		v.pkts = rx + tx
		return v
	}
	return parse(m[0]), parse(m[len(m)-1]), true
}

// vmOutcome is what one run of a row measured.
type vmOutcome struct {
	value    float64    // MB/s (bw) or µs per round trip (lat)
	busyMS   [2]float64 // guest CPU busy ms, vm0 and vm1
	pkts     [2]uint64  // eth0 packets, vm0 and vm1
	srv, cli string     // outputs
	wall     time.Duration
	amount   float64 // MB moved (bw) or round trips (lat)
	retries  int     // retransmission rounds of both sides
	prof     [2]string
}

var (
	reGCLine   = regexp.MustCompile(`(?m)^gc \d+ @.*$`)
	reFailLine = regexp.MustCompile(`(?m)^rocev2d [a-z-]+: .*$`)
	rePerfBW   = regexp.MustCompile(`(?m)^\s*(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$`)
	reHistHit  = regexp.MustCompile(`(?m)^\{ (.*) \} hitcount:\s+(\d+)`)
)

const tracefs = "/sys/kernel/tracing"

// traceOn / traceOff switch the histogram triggers on and off in a VM;
// traceRead prints them.
const (
	traceOn = `mount -t tracefs nodev ` + tracefs + ` 2>/dev/null; cd ` + tracefs + ` && ` +
		`echo 'hist:keys=common_pid.execname,id.syscall:sort=hitcount:size=2048' > events/raw_syscalls/sys_enter/trigger && ` +
		`echo 'hist:keys=prev_comm:sort=hitcount' > events/sched/sched_switch/trigger`
	traceOff = `cd ` + tracefs + ` && ` +
		`echo '!hist:keys=common_pid.execname,id.syscall:sort=hitcount:size=2048' > events/raw_syscalls/sys_enter/trigger; ` +
		`echo '!hist:keys=prev_comm:sort=hitcount' > events/sched/sched_switch/trigger`
	traceRead = `cd ` + tracefs + ` && echo HIST-SYSCALLS && cat events/raw_syscalls/sys_enter/hist && echo HIST-SCHED && cat events/sched/sched_switch/hist`
)

// once runs r one time between the VMs; with trace, inside the
// histogram triggers.
func (vb *vmBench) once(ctx context.Context, r vmRow, trace bool) (vmOutcome, error) {
	p := vb.p
	var o vmOutcome
	if trace {
		for i := range p.VM {
			if res, err := p.VM[i].Run(ctx, traceOn, 20*time.Second); err != nil || res.Exit != 0 {
				return o, fmt.Errorf("%s: tracing on: %v %s", pairSpecs[i].name, err, res.Output)
			}
		}
	}
	env := ""
	if r.env != "" {
		env = "env " + r.env + " "
	}
	wrap := func(cmd string) string {
		return vmStatCmd + "; " + env + cmd + "; rc=$?; " + vmStatCmd + "; exit $rc"
	}
	t0 := time.Now()
	srvCmd := r.srvCmd
	if srvCmd == "" {
		srvCmd = r.cmd
	}
	srv, err := p.VM[0].StartVM(ctx, agentproto.Request{Cmd: wrap(srvCmd), TimeoutSec: 300})
	if err != nil {
		return o, err
	}
	if !r.udp {
		if err := p.VM[0].WaitListenVM(ctx, 18515, 60*time.Second); err != nil {
			sr, _ := srv.Cancel()
			return o, fmt.Errorf("server did not listen: %v\n%s", err, sr.Output)
		}
	}
	cr, err := p.VM[1].Run(ctx, wrap(r.cmd+" "+p.IP[0]+r.addrSuffix), 300*time.Second)
	var sr agentproto.Response
	if err != nil || cr.Exit != 0 {
		sr, _ = srv.Cancel()
		return o, fmt.Errorf("client: exit %d %v\n--- client:\n%s\n--- server:\n%s", cr.Exit, err, cr.Output, sr.Output)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	sr, err = srv.Wait(wctx)
	cancel()
	o.wall = time.Since(t0)
	o.srv, o.cli = sr.Output, cr.Output
	if err != nil || sr.Exit != 0 {
		return o, fmt.Errorf("server: exit %d %v\n--- server:\n%s\n--- client:\n%s", sr.Exit, err, sr.Output, cr.Output)
	}
	o.retries = retries(sr.Output) + retries(cr.Output)
	for i, out := range []string{sr.Output, cr.Output} {
		a, z, ok := parseVMStats(out)
		if !ok {
			return o, fmt.Errorf("%s: no VMSTAT lines in\n%s", pairSpecs[i].name, out)
		}
		o.busyMS[i] = float64(z.busy-a.busy) * 10 // USER_HZ 100
		o.pkts[i] = z.pkts - a.pkts
	}
	switch r.kind {
	case "bw":
		m := rePerfBW.FindStringSubmatch(cr.Output)
		if m == nil {
			return o, fmt.Errorf("no result line in the client's output:\n%s", cr.Output)
		}
		o.value, _ = strconv.ParseFloat(m[4], 64)
		size, _ := strconv.ParseFloat(m[1], 64)
		n, _ := strconv.ParseFloat(m[2], 64)
		o.amount = size * n / 1e6
	case "lat":
		m := reItersLine.FindStringSubmatch(cr.Output)
		if m == nil {
			return o, fmt.Errorf("no iters line in the client's output:\n%s", cr.Output)
		}
		o.value, _ = strconv.ParseFloat(m[3], 64)
		o.amount, _ = strconv.ParseFloat(m[1], 64)
	}
	if trace {
		for i := range p.VM {
			res, err := p.VM[i].Run(ctx, traceRead+"; "+traceOff, 30*time.Second)
			if err != nil || res.Exit != 0 {
				return o, fmt.Errorf("%s: reading the histograms: %v %s", pairSpecs[i].name, err, res.Output)
			}
			o.prof[i] = res.Output
		}
	}
	return o, nil
}

// bench runs a row b.N times and reports the mean.
func (vb *vmBench) bench(ctx context.Context, b *testing.B, prefix string, r vmRow) {
	var sum vmOutcome
	var last vmOutcome
	for range b.N {
		o, err := vb.once(ctx, r, false)
		if err != nil {
			msg, _, _ := strings.Cut(err.Error(), "\n")
			if m := reFailLine.FindString(err.Error()); m != "" {
				msg += ": " + m
			}
			vb.rows = append(vb.rows, fmt.Sprintf("%-42s FAILED (%s)", prefix+"/"+r.name, msg))
			b.Fatal(err)
		}
		sum.value += o.value
		sum.amount += o.amount
		sum.retries += o.retries
		for i := range 2 {
			sum.busyMS[i] += o.busyMS[i]
			sum.pkts[i] += o.pkts[i]
		}
		last = o
	}
	v := sum.value / float64(b.N)
	busy := sum.busyMS[0] + sum.busyMS[1]
	base := r.base
	if base == "" {
		base = r.name
	}
	line := fmt.Sprintf("%-42s", prefix+"/"+r.name)
	switch r.kind {
	case "bw":
		b.ReportMetric(v, "MB/s")
		b.ReportMetric(busy/sum.amount, "cpu_ms/MB")
		line += fmt.Sprintf(" %9.2f MB/s  cpu %6.1f ms/MB", v, busy/sum.amount)
	case "lat":
		b.ReportMetric(v, "rtt_us")
		b.ReportMetric(busy/sum.amount, "cpu_ms/rt")
		line += fmt.Sprintf(" %9.1f µs    cpu %6.2f ms/rt", v, busy/sum.amount)
	}
	pk := float64(sum.pkts[0]+sum.pkts[1]) / 2
	b.ReportMetric(pk/float64(b.N), "pkts")
	b.ReportMetric(float64(sum.retries)/float64(b.N), "retries")
	line += fmt.Sprintf("  retries %d", sum.retries)
	key := r.name
	if strings.HasSuffix(prefix, "/rxe") {
		key = "rxe/" + r.name
		vb.base[base] = v
	} else if ref, ok := vb.base[base]; ok && ref > 0 {
		b.ReportMetric(v/ref, "x_rxe")
		line += fmt.Sprintf("  x_rxe %.3f", v/ref)
	}
	if _, ok := vb.all[key]; !ok {
		vb.keys = append(vb.keys, key)
	}
	vb.all[key] = append(vb.all[key], v)
	line += fmt.Sprintf("  busy vm0 %.0f%% vm1 %.0f%%", 100*sum.busyMS[0]/float64(b.N)/float64(last.wall.Milliseconds()),
		100*sum.busyMS[1]/float64(b.N)/float64(last.wall.Milliseconds()))
	gcs := reGCLine.FindAllString(last.cli+last.srv, -1)
	if strings.Contains(r.env, "gctrace") {
		b.ReportMetric(float64(len(gcs)), "gc_cycles")
		line += fmt.Sprintf("  gc cycles %d", len(gcs))
	}
	b.Logf("%s\n--- client (vm1):\n%s\n--- server (vm0):\n%s\n--- gc lines:\n%s", line, tail(last.cli, 14), tail(last.srv, 14), strings.Join(gcs, "\n"))
	vb.rows = append(vb.rows, line)
}

// profile runs a row once inside the histogram triggers and reports
// syscalls and context switches per packet on each VM's wire.
func (vb *vmBench) profile(ctx context.Context, b *testing.B, r vmRow) {
	o, err := vb.once(ctx, r, true)
	if err != nil {
		b.Fatal(err)
	}
	line := fmt.Sprintf("%-42s", "profile/"+r.name+" ("+strings.TrimSpace(r.env+" "+firstWord(r.cmd))+")")
	for i := range 2 {
		sys, top := histSyscalls(o.prof[i])
		sw := histSched(o.prof[i])
		pk := float64(max(o.pkts[i], 1))
		who := pairSpecs[i].name
		b.ReportMetric(float64(sys)/pk, who+"_syscalls/pkt")
		b.ReportMetric(float64(sw)/pk, who+"_ctxsw/pkt")
		line += fmt.Sprintf("  %s: %d pkts, %.3f syscalls/pkt, %.3f ctxsw/pkt [%s]", who, o.pkts[i], float64(sys)/pk, float64(sw)/pk, top)
		b.Logf("%s histograms:\n%s", who, tail(o.prof[i], 60))
	}
	b.Log(line)
	vb.rows = append(vb.rows, line)
}

func firstWord(s string) string { f, _, _ := strings.Cut(s, " -"); return f }

// histSyscalls sums the syscall histogram of the benchmark's processes
// (ib_*, ibv_*, rocev2d; not the agent or the shell) and names the top ones.
func histSyscalls(out string) (int, string) {
	sec, _, _ := strings.Cut(out, "HIST-SCHED")
	type kv struct {
		k string
		n int
	}
	var all []kv
	total := 0
	for _, m := range reHistHit.FindAllStringSubmatch(sec, -1) {
		if !benchProc(m[1]) {
			continue
		}
		n, _ := strconv.Atoi(m[2])
		total += n
		name := m[1]
		if _, s, ok := strings.Cut(m[1], ", id: "); ok {
			name = strings.Fields(s)[0]
		}
		all = append(all, kv{name, n})
	}
	agg := map[string]int{}
	for _, e := range all {
		agg[e.k] += e.n
	}
	all = all[:0]
	for k, n := range agg {
		all = append(all, kv{k, n})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].n > all[j].n })
	var top []string
	for i := 0; i < len(all) && i < 4; i++ {
		top = append(top, fmt.Sprintf("%s %d", all[i].k, all[i].n))
	}
	return total, strings.Join(top, ", ")
}

// histSched sums the context switches away from the benchmark's processes.
func histSched(out string) int {
	_, sec, _ := strings.Cut(out, "HIST-SCHED")
	total := 0
	for _, m := range reHistHit.FindAllStringSubmatch(sec, -1) {
		if benchProc(m[1]) {
			n, _ := strconv.Atoi(m[2])
			total += n
		}
	}
	return total
}

func benchProc(key string) bool {
	for _, p := range []string{"rocev2d", "udpping", "ib_write_bw", "ibv_rc_pingpong", "ib_write_lat", "ib_send_lat"} {
		if strings.Contains(key, p) {
			return true
		}
	}
	return false
}

var reBenchRow = regexp.MustCompile(`(?m)^\s*(.+?)\s+(64 B|4 KiB|64 KiB|8 B)\s+([0-9.]+) (MB/s|µs)\s+([0-9.]+) (MB/s|µs)\s+([0-9.]+)`)

// benchInVM runs `rocev2d bench` over vm0's loopback (raw UDP against the
// stack, the same path MTU as the wire).
func (vb *vmBench) benchInVM(ctx context.Context, b *testing.B, flags string) {
	res, err := vb.p.VM[0].Run(ctx, "rocev2d bench -t 600ms -m 1024"+flags, 600*time.Second)
	if err != nil || res.Exit != 0 {
		b.Fatalf("rocev2d bench%s: exit %d %v\n%s", flags, res.Exit, err, res.Output)
	}
	b.Logf("rocev2d bench -t 600ms -m 1024%s in vm0:\n%s", flags, res.Output)
	for _, m := range reBenchRow.FindAllStringSubmatch(res.Output, -1) {
		name := strings.ReplaceAll(strings.TrimSpace(m[1])+"_"+m[2], " ", "_")
		raw, _ := strconv.ParseFloat(m[3], 64)
		ours, _ := strconv.ParseFloat(m[5], 64)
		unit := "MB/s"
		if m[4] == "µs" {
			unit = "us"
		}
		b.ReportMetric(raw, "raw_"+name+"_"+unit)
		b.ReportMetric(ours, "stack_"+name+"_"+unit)
	}
	vb.rows = append(vb.rows, "bench_in_vm0"+flags+":\n"+strings.TrimSpace(res.Output))
}

var reGoBench = regexp.MustCompile(`(?m)^Benchmark(\S+?)(?:-\d+)?\s+\d+\s+([0-9.]+) ns/op`)

// icrcInVM runs package icrc's benchmarks in vm0: the ICRC of a packet on
// the VM's CPU (qemu TCG's -cpu max has no AVX-512, so the package's
// VPCLMULQDQ folding kernel does not run there), against the per-packet
// time of the first rxe write-bw row.
func (vb *vmBench) icrcInVM(ctx context.Context, b *testing.B) {
	res, err := vb.p.VM[0].Run(ctx, `echo "cpu flags: $(grep -o -w -E 'avx512[a-z_]*|vpclmulqdq|pclmulqdq|avx2|sse4_2' /proc/cpuinfo | sort -u | tr '\n' ' ')"; `+
		`icrc.test -test.run '^$' -test.bench 'Verify(64|1K)$|CRC32Baseline1K$' -test.benchtime 2000x`, 300*time.Second)
	if err != nil || res.Exit != 0 {
		b.Fatalf("icrc.test: exit %d %v\n%s", res.Exit, err, res.Output)
	}
	line := "icrc_in_vm0: " + strings.TrimSpace(strings.SplitN(res.Output, "\n", 2)[0])
	for _, m := range reGoBench.FindAllStringSubmatch(res.Output, -1) {
		ns, _ := strconv.ParseFloat(m[2], 64)
		b.ReportMetric(ns/1000, m[1]+"_us")
		line += fmt.Sprintf("; %s %.1f µs", m[1], ns/1000)
		if m[1] == "Verify1K" {
			if rxe := vb.all["rxe/write_bw_64KiB"]; len(rxe) > 0 && rxe[0] > 0 {
				// rxe's 64 KiB messages are 64 packets of 1 KiB.
				perPkt := 1024 / (rxe[0] * (1 << 20)) * 1e6 // µs per packet at rxe's MB/s (perftest's MB = 2^20)
				line += fmt.Sprintf(" (%.0f%% of the %.1f µs per packet at rxe's first write-bw rate)", 100*ns/1000/perPkt, perPkt)
			}
		}
	}
	b.Log(line + "\n" + res.Output)
	vb.rows = append(vb.rows, line)
}

func (vb *vmBench) summary() string { return strings.Join(vb.rows, "\n") }

// means returns one line per row: the mean over the rounds and its ratio
// to the mean of every rxe round of the row it is compared with.
func (vb *vmBench) means() string {
	mean := func(v []float64) float64 {
		s := 0.0
		for _, x := range v {
			s += x
		}
		return s / float64(max(len(v), 1))
	}
	var b strings.Builder
	for _, k := range vb.keys {
		v := vb.all[k]
		fmt.Fprintf(&b, "%-34s mean %10.2f over %d (", k, mean(v), len(v))
		for i, x := range v {
			if i > 0 {
				b.WriteString(" ")
			}
			fmt.Fprintf(&b, "%.2f", x)
		}
		b.WriteString(")")
		if base, _, _ := strings.Cut(k, "/"); base != "rxe" {
			if ref := mean(vb.all["rxe/"+base]); ref > 0 {
				fmt.Fprintf(&b, "  x_rxe %.3f", mean(v)/ref)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// rxe loads (on) or unloads rdma_rxe in both VMs: unloaded, UDP 4791 is
// free for rocev2d; loaded again, rxe0 is back on eth0 with its GIDs.
func (p *VMPair) rxe(ctx context.Context, on bool) error {
	cmd := `rdma link delete rxe0 && rmmod rdma_rxe && ! grep -q rdma_rxe /proc/modules`
	if on {
		cmd = `m=$(grep rdma_rxe /etc/rocev2lab/modules) && insmod /lib/modules/$(uname -r)/$m && rdma link add rxe0 type rxe netdev eth0 && ` +
			`for i in $(seq 200); do grep -q 'RoCE v2' /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/1 2>/dev/null && exit 0; sleep 0.05; done; exit 1`
	}
	for i := range p.VM {
		r, err := p.VM[i].Run(ctx, cmd, 60*time.Second)
		if err != nil || r.Exit != 0 {
			return fmt.Errorf("%s: rxe on=%v: exit %d %v\n%s", pairSpecs[i].name, on, r.Exit, err, r.Output)
		}
	}
	p.logf("pair: rdma_rxe loaded=%v in both VMs", on)
	return nil
}

// prepareBench is the start of the VM benchmarks: skipped without
// ROCEV2_INTEROP=1 or root (fatal under CI=true), then the lab's image.
func prepareBench(b *testing.B) (Config, *Image) {
	b.Helper()
	if os.Getenv("ROCEV2_INTEROP") != "1" {
		b.Skip(enableHint)
	}
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			b.Fatal("ROCEV2_INTEROP=1 needs root (network namespace, tap, apt-get)")
		}
		b.Skip("ROCEV2_INTEROP=1 needs root (network namespace, tap, apt-get)")
	}
	root, err := FindRepoRoot(".")
	if err != nil {
		b.Fatal(err)
	}
	cache := DefaultCacheDir()
	cfg := Config{CacheDir: cache, RepoRoot: root, Logf: b.Logf}
	img, err := Prepare(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return cfg, img
}
