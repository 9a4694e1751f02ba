//go:build linux

package interop

import "testing"

// TestParseVMStats: the busy jiffies are every /proc/stat column but idle
// and iowait, the packets eth0's rx + tx, from the first and last VMSTAT
// lines of an output.
func TestParseVMStats(t *testing.T) {
	out := "VMSTAT cpu  100 1 50 1000 7 2 3 0 0 0 PKTS 10 20\n" +
		"some output\nVMSTAT cpu  101 1 50 1000 7 2 3 0 0 0 PKTS 11 20\n" +
		"VMSTAT cpu  200 1 80 1500 9 2 13 0 0 0 PKTS 110 220\n"
	a, z, ok := parseVMStats(out)
	if !ok {
		t.Fatal("no VMSTAT lines found")
	}
	if got, want := z.busy-a.busy, uint64(100+30+10); got != want {
		t.Errorf("busy delta %d, want %d", got, want)
	}
	if got, want := z.total-a.total, uint64(100+30+500+2+10); got != want {
		t.Errorf("total delta %d, want %d", got, want)
	}
	if got, want := z.pkts-a.pkts, uint64(300); got != want {
		t.Errorf("packets delta %d, want %d", got, want)
	}
	if _, _, ok := parseVMStats("VMSTAT cpu  1 2 3 4 PKTS 1 1\n"); ok {
		t.Error("one VMSTAT line parsed as two")
	}
}

// TestHistParse: the syscall and sched_switch histograms of the kernel's
// hist triggers are summed over the benchmark's processes only.
func TestHistParse(t *testing.T) {
	out := `HIST-SYSCALLS
# event histogram
{ common_pid: init            [        92], id: sys_read                      [  0] } hitcount:         32
{ common_pid: rocev2d         [       261], id: sys_write                     [  1] } hitcount:         41
{ common_pid: rocev2d         [       264], id: sys_recvmmsg                  [299] } hitcount:        600
{ common_pid: rocev2d         [       261], id: sys_recvmmsg                  [299] } hitcount:        601
{ common_pid: ib_write_bw     [       300], id: sys_futex                     [202] } hitcount:          7

Totals:
    Hits: 1281
HIST-SCHED
{ prev_comm: ksoftirqd/0                                        } hitcount:        505
{ prev_comm: rocev2d                                            } hitcount:       7371
`
	n, top := histSyscalls(out)
	if n != 41+600+601+7 {
		t.Errorf("syscalls %d, want %d", n, 41+600+601+7)
	}
	if want := "sys_recvmmsg 1201, sys_write 41, sys_futex 7"; top != want {
		t.Errorf("top %q, want %q", top, want)
	}
	if sw := histSched(out); sw != 7371 {
		t.Errorf("context switches %d, want 7371", sw)
	}
}

// TestBenchRowRegexp: the rows of `rocev2d bench` yield raw and stack
// figures.
func TestBenchRowRegexp(t *testing.T) {
	for _, c := range []struct {
		line, name, raw, ours string
	}{
		{"       WRITE goodput   64 KiB   1.6 MB/s   1.6 MB/s  0.998       1558     44.5%          1580", "WRITE goodput", "1.6", "1.6"},
		{"  SEND ping-pong RTT      8 B  1928.5 µs  3316.7 µs   1.72", "SEND ping-pong RTT", "1928.5", "3316.7"},
	} {
		m := reBenchRow.FindStringSubmatch(c.line)
		if m == nil {
			t.Errorf("%q: no match", c.line)
			continue
		}
		if m[1] != c.name || m[3] != c.raw || m[5] != c.ours {
			t.Errorf("%q: got %q %q %q", c.line, m[1], m[3], m[5])
		}
	}
}

// TestRetries: rxe's completer_retry_err across a run (RXERETRY lines),
// else rocev2d's -v counter, else none.
func TestRetries(t *testing.T) {
	for _, c := range []struct {
		out  string
		want int
	}{
		{"RXERETRY 3\n 65536 300 2.1 2.0 0.1\nRXERETRY 7\n", 4},
		{"RXERETRY none\ncounters 192.0.2.11:\n  completer_retry_err      24\n  local_ack_timeout_err    24\nRXERETRY none\n", 24},
		{"RXERETRY none\n200 iters in 1 seconds = 5000 usec/iter\nRXERETRY none\n", 0},
	} {
		if got := retries(c.out); got != c.want {
			t.Errorf("retries(%q) = %d, want %d", c.out, got, c.want)
		}
	}
}

// TestNvmfBenchParsers: BenchmarkVMNvmf's readers of /proc/stat's cpu
// line (USER_HZ 100: a jiffy is 10 ms), of eth0's counters and of dio's
// result line.
func TestNvmfBenchParsers(t *testing.T) {
	for _, c := range []struct {
		in         string
		busy, idle float64
	}{
		{"cpu  100 1 50 1000 7 2 3 0 0 0", (100 + 1 + 50 + 2 + 3) * 10, (1000 + 7) * 10},
		{"cpu  0 0 0 0 0 0 0", 0, 0},
		{"cpu0 1 2 3 4 5 6 7", 0, 0}, // a per-CPU line is not the total
		{"cpu 1 2 3", 0, 0},          // too short
		{"", 0, 0},
	} {
		if b, i := parseCPU(c.in); b != c.busy || i != c.idle {
			t.Errorf("parseCPU(%q) = %v, %v; want %v, %v", c.in, b, i, c.busy, c.idle)
		}
	}
	if got := parseNet("x\nnet 10 20 3000 4000\n"); got != [4]float64{10, 20, 3000, 4000} {
		t.Errorf("parseNet: %v", got)
	}
	if got := parseNet("no counters"); got != [4]float64{} {
		t.Errorf("parseNet without a line: %v", got)
	}
	m := reDio.FindStringSubmatch("ctrl x\ndio bs=4096 qd=16 rw=randread ios=5120 secs=5.00 IOPS=1024 MB/s=4.19\n")
	if m == nil || m[1] != "4096" || m[2] != "5120" || m[3] != "1024" || m[4] != "4.19" {
		t.Errorf("reDio: %q", m)
	}
	d := dioStat{ios: 100, txPkts: 300, rxPkts: 600, txBytes: 24600, rxBytes: 448400, busyMs: 60, idleMs: 40, busy1Ms: 50, idle1Ms: 50}
	if got, want := d.String(), "pkts/io 3.00 out 6.00 in (246+4484 B/io), vm0 busy 60% = 600 us/io, vm1 busy 50% = 500 us/io"; got != want {
		t.Errorf("dioStat:\n got %s\nwant %s", got, want)
	}
}
