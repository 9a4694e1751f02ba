//go:build linux

package interop

import (
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
)

// File modes of initramfs entries (S_IF* bits of stat(2)).
const (
	modeDir  = 0o040000
	modeReg  = 0o100000
	modeLink = 0o120000
	modeChr  = 0o020000
)

// cpioEntry is one file of an initramfs.
type cpioEntry struct {
	mode       uint32 // type and permission bits
	data       []byte // file contents or symlink target
	rmaj, rmin uint32 // device numbers of a character device
}

// Archive is an initramfs under construction: a set of paths (relative, no
// leading slash) written as a "newc" cpio archive, parents before children.
type Archive struct {
	entries map[string]*cpioEntry
}

// NewArchive returns an empty archive.
func NewArchive() *Archive { return &Archive{entries: map[string]*cpioEntry{}} }

func cleanPath(p string) string { return strings.TrimPrefix(path.Clean("/"+p), "/") }

// mkdirs adds p's parent directories.
func (a *Archive) mkdirs(p string) {
	for d := path.Dir(p); d != "." && d != "/" && d != ""; d = path.Dir(d) {
		if _, ok := a.entries[d]; !ok {
			a.entries[d] = &cpioEntry{mode: modeDir | 0o755}
		}
	}
}

// Dir adds a directory.
func (a *Archive) Dir(p string, perm uint32) {
	p = cleanPath(p)
	a.mkdirs(p)
	a.entries[p] = &cpioEntry{mode: modeDir | perm&0o7777}
}

// File adds (or replaces) a regular file.
func (a *Archive) File(p string, perm uint32, data []byte) {
	p = cleanPath(p)
	a.mkdirs(p)
	a.entries[p] = &cpioEntry{mode: modeReg | perm&0o7777, data: data}
}

// Symlink adds a symbolic link unless p already exists.
func (a *Archive) Symlink(p, target string) {
	p = cleanPath(p)
	if _, ok := a.entries[p]; ok {
		return
	}
	a.mkdirs(p)
	a.entries[p] = &cpioEntry{mode: modeLink | 0o777, data: []byte(target)}
}

// CharDev adds a character device node.
func (a *Archive) CharDev(p string, perm, major, minor uint32) {
	p = cleanPath(p)
	a.mkdirs(p)
	a.entries[p] = &cpioEntry{mode: modeChr | perm&0o7777, rmaj: major, rmin: minor}
}

// Has reports whether p is in the archive.
func (a *Archive) Has(p string) bool { _, ok := a.entries[cleanPath(p)]; return ok }

// Len returns the number of entries.
func (a *Archive) Len() int { return len(a.entries) }

// WriteTo writes the archive in cpio "newc" format (what the kernel's
// initramfs unpacker reads), sorted so every directory precedes its contents.
func (a *Archive) WriteTo(w io.Writer) (int64, error) {
	names := make([]string, 0, len(a.entries))
	for n := range a.entries {
		names = append(names, n)
	}
	sort.Strings(names)
	cw := &countWriter{w: w}
	for i, n := range names {
		e := a.entries[n]
		nlink := uint32(1)
		if e.mode&0o170000 == modeDir {
			nlink = 2
		}
		if err := writeCPIOHeader(cw, uint32(i+1), e.mode, nlink, uint32(len(e.data)), e.rmaj, e.rmin, n); err != nil {
			return cw.n, err
		}
		if _, err := cw.Write(e.data); err != nil {
			return cw.n, err
		}
		if err := cw.pad4(); err != nil {
			return cw.n, err
		}
	}
	if err := writeCPIOHeader(cw, 0, 0, 1, 0, 0, 0, "TRAILER!!!"); err != nil {
		return cw.n, err
	}
	return cw.n, nil
}

// writeCPIOHeader writes a 110-byte newc header, the NUL-terminated name and
// the padding to a 4-byte boundary.
func writeCPIOHeader(cw *countWriter, ino, mode, nlink, size, rmaj, rmin uint32, name string) error {
	// magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor, devminor,
	// rdevmajor, rdevminor, namesize, check
	h := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		ino, mode, 0, 0, nlink, 0, size, 0, 0, rmaj, rmin, len(name)+1, 0)
	if _, err := io.WriteString(cw, h+name+"\x00"); err != nil {
		return err
	}
	return cw.pad4()
}

// countWriter counts bytes written so it can pad to 4-byte boundaries.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func (c *countWriter) pad4() error {
	if r := c.n & 3; r != 0 {
		_, err := c.Write(make([]byte, 4-r))
		return err
	}
	return nil
}
