//go:build linux

package interop

import (
	"fmt"
	"strconv"

	"github.com/gorocev2/rocev2/udp/faults"
)

// readLossEveryN is the drop period of the large-READ loss cell: every
// readLossEveryN-th RoCEv2 packet from the VM (a READ response) is dropped
// on the tap (rocev2d's few requests never reach the count). The first
// loss is response 1500 of the first 4 MiB READ (4096 packets at MTU
// 1024), so rxe keeps streaming the other 2596 packets of that flight
// (about 0.18 s under TCG, well over the 67 ms ACK timeout) after rocev2d
// has re-requested from the gap; later flights lose a packet about every
// 1500 again. Deterministic, unlike the random drop of the loss cells, and
// above both stacks' window (128), so no resent flight loses the same
// packet each time.
const readLossEveryN = 1500

// readLossCells returns the large-READ loss cell: rocev2d is the READ
// requester (read-lat client) of 4 MiB READs against ib_read_lat in the
// VM, and responses are lost early in their flight (readLossEveryN). The
// go-back-N re-request from the gap is answered only after the rest of
// the old flight, which outlasts the ACK timeout; those expiries must
// spend no retry (ack_timeout_busy, docs/LIVENESS.md) — before that, the
// cell failed with a retry exceeded.
func readLossCells(gidIndex int) []cell {
	const size, iters = 4 << 20, 5
	args := []string{"-s", strconv.Itoa(size), "-n", strconv.Itoa(iters)}
	return []cell{{
		name:          "ib_read_lat_4M_loss_every1500_rocev2d_client",
		label:         fmt.Sprintf("ib_read_lat -s %d -n %d @ every %dth response lost", size, iters, readLossEveryN),
		tool:          fmt.Sprintf("ib_read_lat -d rxe0 -x %d -F -s %d -n %d", gidIndex, size, iters),
		toolName:      "ib_read_lat",
		ours:          append([]string{"read-lat", "--bind", HostIP, "-v", "--timeout", "120s"}, args...),
		check:         func(who, out string) []string { return checkPerftestOutput(who, out, size, iters) },
		passiveServer: true,
		minPkts:       iters * size / labMTU,
		loss:          1.0 / readLossEveryN,
		lossCfg:       &faults.Config{DropEveryN: readLossEveryN},
		// The VM itself loses a few packets of these long streams
		// (4 of 62511 in a trial run): the original case, which the
		// go-back-N recovers from too.
		rxeLosesOwn:  true,
		counterCheck: func(_ func(string) int64, _ *CaptureStats, hostOut string) []string { return readLossProblems(hostOut) },
	}}
}

// readLossProblems checks rocev2d's counters after the large-READ loss
// cell: the stale-flight path ran (ack_timeout_busy > 0) and no WQE ran
// out of retries.
func readLossProblems(hostOut string) []string {
	ours, err := ourCounters(hostOut)
	if err != nil {
		return []string{err.Error()}
	}
	var p []string
	if ours["ack_timeout_busy"] == 0 {
		p = append(p, "rocev2d ack_timeout_busy=0: no ACK timer expiry found the old READ response flight still arriving (the cell did not exercise the path)")
	}
	if n := ours["retry_exceeded_err"]; n != 0 {
		p = append(p, fmt.Sprintf("rocev2d retry_exceeded_err=%d", n))
	}
	return p
}
