//go:build unix

package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// runIn runs the command in-process and returns its exit status and output.
func runIn(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestHelp(t *testing.T) {
	tests := []struct {
		args []string
		code int
		out  string // in stdout+stderr
	}{
		{nil, cli.ExitUsage, "usage: rocev2d"},
		{[]string{"help"}, cli.ExitOK, "pcap"},
		{[]string{"-h"}, cli.ExitOK, "commands:"},
		{[]string{"help", "pcap"}, cli.ExitOK, "write-sample"},
		{[]string{"help", "help"}, cli.ExitOK, "show this list"},
		{[]string{"help", "-h"}, cli.ExitOK, "commands:"},
		{[]string{"--help", "--help"}, cli.ExitOK, "commands:"},
		{[]string{"help", "nope"}, cli.ExitUsage, `unknown command "nope"`},
		{[]string{"nope"}, cli.ExitUsage, `unknown command "nope"`},
		{[]string{"pcap"}, cli.ExitUsage, "rocev2d pcap check"},
		{[]string{"pcap", "frobnicate"}, cli.ExitUsage, `unknown subcommand "frobnicate"`},
		{[]string{"pcap", "check"}, cli.ExitUsage, "no files given"},
		{[]string{"pcap", "check", "-bogus", "x"}, cli.ExitUsage, "flag provided but not defined"},
		{[]string{"pcap", "write-sample"}, cli.ExitUsage, "usage: rocev2d pcap write-sample FILE"},
	}
	for _, tt := range tests {
		code, out, errOut := runIn(t, tt.args...)
		if code != tt.code || !strings.Contains(out+errOut, tt.out) {
			t.Errorf("rocev2d %v: exit %d, want %d; output lacks %q:\n%s%s", tt.args, code, tt.code, tt.out, out, errOut)
		}
	}
}

// TestHelpHelp: help is in the list of commands, so `help help` prints
// that list (its usage) on stdout, as `help` does, rather than calling
// help an unknown command.
func TestHelpHelp(t *testing.T) {
	code, out, errOut := runIn(t, "help", "help")
	_, list, _ := runIn(t, "help")
	if code != cli.ExitOK || out != list || errOut != "" {
		t.Errorf("rocev2d help help: exit %d, want %d; stdout %q (want the list of `rocev2d help`), stderr %q", code, cli.ExitOK, out, errOut)
	}
}
