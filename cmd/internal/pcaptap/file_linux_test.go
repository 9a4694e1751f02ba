package pcaptap

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestCreateDirect records the same packets through Create (a file, with
// direct I/O where the file system takes it) and through NewWriterSnap
// (a bytes.Buffer), whole and headers-only, with Flushes at random points
// and more than Buffers×BufferSize bytes in all: after every Flush and
// after Close the file holds exactly the bytes the stream writer wrote
// (direct I/O writes whole padded blocks and cuts the file back to the
// records' end), and as many records as the writer counted. Where this
// test can open a file with O_DIRECT itself, Create must use it.
func TestCreateDirect(t *testing.T) {
	dirs := []string{t.TempDir()}
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "pcaptap")
		if err == nil {
			defer os.RemoveAll(d)
			dirs = append(dirs, d)
		}
	}
	src, dst := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	clock := time.Unix(1700000000, 123456000)
	for _, dir := range dirs {
		for _, snap := range []int{0, 128} {
			path := filepath.Join(dir, "c.pcap")
			w, err := Create(path, snap)
			if err != nil {
				t.Fatal(err)
			}
			if probeDirect(dir) && !w.Direct() {
				t.Errorf("%s: O_DIRECT works there, the writer does not use it", dir)
			}
			var ref bytes.Buffer
			rw, err := NewWriterSnap(&ref, snap)
			if err != nil {
				t.Fatal(err)
			}
			w.now = func() time.Time { return clock }
			rw.now = w.now
			check := func(when string) {
				got, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, ref.Bytes()) {
					t.Fatalf("%s snap %d, %s: file %d bytes, want %d (the same as a stream's)", dir, snap, when, len(got), ref.Len())
				}
			}
			check("after Create")
			rnd := rand.New(rand.NewPCG(1, uint64(snap)))
			total := 0
			for i := 0; total < (Buffers+2)*BufferSize; i++ {
				p := build(t, rnd.IntN(4096)+1, uint32(i))
				for _, x := range []*Writer{w, rw} {
					if err := x.WritePacket(src, dst, 0xc000, 0, p); err != nil {
						t.Fatal(err)
					}
				}
				total += 16 + ethSize + ipv4Size + udpSize + len(p)
				if rnd.IntN(300) == 0 {
					if err := w.Flush(); err != nil {
						t.Fatal(err)
					}
					rw.Flush()
					check("after a Flush")
				}
			}
			n := w.Packets()
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			rw.Close()
			check("after Close")
			got, _ := os.ReadFile(path)
			if recs := countRecords(t, got); uint64(recs) != n || n != rw.Packets() {
				t.Errorf("%d records, writer counted %d", recs, n)
			}
			t.Logf("%s snap %d: direct %v, %d packets, %d bytes", dir, snap, w.Direct(), n, len(got))
		}
	}
}

// probeDirect reports whether a file in dir can be opened with O_DIRECT.
func probeDirect(dir string) bool {
	f, err := os.OpenFile(filepath.Join(dir, "probe"), os.O_WRONLY|os.O_CREATE|unix.O_DIRECT, 0o644)
	if err != nil {
		return false
	}
	f.Close()
	os.Remove(filepath.Join(dir, "probe"))
	return true
}

// TestDirectFallback: a direct write the file system refuses (EINVAL, here
// from a misaligned buffer) switches the file to buffered writes and is
// made again.
func TestDirectFallback(t *testing.T) {
	dir := t.TempDir()
	if !probeDirect(dir) {
		t.Skipf("SKIPPED LOUDLY: %s takes no O_DIRECT", dir)
	}
	f, direct, err := createFile(filepath.Join(dir, "f"))
	if err != nil || !direct {
		t.Fatal(err, direct)
	}
	defer f.Close()
	buf := alignedBuffer(directAlign)[:directAlign+1]
	for i := range buf {
		buf[i] = byte(i)
	}
	d := &directOut{f: f}
	if _, err := f.WriteAt(buf[1:], 0); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("misaligned direct write: %v, want EINVAL", err)
	}
	if err := d.writeChunk(chunk{b: buf[1:], off: 0, end: directAlign - 100}); err != nil || !d.buffered {
		t.Fatalf("writeChunk: %v, buffered %v", err, d.buffered)
	}
	got, _ := os.ReadFile(f.Name())
	if !bytes.Equal(got, buf[1:directAlign-99]) {
		t.Errorf("file %d bytes, want the chunk cut at its end (%d)", len(got), directAlign-100)
	}
}

// TestCreateFIFO: Create on a named pipe (as --pcap /dev/stdout into a
// pipe) writes a stream, not direct I/O at offsets: the reader gets a
// whole pcap file.
func TestCreateFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 1)
	go func() {
		b, _ := os.ReadFile(path)
		got <- b
	}()
	const n = 3000 // more than one buffer
	pkt := build(t, 1000, 1)
	wrote := make(chan error, 1)
	go func() {
		w, err := Create(path, 0)
		if err != nil {
			wrote <- err
			return
		}
		if w.Direct() {
			t.Error("direct I/O on a pipe")
		}
		src, dst := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
		for range n {
			if err := w.WritePacket(src, dst, 0xc000, 0, pkt); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- w.Close()
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the writer is stuck (its reader saw the end of the file early?)")
	}
	select {
	case b := <-got:
		if recs := countRecords(t, b); recs != n {
			t.Errorf("reader got %d records, want %d", recs, n)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the reader got no end of file")
	}
}
