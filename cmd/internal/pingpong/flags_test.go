package pingpong

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/transport"
)

// TestFlags: the four commands parse their tools' flags (getopt_long
// style: short and long names, the server argument anywhere) into one
// config; each case names the kind it parses for.
func TestFlags(t *testing.T) {
	// base is a kind's defaults.
	base := func(k ppKind) pingpongConfig {
		c := pingpongConfig{port: 18515, ibPort: 1, size: 4096, mtu: transport.MTU1024, rxDepth: 500, iters: 1000, gidIdx: -1, qpTimeout: 14, kind: k}
		switch k {
		case ppUD:
			c.size = 1024 // ibv_ud_pingpong's default
		case ppSRQ:
			c.numQP = 16
		}
		return c
	}
	with := func(k ppKind, f func(c *pingpongConfig)) pingpongConfig {
		c := base(k)
		f(&c)
		return c
	}
	tests := []struct {
		kind    ppKind
		name    string
		args    []string
		want    pingpongConfig
		wantErr string
	}{
		{kind: ppRC, name: "defaults", want: base(ppRC)},
		{kind: ppRC, name: "ibv style, server first", args: []string{"192.0.2.2", "-d", "rxe0", "-g", "1", "-n", "5", "-s", "64", "-m", "2048", "-c", "-e"},
			want: with(ppRC, func(c *pingpongConfig) {
				c.dev, c.size, c.mtu, c.iters, c.gidIdx, c.chk, c.events, c.server = "rxe0", 64, transport.MTU2048, 5, 1, true, true, "192.0.2.2"
			})},
		{kind: ppRC, name: "long flags, server last", args: []string{"--port=2000", "--size", "100", "--rx-depth=8", "--iters=3", "--sl=2", "--bind", "127.0.0.2", "--timeout=5s", "127.0.0.1"},
			want: with(ppRC, func(c *pingpongConfig) {
				c.port, c.size, c.rxDepth, c.iters, c.sl, c.server, c.timeout = 2000, 100, 8, 3, 2, "127.0.0.1", 5*time.Second
			})},
		{kind: ppRC, name: "qp timeout", args: []string{"--qp-timeout", "18"}, want: with(ppRC, func(c *pingpongConfig) { c.qpTimeout = 18 })},
		{kind: ppRC, name: "bad qp timeout", args: []string{"--qp-timeout=32"}, wantErr: "--qp-timeout 32"},
		{kind: ppRC, name: "bad mtu", args: []string{"-m", "1500"}, wantErr: "-m 1500"},
		{kind: ppRC, name: "bad size", args: []string{"-s", "0"}, wantErr: "-s 0"},
		{kind: ppRC, name: "bad port", args: []string{"-p", "70000"}, wantErr: "-p 70000"},
		{kind: ppRC, name: "bad ib port", args: []string{"-i", "2"}, wantErr: "-i 2"},
		{kind: ppRC, name: "bad iters", args: []string{"-n", "-1"}, wantErr: "-n -1"},
		{kind: ppRC, name: "bad bind", args: []string{"--bind", "host"}, wantErr: "--bind"},
		{kind: ppRC, name: "two servers", args: []string{"a", "b"}, wantErr: `unexpected argument "b"`},
		{kind: ppRC, name: "server in brackets", args: []string{"[2001:db8::1]"}, want: with(ppRC, func(c *pingpongConfig) { c.server = "2001:db8::1" })},
		{kind: ppRC, name: "server with a port", args: []string{"127.0.0.1:18515"}, wantErr: `server "127.0.0.1:18515": give the address alone; -p sets the port`},
		{kind: ppUD, name: "link-local server without zone", args: []string{"fe80::1"}, wantErr: "server fe80::1: a link-local address needs its zone"},
		{kind: ppRC, name: "link-local bind without zone", args: []string{"--bind", "fe80::2"}, wantErr: "--bind fe80::2: a link-local address needs its zone"},
		{kind: ppRC, name: "unknown flag", args: []string{"-x"}, wantErr: "-x"},
		// RC, UC: no -o (ud-pingpong's and srq-pingpong's); none has -q but srq-pingpong.
		{kind: ppRC, name: "no -o", args: []string{"-o"}, wantErr: "-o"},
		{kind: ppRC, name: "no -q", args: []string{"-q", "2"}, wantErr: "-q"},

		{kind: ppUC, name: "defaults", want: base(ppUC)},
		{kind: ppUC, name: "ibv style", args: []string{"-d", "rxe0", "-g", "1", "-n", "5", "-s", "64", "-m", "2048", "-c", "-e", "-l", "3", "192.0.2.2"},
			want: with(ppUC, func(c *pingpongConfig) {
				c.dev, c.size, c.mtu, c.iters, c.sl, c.gidIdx, c.chk, c.events, c.server = "rxe0", 64, transport.MTU2048, 5, 3, 1, true, true, "192.0.2.2"
			})},
		{kind: ppUC, name: "long flags", args: []string{"--port=2000", "--size", "100", "--rx-depth=8", "--iters=3", "--mtu=4096"},
			want: with(ppUC, func(c *pingpongConfig) {
				c.port, c.size, c.rxDepth, c.iters, c.mtu = 2000, 100, 8, 3, transport.MTU4096
			})},
		{kind: ppUC, name: "bad mtu", args: []string{"-m", "1500"}, wantErr: "-m 1500"},
		{kind: ppUC, name: "bad size", args: []string{"-s", "0"}, wantErr: "-s 0"},
		// ibv_uc_pingpong's getopt string is "p:d:i:s:m:r:n:l:eg:c":
		// no -o (ud-pingpong's) and none of rc_pingpong's ODP/DM flags.
		{kind: ppUC, name: "no -o", args: []string{"-o"}, wantErr: "-o"},
		{kind: ppUC, name: "no -q", args: []string{"-q", "2"}, wantErr: "-q"},
		{kind: ppUC, name: "two servers", args: []string{"a", "b"}, wantErr: `unexpected argument "b"`},

		{kind: ppUD, name: "defaults", want: base(ppUD)},
		{kind: ppUD, name: "ibv style", args: []string{"-d", "rxe0", "-g", "1", "-n", "5", "-s", "512", "-c", "-e", "-o", "-l", "3", "192.0.2.2"},
			want: with(ppUD, func(c *pingpongConfig) {
				c.dev, c.size, c.iters, c.sl, c.gidIdx, c.chk, c.events, c.server = "rxe0", 512, 5, 3, 1, true, true, "192.0.2.2"
			})},
		{kind: ppUD, name: "port MTU", args: []string{"--mtu=4096", "--size=4096", "--odp", "--rx-depth", "8"},
			want: with(ppUD, func(c *pingpongConfig) { c.size, c.mtu, c.rxDepth = 4096, transport.MTU4096, 8 })},
		{kind: ppUD, name: "bad mtu", args: []string{"-m", "1500"}, wantErr: "-m 1500"},
		{kind: ppUD, name: "bad size", args: []string{"-s", "0"}, wantErr: "-s 0"},
		{kind: ppUD, name: "two servers", args: []string{"a", "b"}, wantErr: `unexpected argument "b"`},
		{kind: ppUD, name: "unknown flag", args: []string{"-P"}, wantErr: "-P"},
		{kind: ppUD, name: "no -q", args: []string{"-q", "2"}, wantErr: "-q"},

		{kind: ppSRQ, name: "defaults", want: base(ppSRQ)},
		{kind: ppSRQ, name: "ibv style", args: []string{"-d", "rxe0", "-g", "1", "-q", "4", "-n", "5", "-s", "512", "-c", "-e", "-o", "-l", "3", "-r", "8", "192.0.2.2"},
			want: with(ppSRQ, func(c *pingpongConfig) {
				c.dev, c.gidIdx, c.numQP, c.iters, c.size, c.chk, c.events, c.sl, c.rxDepth, c.server = "rxe0", 1, 4, 5, 512, true, true, 3, 8, "192.0.2.2"
			})},
		{kind: ppSRQ, name: "long names", args: []string{"192.0.2.2", "--num-qp=255", "--rx-depth", "300", "--mtu=4096", "--odp", "--port", "1234"},
			want: with(ppSRQ, func(c *pingpongConfig) {
				c.numQP, c.rxDepth, c.mtu, c.port, c.server = 255, 300, transport.MTU4096, 1234, "192.0.2.2"
			})},
		{kind: ppSRQ, name: "no QPs", args: []string{"-q", "0"}, wantErr: "-q 0"},
		{kind: ppSRQ, name: "bad mtu", args: []string{"-m", "1500"}, wantErr: "-m 1500"},
		{kind: ppSRQ, name: "bad size", args: []string{"-s", "0"}, wantErr: "-s 0"},
		{kind: ppSRQ, name: "two servers", args: []string{"a", "b"}, wantErr: `unexpected argument "b"`},
		{kind: ppSRQ, name: "unknown flag", args: []string{"-P"}, wantErr: "-P"},
	}
	for _, tc := range tests {
		t.Run(tc.kind.String()+"/"+tc.name, func(t *testing.T) {
			c, err := parsePPFlags(tc.args, tc.kind)
			if tc.wantErr != "" {
				if err == nil || !errors.Is(err, cli.ErrUsage) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want a usage error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want.server == "" && c.bind.IsValid() {
				t.Fatalf("bind = %v, want unset", c.bind)
			}
			c.bind = tc.want.bind
			if *c != tc.want {
				t.Fatalf("got  %+v\nwant %+v", *c, tc.want)
			}
		})
	}
}

// TestSocketOptions: the socket options a ping-pong's flags give its link:
// busy polling for 100 µs by default (the tools poll their CQ), none with
// -e; --gso and --busy-poll also after the server argument; without --gso
// the device decides (GSOAuto), --gso=false switches GSO off.
func TestSocketOptions(t *testing.T) {
	const us7 = 7 * time.Microsecond
	pp := func(args ...string) *pingpongConfig {
		c, err := parsePPFlags(args, ppRC)
		if err != nil {
			t.Fatalf("pingpong %q: %v", args, err)
		}
		if c.server != "" && c.server != "127.0.0.1" {
			t.Errorf("pingpong %q: server %q", args, c.server)
		}
		return c
	}
	ppPoll := func(args ...string) time.Duration {
		c := pp(args...)
		return c.sock.Options(!c.events, cli.DefaultBusyPoll).BusyPoll
	}
	for _, tc := range []struct {
		name      string
		got, want time.Duration
	}{
		{"pingpong", ppPoll(), cli.DefaultBusyPoll},
		{"pingpong -e", ppPoll("-e"), 0},
		{"pingpong --busy-poll=7us", ppPoll("--busy-poll=7us"), us7},
		{"pingpong --busy-poll=0", ppPoll("--busy-poll=0"), 0},
		{"pingpong -e --busy-poll=7us", ppPoll("-e", "--busy-poll=7us"), 0},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: BusyPoll %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	// The flags may follow the server address.
	if f := pp("--bind", "127.0.0.2", "127.0.0.1", "--gso", "--busy-poll=7us").sock; !f.GSO || f.BusyPoll != us7 {
		t.Errorf("pingpong SERVER --gso --busy-poll=7us: %+v", f)
	}
	if f := pp("-s", "64").sock; f.GSO || f.GSOSet {
		t.Errorf("pingpong without --gso: %+v", f)
	}
	if o := pp("-s", "64").sock.Options(false, 0); !o.GSOAuto || o.GSO {
		t.Errorf("pingpong without --gso: options %+v, want GSOAuto", o)
	}
	if o := pp("--gso=false").sock.Options(false, 0); o.GSOAuto || o.GSO {
		t.Errorf("pingpong --gso=false: options %+v, want neither GSO nor GSOAuto", o)
	}
}
