package cmtools

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/gorocev2/rocev2/nvmf"
)

// nsListEntry is one line of an --ns-list file: a namespace ID and the
// file or block device that backs it.
type nsListEntry struct {
	nsid uint32
	path string
}

// readNSList parses an --ns-list file: one "NSID PATH" per line (NSID
// 2..; namespace 1 is --file or --size), blank lines and # comments
// skipped. An NSID twice, or a bad one, is an error naming the line.
func readNSList(name string) ([]nsListEntry, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []nsListEntry
	seen := map[uint32]bool{}
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		id, path, ok := strings.Cut(l, " ")
		path = strings.TrimSpace(path)
		n, err := strconv.ParseUint(id, 10, 32)
		switch {
		case !ok || path == "":
			return nil, fmt.Errorf("%s:%d: want \"NSID PATH\"", name, line)
		case err != nil || n < 2 || n == 0xffffffff:
			return nil, fmt.Errorf("%s:%d: NSID %q: want 2..4294967294 (1 is --file/--size)", name, line, id)
		case seen[uint32(n)]:
			return nil, fmt.Errorf("%s:%d: NSID %d listed twice", name, line, n)
		}
		seen[uint32(n)] = true
		out = append(out, nsListEntry{nsid: uint32(n), path: path})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// nsListState is what nvmf-target serves of its --ns-list: each listed
// NSID's path and open backend.
type nsListState struct {
	list      string
	nqn       string
	blockSize int
	ro        bool
	open      map[uint32]nsListOpen
}

type nsListOpen struct {
	path string
	fb   *nvmf.FileBackend
}

// namespace opens e's file as a namespace, its NGUID derived from the
// NQN and the file's identity (as --file's).
func (s *nsListState) namespace(e nsListEntry) (*nvmf.Namespace, *nvmf.FileBackend, error) {
	id, err := fileIdentity(e.path)
	if err != nil {
		return nil, nil, err
	}
	fb, err := nvmf.OpenFile(e.path, 0, s.ro)
	if err != nil {
		return nil, nil, err
	}
	h := sha256.Sum256([]byte(s.nqn + "\x00" + id))
	return &nvmf.Namespace{ID: e.nsid, Backend: fb, BlockSize: s.blockSize, ReadOnly: s.ro, NGUID: [16]byte(h[:16])}, fb, nil
}

// initial opens every namespace of the list for TargetConfig.
func (s *nsListState) initial() ([]*nvmf.Namespace, error) {
	es, err := readNSList(s.list)
	if err != nil {
		return nil, err
	}
	s.open = map[uint32]nsListOpen{}
	var nss []*nvmf.Namespace
	for _, e := range es {
		ns, fb, err := s.namespace(e)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("namespace %d: %s: %w", e.nsid, e.path, err)
		}
		s.open[e.nsid] = nsListOpen{e.path, fb}
		nss = append(nss, ns)
	}
	return nss, nil
}

// reload reads the list again (SIGHUP): namespaces no longer listed (or
// listed with another path) are removed, new ones added, the others'
// sizes revalidated; each change is printed to w. A list that cannot be
// read changes nothing; a namespace that cannot be opened is skipped.
func (s *nsListState) reload(t *nvmf.Target, w, errw io.Writer) {
	es, err := readNSList(s.list)
	if err != nil {
		fmt.Fprintf(errw, "rocev2d nvmf-target: SIGHUP: --ns-list: %v; namespaces unchanged\n", err)
		return
	}
	want := map[uint32]string{}
	for _, e := range es {
		want[e.nsid] = e.path
	}
	ids := make([]uint32, 0, len(s.open))
	for id := range s.open {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		o := s.open[id]
		if p, ok := want[id]; ok && p == o.path {
			changed, err := t.RevalidateNamespace(s.nqn, id)
			switch {
			case err != nil:
				fmt.Fprintf(errw, "rocev2d nvmf-target: SIGHUP: namespace %d: %v\n", id, err)
			case changed:
				fmt.Fprintf(w, "nvmf-target: namespace %d resized: %d bytes; hosts notified\n", id, o.fb.Size()/int64(s.blockSize)*int64(s.blockSize))
			}
			continue
		}
		if _, err := t.RemoveNamespace(s.nqn, id); err != nil {
			fmt.Fprintf(errw, "rocev2d nvmf-target: SIGHUP: namespace %d: %v\n", id, err)
			continue
		}
		// RemoveNamespace returned once the commands running on it had
		// finished: nothing uses the file any more.
		o.fb.Close()
		delete(s.open, id)
		fmt.Fprintf(w, "nvmf-target: namespace %d (%s) removed; hosts notified\n", id, o.path)
	}
	for _, e := range es {
		if _, ok := s.open[e.nsid]; ok {
			continue
		}
		ns, fb, err := s.namespace(e)
		if err == nil {
			if _, err = t.AddNamespace(s.nqn, ns); err != nil {
				fb.Close()
			}
		}
		if err != nil {
			fmt.Fprintf(errw, "rocev2d nvmf-target: SIGHUP: namespace %d: %s: %v\n", e.nsid, e.path, err)
			continue
		}
		s.open[e.nsid] = nsListOpen{e.path, fb}
		fmt.Fprintf(w, "nvmf-target: namespace %d added: %s, %d bytes; hosts notified\n", e.nsid, e.path, fb.Size()/int64(s.blockSize)*int64(s.blockSize))
	}
}

// close closes every open backend.
func (s *nsListState) close() {
	for _, o := range s.open {
		o.fb.Close()
	}
	s.open = nil
}
