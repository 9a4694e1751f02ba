package pcaptap

import (
	"bytes"
	"fmt"
	"os"

	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
)

// Create creates (or truncates) the file path and returns a Writer that
// records into it with snap length snapLen (see NewWriterSnap); Close
// closes the file.
//
// On Linux the file is written with direct I/O (O_DIRECT) where its file
// system takes it (ext4, xfs, tmpfs, …; Direct reports it): the full
// buffers go from memory to the device without being copied into the page
// cache. That copy was the largest cost of a whole-packet capture (45 % of
// a captured write-bw client's CPU, docs/CAPTURE.md), and a page cache
// filling faster than the disk drains it stalls the writer. Elsewhere, and
// where the file system refuses direct I/O, the file is written as any
// other.
func Create(path string, snapLen int) (*Writer, error) {
	snap, err := checkSnap(snapLen)
	if err != nil {
		return nil, err
	}
	f, direct, err := createFile(path)
	if err != nil {
		return nil, err
	}
	if !direct {
		w, err := NewWriterSnap(f, snapLen)
		if err != nil {
			f.Close()
			return nil, err
		}
		return w, nil
	}
	var hdr bytes.Buffer
	if err := pcapgo.NewWriter(&hdr).WriteFileHeader(uint32(snap), layers.LinkTypeEthernet); err != nil {
		f.Close()
		return nil, err
	}
	w := newWriter(&directOut{f: f}, f, snap, directAlign)
	w.cur = append(w.cur, hdr.Bytes()...)
	if err := w.Flush(); err != nil {
		w.Close()
		return nil, fmt.Errorf("pcaptap: %s: %w", path, err)
	}
	return w, nil
}

// Direct reports whether the Writer writes its file with direct I/O
// (Create on Linux, where the file system takes it).
func (w *Writer) Direct() bool { return w.align != 0 }

// directAlign is the block size of direct I/O: the file offset, the length
// and the memory address of every write are multiples of it. 4096 covers
// every logical block size up to a page.
const directAlign = 4096

// directOut writes chunks to a file opened for direct I/O, each at its
// offset; a padded chunk is followed by cutting the file to the records'
// end. If the file system refuses a direct write (EINVAL: an alignment it
// does not take), the file is switched to buffered writes and the write
// is made again.
type directOut struct {
	f        *os.File
	buffered bool
}

func (d *directOut) writeChunk(c chunk) error {
	if _, err := d.f.WriteAt(c.b, c.off); err != nil {
		if d.buffered || !isEINVAL(err) {
			return err
		}
		if err := clearDirect(d.f); err != nil {
			return err
		}
		d.buffered = true
		if _, err := d.f.WriteAt(c.b, c.off); err != nil {
			return err
		}
	}
	if c.off+int64(len(c.b)) > c.end {
		return d.f.Truncate(c.end)
	}
	return nil
}
