//go:build unix

package main

import (
	"os"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/clitest"
)

// TestMain holds the command packages' loopback lock (clitest.Main) while
// the tests run: they open UDP 4791 on 127.0.0.1 and 127.0.0.2.
func TestMain(m *testing.M) { os.Exit(clitest.Main(m)) }
