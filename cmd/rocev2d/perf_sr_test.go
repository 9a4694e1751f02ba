package main

import (
	"strings"
	"testing"
)

// TestPerfSelectiveRepeat: with --selective-repeat on both sides the test
// QPs run selective repeat, with -R through the CM's ECE exchange, and -v
// prints it on both ends; a side without the flag keeps go-back-N on both.
func TestPerfSelectiveRepeat(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two devices over loopback sockets")
	}
	for _, c := range []struct {
		name             string
		flags, cliExtra  []string
		srvWant, cliWant string
	}{
		{"manual", []string{"-n", "20", "-s", "8192", "--check", "-v", "--selective-repeat"}, nil,
			"QP 1 loss recovery: selective repeat (--selective-repeat", "QP 1 loss recovery: selective repeat (--selective-repeat"},
		{"rdma_cm", []string{"-n", "20", "-s", "8192", "--check", "-v", "-R", "--selective-repeat"}, nil,
			"QP 1 loss recovery: selective repeat (ECE sent vendor 0x5a5352 options 0x1 (selective repeat), received vendor 0x5a5352 options 0x1 (selective repeat))",
			"QP 1 loss recovery: selective repeat (ECE sent vendor 0x5a5352 options 0x1 (selective repeat), received vendor 0x5a5352 options 0x1 (selective repeat))"},
		{"rdma_cm client only", []string{"-n", "20", "-s", "8192", "--check", "-v", "-R"}, []string{"--selective-repeat"},
			"QP 1 loss recovery: go-back-N (ECE sent none, received vendor 0x5a5352 options 0x1 (selective repeat))",
			"QP 1 loss recovery: go-back-N (ECE sent vendor 0x5a5352 options 0x1 (selective repeat), received none)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv, cli := runPerfPairExtra(t, "write-bw", c.flags, c.cliExtra)
			if srv.code != 0 || cli.code != 0 {
				t.Fatalf("exit %d/%d\nserver:\n%s%s\nclient:\n%s%s", srv.code, cli.code, srv.out, srv.errOut, cli.out, cli.errOut)
			}
			if !strings.Contains(srv.out, c.srvWant) {
				t.Errorf("server output lacks %q:\n%s", c.srvWant, srv.out)
			}
			if !strings.Contains(cli.out, c.cliWant) {
				t.Errorf("client output lacks %q:\n%s", c.cliWant, cli.out)
			}
			if !strings.Contains(cli.out, "data check: ok") {
				t.Errorf("client output lacks the data check:\n%s", cli.out)
			}
		})
	}
}
