//go:build linux

package interop

import (
	"fmt"
	"strconv"
	"strings"
)

// perftest -b: ib_write_bw, ib_read_bw, ib_send_bw and ib_atomic_bw
// (4096 B; 8 B) in bidirectional mode against rocev2d -b as server and as
// client: both sides run the data phase at once on the one QP and print
// the sum of both directions, under a "Bidirectional BW Test" title. Besides
// every check of a clean cell, a cell checks that the capture holds the
// test's requests from both sides, a message count's worth each. There is no
// data check: rocev2d's --check verifies what the peer wrote, and needs
// rocev2d on both sides with -b.
func bidiCells(gidIndex int) []cell {
	var cs []cell
	for _, server := range []bool{true, false} {
		role := map[bool]string{true: "server", false: "client"}[server]
		for _, pt := range []struct {
			tool, sub string
			size      int
			ops       []string // the first packet of each request message
		}{
			{"ib_write_bw", "write-bw", 4096, []string{"RC_RDMA_WRITE_FIRST", "RC_RDMA_WRITE_ONLY"}},
			{"ib_read_bw", "read-bw", 4096, []string{"RC_RDMA_READ_REQUEST"}},
			{"ib_send_bw", "send-bw", 4096, []string{"RC_SEND_FIRST", "RC_SEND_ONLY"}},
			{"ib_atomic_bw", "atomic-bw", 8, []string{"RC_FETCH_ADD"}},
		} {
			size, n, ops := pt.size, 2*iters(), pt.ops
			args := []string{"-b", "-s", strconv.Itoa(size), "-n", strconv.Itoa(n)}
			cs = append(cs, cell{
				name:     fmt.Sprintf("%s_b_%d_rocev2d_%s", pt.tool, size, role),
				label:    strings.Join(append([]string{pt.tool}, args...), " "),
				tool:     fmt.Sprintf("%s -d rxe0 -x %d -F %s", pt.tool, gidIndex, strings.Join(args, " ")),
				toolName: pt.tool,
				ours:     append([]string{pt.sub, "--bind", HostIP, "-v", "--timeout", "120s"}, args...),
				check: func(who, out string) []string {
					p := checkPerftestOutput(who, out, size, n)
					if !strings.Contains(out, " Bidirectional BW Test\n") {
						p = append(p, who+`: its header does not say "Bidirectional BW Test"`)
					}
					return p
				},
				captureCheck: func(st *CaptureStats, hostOut, vmOut string) []string {
					var p []string
					for _, who := range []string{"host", "vm  "} {
						got := 0
						for _, op := range ops {
							got += st.Opcodes[who+" "+op]
						}
						if got < n {
							p = append(p, fmt.Sprintf("%d %s from %s in the capture, want %d (both sides send with -b)", got, strings.Join(ops, " or "), strings.TrimSpace(who), n))
						}
					}
					return p
				},
				rocev2dServer: server,
				minPkts:       2 * n,
			})
		}
	}
	return cs
}
