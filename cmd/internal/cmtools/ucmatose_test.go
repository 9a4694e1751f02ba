package cmtools

import (
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// TestUcmatoseServerAckTimeout: -a sets the QPs' local ACK timeout on
// both sides, and on a server it overrides the REQ's (rdmacm
// Options.OwnACKTimeout), as rdma-core 44's cmatose calls rdma_set_option
// (RDMA_OPTION_ID_ACK_TIMEOUT) on each request's ID in connect_handler.
// Before, a server's -a was parsed and then replaced by the client's
// timeout from the REQ.
func TestUcmatoseServerAckTimeout(t *testing.T) {
	for _, tc := range []struct {
		args []string
		own  bool
		want uint8
	}{{[]string{"-b", "192.0.2.1", "-a", "20"}, true, 20}, {[]string{"-s", "192.0.2.1", "-a", "19"}, true, 19}, {[]string{"-b", "192.0.2.1"}, false, 14}} {
		c, err := parseUcmatoseFlags(tc.args)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		o := (&ucmatose{c: c, e: &cli.Endpoint{}}).options() // options reads only the PD of the endpoint
		if o.OwnACKTimeout != tc.own || o.Retry == nil || o.Retry.Timeout != tc.want {
			t.Errorf("%q: OwnACKTimeout %v, Retry %+v; want %v, timeout %d", tc.args, o.OwnACKTimeout, o.Retry, tc.own, tc.want)
		}
	}
}
