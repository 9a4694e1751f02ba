package oob

import (
	"bytes"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gorocev2/rocev2/test/goldendir"
)

// segment is one TCP payload of a golden out-of-band exchange.
type segment struct {
	frame      int
	fromClient bool
	data       []byte
}

type golden struct {
	name string
	text string
	segs []segment
}

var (
	tcpHeaderRE = regexp.MustCompile(`^\s+(\d+) (\S+):(\d+) > (\S+):(\d+) \[(\w+)\](?: len=(\d+))?\s*$`)
	hexLineRE   = regexp.MustCompile(`^\s+hex:\s+([0-9a-f]+)\s*$`)
)

// loadGolden reads NAME.txt and decodes its "## out-of-band TCP exchange"
// section: "[..] len=N" headers followed by "hex:" lines.
func loadGolden(t testing.TB, name string) golden {
	t.Helper()
	dir := goldendir.Require(t)
	raw, err := os.ReadFile(filepath.Join(dir, name+".txt"))
	if err != nil {
		t.Fatalf("golden %s: %v", name, err)
	}
	g := golden{name: name, text: string(raw)}
	_, sect, ok := strings.Cut(g.text, "## out-of-band TCP exchange")
	if !ok {
		t.Fatalf("golden %s: no out-of-band section", name)
	}
	var cur *segment
	wantLen := 0
	for _, line := range strings.Split(sect, "\n") {
		if strings.HasPrefix(line, "## ") {
			break
		}
		if m := tcpHeaderRE.FindStringSubmatch(line); m != nil {
			cur = nil
			if m[7] == "" {
				continue
			}
			frame, _ := strconv.Atoi(m[1])
			wantLen, _ = strconv.Atoi(m[7])
			g.segs = append(g.segs, segment{frame: frame, fromClient: m[5] == strconv.Itoa(DefaultPort)})
			cur = &g.segs[len(g.segs)-1]
			continue
		}
		if m := hexLineRE.FindStringSubmatch(line); m != nil && cur != nil {
			b, err := hex.DecodeString(m[1])
			if err != nil {
				t.Fatalf("golden %s frame %d: %v", name, cur.frame, err)
			}
			if len(b) != wantLen {
				t.Fatalf("golden %s frame %d: hex has %d bytes, header says %d", name, cur.frame, len(b), wantLen)
			}
			cur.data = b
			cur = nil
		}
	}
	if len(g.segs) == 0 {
		t.Fatalf("golden %s: no TCP payloads found", name)
	}
	for _, s := range g.segs {
		if s.data == nil {
			t.Fatalf("golden %s frame %d: payload without hex line", name, s.frame)
		}
	}
	return g
}

// dir returns the payloads one side wrote, in order.
func (g golden) dir(fromClient bool) []segment {
	var out []segment
	for _, s := range g.segs {
		if s.fromClient == fromClient {
			out = append(out, s)
		}
	}
	return out
}

// stream returns the concatenated bytes one side wrote.
func (g golden) stream(fromClient bool) []byte {
	var b []byte
	for _, s := range g.dir(fromClient) {
		b = append(b, s.data...)
	}
	return b
}

// section returns the text of "## NAME" up to the next "## ".
func (g golden) section(name string) string {
	_, rest, ok := strings.Cut(g.text, "## "+name+"\n")
	if !ok {
		return ""
	}
	if i := strings.Index(rest, "\n## "); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

// recConn records everything written to a net.Conn.
type recConn struct {
	net.Conn
	mu  sync.Mutex
	buf bytes.Buffer
	n   []int // sizes of the individual Write calls
}

func (c *recConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.mu.Lock()
	c.buf.Write(b[:n])
	c.n = append(c.n, n)
	c.mu.Unlock()
	return n, err
}

func (c *recConn) bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.buf.Bytes())
}

func (c *recConn) writes() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.n...)
}

// loopback returns a connected TCP pair on 127.0.0.1 (ephemeral port).
func loopback(t testing.TB) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		client.Close()
		t.Fatal(r.err)
	}
	t.Cleanup(func() { client.Close(); r.c.Close() })
	return client, r.c
}

func mustHex(t testing.TB, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		t.Fatalf("hex %q: %v", s, err)
	}
	return v
}

func ipGID(t testing.TB, s string) [16]byte {
	t.Helper()
	ip := net.ParseIP(s)
	if ip == nil {
		t.Fatalf("bad GID %q", s)
	}
	var g [16]byte
	copy(g[:], ip.To16())
	return g
}
