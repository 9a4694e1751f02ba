//go:build linux

package interop

import (
	"strings"
	"testing"
)

func TestShareSections(t *testing.T) {
	cmd := shareClients("x", 1, 4096, 50, 0, 200)
	if !strings.Contains(cmd, "rping -c -a 192.0.2.1") || !strings.Contains(cmd, "ibv_rc_pingpong -d rxe0 -g 1 -p 18516") || strings.Contains(cmd, "ib_write_bw") || !strings.Contains(cmd, "/tmp/share-x-1.out") {
		t.Errorf("command %q", cmd)
	}
	out := "=== rping exit 0\nping data: a\n=== ibv_rc_pingpong exit 1\nFailed status\n"
	s := shareSections(out)
	if len(s) != 2 || s["rping"].exit != 0 || s["rping"].out != "\nping data: a\n" || s["ibv_rc_pingpong"].exit != 1 || !strings.Contains(s["ibv_rc_pingpong"].out, "Failed") {
		t.Errorf("sections %+v", s)
	}
}
