package cmtools

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// flagOutcome is what rdma-server/rdma-client, udaddy, cmtime and
// ucmatose do with their flags' parse error: -h prints usage (exit 0), a
// bad flag names the command and points at its help (exit 1, the real
// tools' usage exit). done reports that the command ends with code.
func flagOutcome(name, usage string, err error, stdout, stderr io.Writer) (code int, done bool) {
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, usage)
		return cli.ExitOK, true
	case err != nil:
		fmt.Fprintf(stderr, "rocev2d %s: %v\n(see `rocev2d help %s`)\n", name, err, name)
		return 1, true
	}
	return 0, false
}

// runTimeout bounds ctx by a command's --timeout d (none when d is 0),
// with a cause that names the flag.
func runTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeoutCause(ctx, d, fmt.Errorf("timed out after %v (--timeout)", d))
}

// bindFor is the local address of udaddy, cmtime and ucmatose: --bind, else
// the tools' -b. A server needs one: rocev2d listens on one address, not
// on every one.
func bindFor(bind, bindB string, server bool) (netip.Addr, error) {
	if bind == "" {
		bind = bindB
	}
	a, err := cli.ParseBind(bind)
	if err != nil {
		return netip.Addr{}, err
	}
	if server && !a.IsValid() {
		return netip.Addr{}, errors.New("the server needs -b addr or --bind=IP: rocev2d listens on one address, not on every one")
	}
	return a, nil
}
