//go:build unix

package main

import (
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// deviceCommands are the commands that create a device: each takes the
// congestion control options.
var deviceCommands = []string{"demo", "bench", "pingpong", "uc-pingpong", "ud-pingpong", "srq-pingpong",
	"write-bw", "read-lat", "rping", "rdma-server", "rdma-client", "udaddy", "congestion"}

func TestCCFlagsInUsage(t *testing.T) {
	for _, name := range deviceCommands {
		code, out, errOut := runIn(t, "help", name)
		if code != cli.ExitOK {
			t.Errorf("help %s: exit %d %s", name, code, errOut)
			continue
		}
		for _, f := range []string{"--ecn=MODE", "--cnp-interval=DUR", "--dcqcn=on|off", "--dcqcn-param="} {
			if !strings.Contains(out, f) {
				t.Errorf("help %s lacks %s", name, f)
			}
		}
	}
}
