package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
)

const shareUsage = `usage: rocev2d share status ADDR

Lists the processes sharing ADDR's UDP port 4791 (see --share of the
commands that open a socket): each member's slot, PID and state (live,
dead, or in TimeWait after it left), the packets the steering program
handed to it, its QPN ranges and the rdma_cm ports it listens on; then the
packets dropped because nobody owns them.
`

func init() {
	register("share", "show the processes sharing an address's UDP port 4791", shareUsage, runShare)
}

func runShare(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) != 2 || args[0] != "status" {
		fmt.Fprint(stderr, shareUsage)
		return exitUsage
	}
	addr, err := netip.ParseAddr(args[1])
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d share: %v\n", err)
		return exitUsage
	}
	if err := shareStatus(addr.Unmap(), stdout); err != nil {
		fmt.Fprintf(stderr, "rocev2d share status: %v\n", err)
		return exitFail
	}
	return exitOK
}
