package nvmf

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
)

// Backend stores a namespace's blocks. ReadAt and WriteAt are called
// concurrently for different and overlapping ranges, always within
// [0, Size()).
type Backend interface {
	io.ReaderAt
	io.WriterAt
	// Size is the capacity in bytes.
	Size() int64
	// Flush makes completed writes durable.
	Flush() error
}

// MemBackend is a Backend in memory.
type MemBackend struct {
	mu  sync.RWMutex
	buf []byte
}

// NewMemBackend returns a zeroed in-memory backend of size bytes (1 byte
// to 1 TiB) on the Go heap. Go cannot recover from an allocation the host
// refuses: a size beyond the host's memory ends the process; a program
// that takes the size from its user maps the memory itself (mmap fails
// with an error) and hands it to MemBackendOn, as rocev2d nvmf-target does.
func NewMemBackend(size int64) (*MemBackend, error) {
	if size <= 0 || size > 1<<40 {
		return nil, fmt.Errorf("nvmf: memory backend of %d bytes: want 1 byte to 1 TiB", size)
	}
	return &MemBackend{buf: make([]byte, size)}, nil
}

// MemBackendOn returns an in-memory backend over buf, which it keeps: the
// caller must not use or free buf while the backend is in use.
func MemBackendOn(buf []byte) *MemBackend { return &MemBackend{buf: buf} }

// ReadAt implements io.ReaderAt.
func (m *MemBackend) ReadAt(p []byte, off int64) (int, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if off < 0 || off > int64(len(m.buf)) {
		return 0, io.EOF
	}
	n := copy(p, m.buf[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// WriteAt implements io.WriterAt.
func (m *MemBackend) WriteAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if off < 0 || off+int64(len(p)) > int64(len(m.buf)) {
		return 0, errors.New("nvmf: write past the end of the memory backend")
	}
	return copy(m.buf[off:], p), nil
}

// Size returns the capacity.
func (m *MemBackend) Size() int64 { return int64(len(m.buf)) }

// Flush does nothing: memory is as durable as it gets.
func (m *MemBackend) Flush() error { return nil }

// FileBackend is a Backend on a regular file or a block device.
type FileBackend struct {
	f    *os.File
	size atomic.Int64 // the last size read
}

// OpenFile opens path (a regular file or a block device) as a backend,
// read-only if ro. A regular file that does not exist is created with
// size bytes (size 0: the file must exist); a regular file smaller than
// size is extended.
func OpenFile(path string, size int64, ro bool) (*FileBackend, error) {
	flag := os.O_RDWR
	if ro {
		flag = os.O_RDONLY
	} else if size > 0 {
		flag |= os.O_CREATE
	}
	f, err := os.OpenFile(path, flag, 0o644)
	if err != nil {
		return nil, fmt.Errorf("nvmf: %w", err)
	}
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("nvmf: %s: %w", path, err)
	}
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() && end < size && !ro {
		if err := f.Truncate(size); err != nil {
			f.Close()
			return nil, fmt.Errorf("nvmf: %w", err)
		}
		end = size
	}
	if end <= 0 {
		f.Close()
		return nil, fmt.Errorf("nvmf: %s is empty (give a size)", path)
	}
	b := &FileBackend{f: f}
	b.size.Store(end)
	return b, nil
}

// ReadAt implements io.ReaderAt.
func (b *FileBackend) ReadAt(p []byte, off int64) (int, error) { return b.f.ReadAt(p, off) }

// WriteAt implements io.WriterAt.
func (b *FileBackend) WriteAt(p []byte, off int64) (int, error) { return b.f.WriteAt(p, off) }

// Size returns the capacity: the file's or device's size now (it reads
// it at every call: a file that grew, or a device resized, shows its new
// size, which Target.RevalidateNamespace hands to the hosts). When the
// size cannot be read, the last one read.
func (b *FileBackend) Size() int64 {
	if end, err := b.f.Seek(0, io.SeekEnd); err == nil {
		b.size.Store(end)
		return end
	}
	return b.size.Load()
}

// Flush syncs the file.
func (b *FileBackend) Flush() error { return b.f.Sync() }

// Close closes the file.
func (b *FileBackend) Close() error { return b.f.Close() }
