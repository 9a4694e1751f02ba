//go:build unix

package cli_test

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/udp"
)

func TestSocketFlags(t *testing.T) {
	tests := []struct {
		args []string
		want cli.SocketFlags
		rest []string
		err  bool
	}{
		{args: []string{}, rest: []string{}},
		{args: []string{"-v"}, want: cli.SocketFlags{}, rest: []string{}},
		{args: []string{"--gso"}, want: cli.SocketFlags{GSO: true, GSOSet: true}, rest: []string{}},
		{args: []string{"-v", "-gso", "x"}, want: cli.SocketFlags{GSO: true, GSOSet: true}, rest: []string{"x"}},
		{args: []string{"--gso=false", "-v"}, want: cli.SocketFlags{GSOSet: true}, rest: []string{}},
		{args: []string{"--gso=true"}, want: cli.SocketFlags{GSO: true, GSOSet: true}, rest: []string{}},
		{args: []string{"--gso=maybe"}, err: true},
		{args: []string{"--", "--gso"}, rest: []string{"--gso"}},
		{args: []string{"--gsox"}, err: true},
		{args: []string{"--busy-poll=100us", "-v"}, want: cli.SocketFlags{BusyPoll: 100 * time.Microsecond, BusyPollSet: true}, rest: []string{}},
		{args: []string{"-v", "-busy-poll", "2ms"}, want: cli.SocketFlags{BusyPoll: 2 * time.Millisecond, BusyPollSet: true}, rest: []string{}},
		{args: []string{"--busy-poll=0"}, want: cli.SocketFlags{BusyPollSet: true}, rest: []string{}},
		{args: []string{"--busy-poll"}, err: true},
		{args: []string{"--busy-poll=fast"}, err: true},
		{args: []string{"--busy-poll=-1us"}, err: true},
		{args: []string{"--busy-poll=2s"}, err: true},
		{args: []string{"--share"}, want: cli.SocketFlags{Share: udp.ShareOn}, rest: []string{}},
		{args: []string{"--share=false", "x"}, want: cli.SocketFlags{Share: udp.ShareOff}, rest: []string{"x"}},
		{args: []string{"--share=true"}, want: cli.SocketFlags{Share: udp.ShareOn}, rest: []string{}},
		{args: []string{"--share=sometimes"}, err: true},
	}
	for _, tc := range tests {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.Bool("v", false, "")
		var got cli.SocketFlags
		cli.AddSocketFlags(fs, &got)
		err := fs.Parse(tc.args)
		if !tc.err && got.Options(false, 0).Share != tc.want.Share {
			t.Errorf("%q: options().Share = %v, want %v", tc.args, got.Options(false, 0).Share, tc.want.Share)
		}
		if (err != nil) != tc.err || (!tc.err && (got != tc.want || strings.Join(fs.Args(), " ") != strings.Join(tc.rest, " "))) {
			t.Errorf("%q: %+v, rest %q, error %v; want %+v, rest %q, error %v", tc.args, got, fs.Args(), err, tc.want, tc.rest, tc.err)
		}
	}
}
