package sharecmd

import (
	"context"
	"fmt"
	"io"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

const shareUsage = `usage: rocev2d share status ADDR
       rocev2d share remove ADDR

Lists the processes sharing ADDR's UDP port 4791 (see --share of the
commands that open a socket): each member's slot, PID and state (live,
dead, or in TimeWait after it left), the packets the steering program
handed to it, its QPN ranges and the rdma_cm ports it listens on; then the
packets dropped because nobody owns them.

remove unpins the group of ADDR (its program and maps in bpffs) when none
of its members is alive — what the members of a group that will not be
used again leave behind (the state of departed members is kept for their
TimeWait, and pinned so that it outlives them).
`

func init() {
	commands.Register("share", "show the processes sharing an address's UDP port 4791", shareUsage, runShare)
}

func runShare(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var why string
	switch {
	case len(args) == 0:
		why = "missing subcommand (status or remove)"
	case args[0] != "status" && args[0] != "remove":
		why = fmt.Sprintf("unknown subcommand %q", args[0])
	case len(args) == 1:
		why = "missing ADDR"
	case len(args) > 2:
		why = fmt.Sprintf("unexpected argument %q after ADDR", args[2])
	}
	if why != "" {
		fmt.Fprintf(stderr, "rocev2d share: %s\n%s", why, shareUsage)
		return cli.ExitUsage
	}
	addr, err := cli.ParseIP("ADDR", args[1], "")
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d share: %v\n", err)
		return cli.ExitUsage
	}
	if args[0] == "remove" {
		if err := shareRemove(addr.Unmap(), stdout); err != nil {
			fmt.Fprintf(stderr, "rocev2d share remove: %v\n", err)
			return cli.ExitFail
		}
		return cli.ExitOK
	}
	if err := shareStatus(addr.Unmap(), stdout); err != nil {
		fmt.Fprintf(stderr, "rocev2d share status: %v\n", err)
		return cli.ExitFail
	}
	return cli.ExitOK
}
