//go:build linux

package interop

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/udp/faults"
)

// The loss cell (nvmf/loss1pct): everything of the nvmf cells again under
// 1 % loss both ways on the tap, as four steps, each its own VM script:
// the filesystem, the reset during a write, 20 reconnects, then dd (last:
// the regions it checks in the target's file are its own). Smaller than
// the cells without loss (an 8 MiB filesystem with 768 KiB of files, a
// 4 MiB write across the reset, 2 blocks per dd size): each lost
// single-packet command costs the Linux host's ACK timeout (about 2 s):
// the full sizes took 257 s.
//
// A step that fails only because Linux 6.1's rxe hit its own fast-reg
// retry bug (nvmfRxeFastRegBug) runs once more, loudly: the row says
// "ok (rerun)" and names the bug and the kernel line; a second failure,
// and every other failure, fails the cell.

// rxeFastRegBugNote explains the rerun (the row's counters and the table's
// footnote).
const rxeFastRegBugNote = "rxe's own fast-reg retry bug (Linux 6.1 rxe_req.c: req_retry rewinds the requester to the oldest unacknowledged WQE and leaves an executed REG_MR behind it in state done; rxe_requester executes it again, rxe_reg_fast_mr fails with \"not free\" and the requester stops, so the queue's later commands never go out until the host's I/O or admin timeout; any retransmission by the VM's rxe — after a lost SEND and the target's NAK, or its ACK timeout — while a REG_MR sits behind an unacknowledged SEND triggers it; no upstream fix found: later upstream rxe has the same code path and logs the line at debug level only)"

var (
	// reRxeFastRegBug is the kernel's line of that bug, as fail() prints
	// it from the kernel log since the step began.
	reRxeFastRegBug = regexp.MustCompile(`(?m)^kernel since step: (\[[ 0-9.]+\] rdma_rxe: rxe_reg_fast_mr: mr->lkey = 0x[0-9a-f]+ not free)$`)
	// reNvmfDataFail: the VM found data that differs (cmp, md5sum -c).
	reNvmfDataFail = regexp.MustCompile(`(?m)^FAIL: (data|checksums)|: FAILED$`)
)

// nvmfRxeFastRegBug reports whether the VM output out of the failed step
// named step (with the host's problems probs) is rxe's fast-reg retry bug
// and nothing worse, and returns the kernel's line. It is when the step's
// script failed (a "FAIL: " line), the kernel logged rxe_reg_fast_mr's
// "not free" after the step's own mark (nvmfStep; without the mark in
// fail()'s output the kernel log is not known to be the step's), and no
// data was found to differ — neither by the VM (cmp, md5sum -c) nor in the
// target's file.
func nvmfRxeFastRegBug(out, step string, probs []string) (string, bool) {
	mark := regexp.MustCompile(`(?m)^kernel since step: \[[ 0-9.]+\] rocev2lab: step ` + regexp.QuoteMeta(step) + `$`).FindStringIndex(out)
	m := reRxeFastRegBug.FindStringSubmatchIndex(out)
	if mark == nil || m == nil || m[0] < mark[1] || !regexp.MustCompile(`(?m)^FAIL: `).MatchString(out) || reNvmfDataFail.MatchString(out) {
		return "", false
	}
	for _, p := range probs {
		if strings.Contains(p, "differs") {
			return "", false
		}
	}
	return out[m[2]:m[3]], true
}

// The Linux host's I/O and admin command timeouts in seconds (nvme_core's
// io_timeout and admin_timeout, read when a controller is created).
const (
	nvmeIOTimeout    = "/sys/module/nvme_core/parameters/io_timeout"
	nvmeAdminTimeout = "/sys/module/nvme_core/parameters/admin_timeout"
)

// rxeFastRegBugCount is how many times the VM's kernel logged rxe's
// fast-reg "not free" since it booted (-1 when it cannot tell).
func rxeFastRegBugCount(ctx context.Context, lab *Lab) int {
	res, err := lab.Run(ctx, "dmesg | grep -c -E 'rxe_reg_fast_mr: mr->lkey = 0x[0-9a-f]+ not free'", 20*time.Second)
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(res.Output))
	if err != nil {
		return -1
	}
	return n
}

// nvmfLossStep is one step of the loss cell: a VM script body and the line
// it prints when it passed ("" for dd, whose regions are checked instead).
type nvmfLossStep struct {
	name, body, want string
}

func nvmfLossCell(t *testing.T, ctx context.Context, lab *Lab, h *HostProc, inj *lossInjector, file, dir string, add func(row)) {
	ls := []int{4096, 65536, 1 << 20}
	steps := []nvmfLossStep{
		{"mkfs", nvmfMkfsBody, "ctrl files equal after remount"},
		{"reset", nvmfResetBody, "ctrl reset during I/O, 4 MiB intact"},
		{"reconnect", nvmfReconnectBody, "ctrl 20 rounds"},
		{"dd", nvmfDDBody(ls, 2), ""},
	}
	t.Run("loss1pct", func(t *testing.T) {
		t0 := time.Now()
		r := row{cell: "under 1% loss: mke2fs/mount/checksums, reset_controller during a write, 20 reconnects, O_DIRECT dd, data checked", direction: dir, result: "FAIL"}
		defer func() { r.d = time.Since(t0); add(r) }()
		// The wire on both sides of the injector (the tap sees the VM's
		// packets before the ingress drop, the bridge after it) and rxe's
		// counters, for a failure's diagnosis; the VM's uptime against
		// the host's clock maps dmesg's times onto the captures'.
		var caps []*Capture
		for _, ifn := range []string{Tap, Bridge} {
			if c, err := lab.StartCaptureOn(ctx, ifn, filepath.Join(lab.Dir, "nvmf-loss1pct-"+ifn+".pcap")); err != nil {
				t.Logf("capture on %s: %v", ifn, err)
			} else {
				caps = append(caps, c)
			}
		}
		rxeBefore, _ := lab.Counters(ctx)
		t1 := time.Now()
		if up, err := lab.Run(ctx, "cat /proc/uptime", 20*time.Second); err == nil {
			t.Logf("loss1pct clock: host %s .. %s = VM uptime %s", t1.Format("15:04:05.000000"), time.Now().Format("15:04:05.000000"), strings.TrimSpace(up.Output))
		}
		defer func() {
			// The kernel's warnings (rxe's pr_warn is below the console's
			// log level), with the step marks.
			if dm, err := lab.Run(ctx, "dmesg | grep -i -E 'rocev2lab|rxe|rdma|nvme' | grep -v -E 'new ctrl|Removing ctrl|creating 1 I/O|mapped 1/0/0' | tail -80", 20*time.Second); err == nil {
				t.Logf("loss1pct: the VM's kernel log (nvme/rdma/rxe, without connect/disconnect lines):\n%s", dm.Output)
			}
			for _, c := range caps {
				t.Logf("loss1pct capture %s: %s", c.File, c.Stop())
			}
			if after, err := lab.Counters(ctx); err == nil && rxeBefore != nil {
				var d []string
				for k, v := range after {
					if v != rxeBefore[k] {
						d = append(d, fmt.Sprintf("%s=%d", k, v-rxeBefore[k]))
					}
				}
				sort.Strings(d)
				t.Logf("loss1pct rxe counters (delta): %s", strings.Join(d, " "))
			}
		}()

		// The host's I/O and admin timeouts 15 s instead of 30 and 60,
		// and its reconnect delay 1 s instead of 10 (restored after the
		// cell): when rxe's fast-reg retry bug stops a queue's requester
		// (below), the host finds out at the timeout and recovers by
		// reconnecting; that took 40 s of a step at the defaults, and 54 s
		// of a keep-alive on a stopped admin queue. Under 1 % loss a
		// command's longest legitimate wait seen was two ACK timeouts,
		// about 6.5 s.
		for _, p := range []string{nvmeIOTimeout, nvmeAdminTimeout} {
			if res, err := lab.Run(ctx, "cat "+p, 20*time.Second); err == nil && res.Exit == 0 {
				defer lab.Run(ctx, "echo "+strings.TrimSpace(res.Output)+" > "+p, 20*time.Second)
			}
		}
		bugsBefore := rxeFastRegBugCount(ctx, lab)
		prelude := nvmfShell + "RETRY=2; FSKB=8192; FILEBLKS=2; RESETMB=4; CONNOPTS=,reconnect_delay=1; echo 15 > " + nvmeIOTimeout + "; echo 15 > " + nvmeAdminTimeout + "\n"
		check := func(s nvmfLossStep, out string, exit int) []string {
			var probs []string
			if exit != 0 {
				probs = append(probs, fmt.Sprintf("step %s: VM script exit %d", s.name, exit))
			}
			if s.want != "" && !strings.Contains(out, s.want) {
				probs = append(probs, "missing: "+s.want)
			}
			if s.name == "dd" {
				probs = append(probs, checkNvmfRegions(file, out, len(ls))...)
			}
			return probs
		}
		var all strings.Builder
		var took, reruns, probs []string
		for _, s := range steps {
			script := prelude + nvmfStep(s.name) + s.body + "echo done\n"
			ts := time.Now()
			res, err := lab.Run(ctx, script, 5*time.Minute)
			if err != nil {
				r.counters = fmt.Sprintf("step %s: %v", s.name, err)
				t.Fatalf("step %s: %v\n%s", s.name, err, res.Output)
			}
			sp := check(s, res.Output, res.Exit)
			if line, ok := nvmfRxeFastRegBug(res.Output, s.name, sp); len(sp) > 0 && ok {
				t.Logf("RERUN step %s: the first run hit %s; kernel: %s; its problems: %s\n--- VM output:\n%s",
					s.name, rxeFastRegBugNote, line, strings.Join(sp, "; "), res.Output)
				reruns = append(reruns, fmt.Sprintf("step %s: %s", s.name, line))
				all.WriteString(res.Output)
				res, err = lab.Run(ctx, script, 5*time.Minute)
				if err != nil {
					r.counters = fmt.Sprintf("rerun of step %s: %v", s.name, err)
					t.Fatalf("rerun of step %s: %v\n%s", s.name, err, res.Output)
				}
				sp = check(s, res.Output, res.Exit)
				for i := range sp {
					sp[i] = "rerun: " + sp[i]
				}
			}
			took = append(took, fmt.Sprintf("%s %.0fs", s.name, time.Since(ts).Seconds()))
			all.WriteString(res.Output)
			if len(sp) > 0 {
				probs = append(probs, sp...)
				t.Errorf("%s\n--- VM output:\n%s\n--- rocev2d nvmf-target:\n%s", strings.Join(sp, "\n"), res.Output, tail(h.Output(), 40))
				break
			}
		}
		out := all.String()
		// The bug hits more often than it fails a step: the host's error
		// recovery usually saves the step. Said in the row either way.
		bugs := 0
		if after := rxeFastRegBugCount(ctx, lab); after >= 0 && bugsBefore >= 0 {
			bugs = after - bugsBefore
		}
		eg, err1 := inj.inj.HookCounters(faults.Egress)
		in, err2 := inj.inj.HookCounters(faults.Ingress)
		if err1 != nil || err2 != nil || eg.Dropped() == 0 || in.Dropped() == 0 {
			p := fmt.Sprintf("the injector dropped nothing one way: %v %v %+v %+v", err1, err2, eg, in)
			probs = append(probs, p)
			t.Error(p)
		}
		t.Logf("loss1pct: %s; connects tried again: %d; steps took: %s; steps at (VM uptime): %s", inj.summary(h.Output()),
			strings.Count(out, "connect retry "), strings.Join(took, ", "), strings.Join(regexp.MustCompile(`(?m)^step .*$`).FindAllString(out, -1), ", "))
		if len(reruns) > 0 {
			t.Logf("loss1pct: %d step(s) ran again after %s: %s", len(reruns), rxeFastRegBugNote, strings.Join(reruns, "; "))
		}
		bugNote := ""
		if bugs > 0 {
			bugNote = fmt.Sprintf("; rxe's fast-reg retry bug hit %d time(s) (kernel: rxe_reg_fast_mr ... not free)", bugs)
			t.Logf("loss1pct: %s hit %d time(s) in this cell", rxeFastRegBugNote, bugs)
		}
		if len(probs) > 0 {
			r.counters = strings.Join(probs, "; ")
			if len(reruns) > 0 {
				r.counters += " | first run of " + strings.Join(reruns, "; ")
			}
			r.counters += bugNote
			return
		}
		r.result = "ok"
		r.counters = "steps " + strings.Join(took, ", ") + bugNote
		if len(reruns) > 0 {
			r.result = "ok (rerun)"
			r.counters += " | RERUN after rxe's fast-reg retry bug, " + strings.Join(reruns, "; ")
		}
	})
}
