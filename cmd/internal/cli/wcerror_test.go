package cli

import (
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/transport"
)

// TestWCError: a flushed completion is not blamed on the peer or the path
// (the QP was out of service already: the peer disconnected or died, or
// an earlier request failed); any other failed status is.
func TestWCError(t *testing.T) {
	for _, c := range []struct {
		st   transport.WCStatus
		want string
	}{
		{transport.WCWRFlushErr, "the QP had left service before it ran: the peer disconnected or died"},
		{transport.WCRetryExcErr, "the peer or the path failed the operation"},
		{transport.WCRemAccessErr, "the peer or the path failed the operation"},
	} {
		err := WCError(transport.WC{Status: c.st, WRID: 7, Opcode: transport.WCRecv}, "receive")
		if !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "receive completion with error: ") {
			t.Errorf("%v: %q, want %q", c.st, err, c.want)
		}
	}
}
