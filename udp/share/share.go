//go:build linux

package share

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// MaxMembers is how many sockets (processes, or devices of one process) a
// group holds at most.
const MaxMembers = 64

// RangeSize is the number of QPNs in one leased range; range r holds QPNs
// r*RangeSize through (r+1)*RangeSize-1. Range 0 (QP0, QP1 and the QPNs
// below RangeSize) is never leased.
const RangeSize = 1 << rangeBits

// DefaultTimeWait is how long the QPN ranges, listeners and slot of a
// member that left (or died) stay unusable before they are reused.
const DefaultTimeWait = 3 * time.Second

// DefaultPinRoot is where bpffs is (mounted there when it is not).
const DefaultPinRoot = "/sys/fs/bpf"

// cfg map keys.
const (
	cfgRejector = 0 // member slot + 1 that answers REQs nobody listens for
	numCfg      = 4
)

// Member states (members map).
const (
	stateFree     = 0
	stateLive     = 1
	stateTimeWait = 2
)

// memberRec is a members map value (native endian): who holds a slot.
type memberRec struct {
	PID      uint32
	State    uint32
	Start    uint64 // the process's start time (/proc/PID/stat field 22)
	FreeAt   int64  // unix ns after which a TimeWait slot is free
	Joined   int64  // unix ns
	Rejector uint32 // 1: the member answers REQs nobody listens for
	TWms     uint32 // the member's own TimeWait, ms (0: the sweeper's)
	Sock     uint64 // the cookie of the member's socket in the socks array
}

const memberRecSize = 48

func (r *memberRec) marshal() []byte {
	b := make([]byte, memberRecSize)
	binary.NativeEndian.PutUint32(b[0:], r.PID)
	binary.NativeEndian.PutUint32(b[4:], r.State)
	binary.NativeEndian.PutUint64(b[8:], r.Start)
	binary.NativeEndian.PutUint64(b[16:], uint64(r.FreeAt))
	binary.NativeEndian.PutUint64(b[24:], uint64(r.Joined))
	binary.NativeEndian.PutUint32(b[32:], r.Rejector)
	binary.NativeEndian.PutUint32(b[36:], r.TWms)
	binary.NativeEndian.PutUint64(b[40:], r.Sock)
	return b
}

func unmarshalMember(b []byte) memberRec {
	return memberRec{
		PID: binary.NativeEndian.Uint32(b[0:]), State: binary.NativeEndian.Uint32(b[4:]),
		Start: binary.NativeEndian.Uint64(b[8:]), FreeAt: int64(binary.NativeEndian.Uint64(b[16:])),
		Joined: int64(binary.NativeEndian.Uint64(b[24:])), Rejector: binary.NativeEndian.Uint32(b[32:]),
		TWms: binary.NativeEndian.Uint32(b[36:]), Sock: binary.NativeEndian.Uint64(b[40:]),
	}
}

// Options configure Join. The zero value is sensible.
type Options struct {
	// TimeWait is how long what a departed member held (QPN ranges,
	// slot) stays unused; 0 means DefaultTimeWait.
	TimeWait time.Duration
	// PinRoot is the bpffs mount; "" means DefaultPinRoot (mounted if
	// it is not bpffs yet).
	PinRoot string
	// LockDir holds the per-address lock files; "" means /run/rocev2-share
	// (or the temporary directory when /run is not writable).
	LockDir string
}

func (o *Options) defaults() {
	if o.TimeWait <= 0 {
		o.TimeWait = DefaultTimeWait
	}
	if o.PinRoot == "" {
		o.PinRoot = DefaultPinRoot
	}
	if o.LockDir == "" {
		o.LockDir = "/run/rocev2-share"
		if err := os.MkdirAll(o.LockDir, 0o755); err != nil {
			o.LockDir = filepath.Join(os.TempDir(), "rocev2-share")
		}
	}
}

// ErrCapability is matched by the error Join returns when the process
// lacks a capability steering needs.
var ErrCapability = errors.New("share: missing capability")

// ErrFull is matched when the group has no free slot.
var ErrFull = errors.New("share: group full")

// ErrServiceInUse is matched when another member listens on a service ID.
var ErrServiceInUse = errors.New("share: service ID in use by another member")

// ErrAddrInUse is matched when sockets outside any group the process can
// find hold the address (Join would found a group that takes their
// packets).
var ErrAddrInUse = errors.New("share: address in use outside a group this process can join")

// CheckCapabilities returns nil when the process may load the steering
// program and attach it (CAP_BPF or CAP_SYS_ADMIN, and CAP_NET_ADMIN), or
// an error matching ErrCapability that names what is missing and the
// alternative.
func CheckCapabilities() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("share: capget: %w", err)
	}
	has := func(c int) bool { return data[c/32].Effective&(1<<(c%32)) != 0 }
	if !initialUserNS() {
		return fmt.Errorf("%w: this process runs in a user namespace (a rootless container?), whose capabilities do not "+
			"let it load BPF maps and programs (CAP_BPF in the initial user namespace does): it cannot share an address, "+
			"only hold one alone (ShareAuto does that there)", ErrCapability)
	}
	var missing []string
	if !has(unix.CAP_BPF) && !has(unix.CAP_SYS_ADMIN) {
		missing = append(missing, "CAP_BPF")
	}
	if !has(unix.CAP_NET_ADMIN) && !has(unix.CAP_SYS_ADMIN) {
		missing = append(missing, "CAP_NET_ADMIN")
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%w %s: sharing UDP 4791 between processes loads an SK_REUSEPORT eBPF program; "+
		"grant %s, or give each process its own IP address and open it unshared (--share=false)",
		ErrCapability, strings.Join(missing, " and "), strings.Join(missing, " and "))
}

// initialUserNS reports whether the process is in the initial user
// namespace: its uid_map maps every ID to itself (a user namespace's maps
// a range; unreadable counts as initial).
func initialUserNS() bool {
	b, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return true
	}
	f := strings.Fields(string(b))
	return len(f) == 3 && f[0] == "0" && f[1] == "0" && f[2] == "4294967295"
}

// group is the program and maps of one address.
type group struct {
	dir                                                 string
	prog                                                *ebpf.Program
	socks, ranges, services, cfg, stats, members, ident *ebpf.Map
}

func (g *group) maps() []**ebpf.Map {
	return []**ebpf.Map{&g.socks, &g.ranges, &g.services, &g.cfg, &g.stats, &g.members, &g.ident}
}

func (g *group) close() {
	if g.prog != nil {
		g.prog.Close()
	}
	for _, m := range g.maps() {
		if *m != nil {
			(*m).Close()
		}
	}
}

// shareDir names the format of the pinned groups: share-v2 keys groups by
// the namespace's cookie and tells a member's life by its socket (v1, by
// inode and PID). A group of another format on the same address is not
// joined, nor taken over (boundSockets).
const shareDir = "share-v2"

// dirName is the pin directory of address ap under root
// (bpffs refuses names with dots): "c4096_127_0_0_1_4791", named after the
// calling thread's network namespace too, since bpffs is shared by
// namespaces in which the same address is a different socket group.
func dirName(root string, ap netip.AddrPort) string {
	return filepath.Join(root, "rocev2", shareDir, groupKey(ap))
}

// groupKey names the group of ap in the calling thread's network namespace.
func groupKey(ap netip.AddrPort) string {
	return netnsID() + "_" + pinSafe.Replace(ap.String())
}

// soNetnsCookie is SO_NETNS_COOKIE (Linux 5.14), as asm-generic/socket.h
// numbers it for amd64 and arm64; where an architecture numbers it
// otherwise, the call fails or answers another length and netnsID falls
// back to the inode.
const soNetnsCookie = 71

// netnsID names the calling thread's network namespace: "c" and its cookie,
// a number the kernel gives each namespace once and never again until it
// reboots. The namespace's inode number ("n" and it, the fallback for
// kernels before 5.14) is reused as soon as the namespace is gone, so a
// new namespace took the name of a dead one: it joined the dead one's
// pinned group, and `share remove` in it removed that group.
func netnsID() string {
	if fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err == nil {
		var c uint64
		l := uint32(unsafe.Sizeof(c))
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, soNetnsCookie,
			uintptr(unsafe.Pointer(&c)), uintptr(unsafe.Pointer(&l)), 0)
		unix.Close(fd)
		if e == 0 && l == uint32(unsafe.Sizeof(c)) {
			return "c" + strconv.FormatUint(c, 10)
		}
	}
	var ino uint64
	var st unix.Stat_t
	if unix.Stat("/proc/thread-self/ns/net", &st) == nil {
		ino = st.Ino
	}
	return "n" + strconv.FormatUint(ino, 10)
}

var pinSafe = strings.NewReplacer(".", "_", ":", "_", "[", "", "]", "", "%", "_")

func lockName(dir string, ap netip.AddrPort) string {
	return filepath.Join(dir, groupKey(ap)+".lock")
}

// ensureBPFFS mounts bpffs at root when root is not one.
func ensureBPFFS(root string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err == nil && uint32(st.Type) == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return fmt.Errorf("share: bpffs at %s: %w", root, err)
	}
	if err := unix.Mount("bpf", root, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("share: mount bpffs at %s: %w", root, err)
	}
	return nil
}

var mapNames = []string{"socks", "ranges", "services", "cfg", "stats", "members", "ident"}

// The ident map (one entry) names the group and holds the IDs of its
// objects, so that a process that does not see the pins (another mount
// namespace: `ip netns exec` mounts a sysfs of its own over /sys, and with
// it an empty /sys/fs/bpf) finds the live group by enumerating BPF maps.
const (
	identName    = "rocev2_ident2"
	identKeyLen  = 64
	identProgOff = identKeyLen // u32 program ID, then a u32 ID per map of mapNames but ident
	identSize    = identProgOff + 4 + 4*6
)

// loadPinned loads the group pinned in dir.
func loadPinned(dir string, readOnly bool) (*group, error) {
	g := &group{dir: dir}
	var o *ebpf.LoadPinOptions
	if readOnly {
		o = &ebpf.LoadPinOptions{ReadOnly: true}
	}
	for i, m := range g.maps() {
		var err error
		if *m, err = ebpf.LoadPinnedMap(filepath.Join(dir, mapNames[i]), o); err != nil {
			g.close()
			return nil, err
		}
	}
	if !readOnly {
		var err error
		if g.prog, err = ebpf.LoadPinnedProgram(filepath.Join(dir, "prog"), nil); err != nil {
			g.close()
			return nil, err
		}
	}
	return g, nil
}

// findLive looks for the live group named key among the kernel's BPF maps
// (needs CAP_SYS_ADMIN; nil when not found).
func findLive(dir, key string) *group {
	for id := ebpf.MapID(0); ; {
		next, err := ebpf.MapGetNextID(id)
		if err != nil {
			return nil
		}
		id = next
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue
		}
		info, err := m.Info()
		if err != nil || info.Name != identName || info.ValueSize != identSize {
			m.Close()
			continue
		}
		v := make([]byte, identSize)
		if m.Lookup(uint32(0), &v) != nil || strings.TrimRight(string(v[:identKeyLen]), "\x00") != identKey(key) {
			m.Close()
			continue
		}
		g := &group{dir: dir, ident: m}
		if g.prog, err = ebpf.NewProgramFromID(ebpf.ProgramID(binary.NativeEndian.Uint32(v[identProgOff:]))); err != nil {
			g.close()
			continue
		}
		ok := true
		for i, mp := range g.maps()[:6] {
			mid := ebpf.MapID(binary.NativeEndian.Uint32(v[identProgOff+4+4*i:]))
			if *mp, err = ebpf.NewMapFromID(mid); err != nil {
				ok = false
				break
			}
		}
		if ok {
			return g
		}
		g.close()
	}
}

// identKey is key as the ident map holds it: its first identKeyLen bytes
// (an IPv6 address with a zone can make a longer key).
func identKey(key string) string {
	if len(key) > identKeyLen {
		return key[:identKeyLen]
	}
	return key
}

// openGroup loads the group of key: pinned in dir, else live (found by
// its ident map), else created afresh and pinned.
func openGroup(ap netip.AddrPort, dir, key string) (*group, error) {
	if g, err := loadPinned(dir, false); err == nil {
		return g, nil
	}
	if g := findLive(dir, key); g != nil {
		// Pin it where this process looks (its own bpffs, if private).
		os.RemoveAll(dir)
		if os.MkdirAll(dir, 0o700) == nil {
			g.pin()
		}
		return g, nil
	}
	// Sockets already on the address are a group this process cannot
	// see (or a process holding it unshared): a new group's program
	// would replace theirs.
	if n, err := boundSockets(ap); err == nil && n > 0 {
		return nil, fmt.Errorf("%w (%w): %d socket(s) are bound to UDP %s already, in a sharing group this process cannot see "+
			"(pinned in another bpffs, and finding it by its BPF maps needs CAP_SYS_ADMIN; or made by another version "+
			"of rocev2's sharing) or held unshared by a process; a new group would take their packets. Mount the "+
			"others' bpffs at %s, grant CAP_SYS_ADMIN, run one version on the address, or use another address",
			ErrAddrInUse, unix.EADDRINUSE, n, ap, filepath.Dir(filepath.Dir(filepath.Dir(dir))))
	}
	// Create afresh (a half-made directory from a crash is replaced).
	g := &group{dir: dir}
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("share: pin directory: %w", err)
	}
	specs := []*ebpf.MapSpec{
		{Name: "rocev2_socks", Type: ebpf.ReusePortSockArray, KeySize: 4, ValueSize: 8, MaxEntries: MaxMembers},
		{Name: "rocev2_ranges", Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: numRanges},
		{Name: "rocev2_svcs", Type: ebpf.Hash, KeySize: 8, ValueSize: 4, MaxEntries: 4096, Flags: unix.BPF_F_NO_PREALLOC},
		{Name: "rocev2_cfg", Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: numCfg},
		{Name: "rocev2_stats", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: MaxMembers + numGroupCounters},
		{Name: "rocev2_members", Type: ebpf.Array, KeySize: 4, ValueSize: memberRecSize, MaxEntries: MaxMembers},
		{Name: identName, Type: ebpf.Array, KeySize: 4, ValueSize: identSize, MaxEntries: 1},
	}
	maps := g.maps()
	for i, sp := range specs {
		m, err := ebpf.NewMap(sp)
		if err != nil {
			g.close()
			return nil, fmt.Errorf("share: create map %s: %w", mapNames[i], err)
		}
		*maps[i] = m
	}
	var err error
	g.prog, err = ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "rocev2_steer",
		Type:         ebpf.SkReuseport,
		License:      "GPL",
		Instructions: program(g.socks.FD(), g.ranges.FD(), g.services.FD(), g.cfg.FD(), g.stats.FD(), g.ident.FD()),
	})
	if err != nil {
		g.close()
		return nil, fmt.Errorf("share: load steering program: %w", err)
	}
	v := make([]byte, identSize)
	copy(v[:identKeyLen], key)
	pi, err := g.prog.Info()
	if err != nil {
		g.close()
		return nil, fmt.Errorf("share: program info: %w", err)
	}
	pid, _ := pi.ID()
	binary.NativeEndian.PutUint32(v[identProgOff:], uint32(pid))
	for i, mp := range maps[:6] {
		mi, err := (*mp).Info()
		if err != nil {
			g.close()
			return nil, fmt.Errorf("share: map info: %w", err)
		}
		mid, _ := mi.ID()
		binary.NativeEndian.PutUint32(v[identProgOff+4+4*i:], uint32(mid))
	}
	if err := g.ident.Update(uint32(0), v, ebpf.UpdateAny); err != nil {
		g.close()
		return nil, fmt.Errorf("share: ident: %w", err)
	}
	if err := g.pin(); err != nil {
		g.close()
		return nil, err
	}
	return g, nil
}

// pin pins the group's objects in its directory.
func (g *group) pin() error {
	for i, m := range g.maps() {
		if err := (*m).Pin(filepath.Join(g.dir, mapNames[i])); err != nil {
			return fmt.Errorf("share: pin %s: %w", mapNames[i], err)
		}
	}
	if err := g.prog.Pin(filepath.Join(g.dir, "prog")); err != nil {
		return fmt.Errorf("share: pin program: %w", err)
	}
	return nil
}

// LockWait is how long Join, Leave and Remove wait for an address's lock
// file before they give up with ErrLockTimeout. The lock is held for the
// few milliseconds a join, a leave or a sweep takes; a holder that keeps it
// longer is stopped (SIGSTOP, a debugger) or hung, and waiting on would
// hang the caller with it.
var LockWait = 10 * time.Second

// ErrLockTimeout is matched by the error returned when an address's lock
// file stayed held for LockWait; the error names the file and, when
// /proc/locks shows it, the process holding it.
var ErrLockTimeout = errors.New("share: lock held too long")

// flock takes the address's lock file (exclusive), waiting at most
// LockWait for it.
func flock(path string) (*os.File, error) {
	deadline := time.Now().Add(LockWait)
	pause := 100 * time.Microsecond
	for {
		f, err := tryFlock(path)
		if err != nil || f != nil {
			return f, err
		}
		if time.Now().After(deadline) {
			holder := ""
			if pid := lockHolder(path); pid > 0 {
				holder = fmt.Sprintf(" by process %d", pid)
			}
			return nil, fmt.Errorf("%w: %s held%s for more than %v (a stopped or hung member of the group?)", ErrLockTimeout, path, holder, LockWait)
		}
		time.Sleep(pause)
		pause = min(2*pause, 10*time.Millisecond)
	}
}

// lockHolder returns the PID /proc/locks names for the flock on the file
// at path, or 0.
func lockHolder(path string) int {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return 0
	}
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return 0
	}
	// "1: FLOCK  ADVISORY  WRITE 1234 00:1a:5678 0 EOF": PID, then
	// major:minor:inode (hexadecimal device numbers).
	want := fmt.Sprintf(":%d", st.Ino)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[1] != "FLOCK" || !strings.HasSuffix(f[5], want) {
			continue
		}
		dev := strings.Split(f[5], ":")
		if len(dev) != 3 {
			continue
		}
		maj, err1 := strconv.ParseUint(dev[0], 16, 32)
		mnr, err2 := strconv.ParseUint(dev[1], 16, 32)
		if err1 != nil || err2 != nil || unix.Mkdev(uint32(maj), uint32(mnr)) != uint64(st.Dev) {
			continue
		}
		if pid, err := strconv.Atoi(f[4]); err == nil {
			return pid
		}
	}
	return 0
}

// tryFlock is flock without waiting: nil, nil when another process holds
// the lock.
func tryFlock(path string) (*os.File, error) { return lockFile(path, unix.LOCK_EX|unix.LOCK_NB) }

// lockFile locks the file at path with how. The file is removed with its
// group (removeLock), so the file locked must still be the one at path:
// one opened before the removal is locked after it, and tried again.
func lockFile(path string, how int) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	for try := 0; ; try++ {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("share: lock: %w", err)
		}
		for {
			err = unix.Flock(int(f.Fd()), how)
			if err != unix.EINTR {
				break
			}
		}
		if err == unix.EWOULDBLOCK && how&unix.LOCK_NB != 0 {
			f.Close()
			return nil, nil
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("share: lock %s: %w", path, err)
		}
		var a, b unix.Stat_t
		if unix.Fstat(int(f.Fd()), &a) == nil && unix.Stat(path, &b) == nil && a.Ino == b.Ino && a.Dev == b.Dev {
			return f, nil
		}
		f.Close()
		if try == 100 {
			return nil, fmt.Errorf("share: lock %s: removed and made again 100 times while waiting", path)
		}
	}
}

// removeLock removes the lock file at path, which the caller holds locked
// (through f), with the group it serialized: one lock file per namespace
// and address piled up in /run otherwise, namespace cookies never coming
// back.
func removeLock(path string, l *addrLock) {
	if l.file() != nil {
		os.Remove(path)
	}
}

// procStart returns the start time of process pid (clock ticks after
// boot), or 0 when it does not exist.
func procStart(pid uint32) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	// Fields after the command: state is field 3, starttime field 22.
	if len(f) < 20 {
		return 0
	}
	v, _ := strconv.ParseUint(f[19], 10, 64)
	return v
}

// alive reports whether the live member in slot s still holds its socket:
// the kernel takes a socket out of the socks array when it closes — its
// process died, or exec'd (the socket is close-on-exec) — so this holds
// whatever PID namespace the caller and the member are in. (A PID and start
// time, the test before, cannot be seen from another PID namespace: a
// member in a container took every other member for dead.)
func (g *group) alive(s int, r memberRec) bool {
	if r.State != stateLive {
		return false
	}
	var c uint64
	if err := g.socks.Lookup(uint32(s), &c); err != nil {
		return false
	}
	return r.Sock == 0 || c == r.Sock
}

func (g *group) member(slot int) memberRec {
	b := make([]byte, memberRecSize)
	if err := g.members.Lookup(uint32(slot), &b); err != nil {
		return memberRec{}
	}
	return unmarshalMember(b)
}

func (g *group) setMember(slot int, r memberRec) error {
	return g.members.Update(uint32(slot), r.marshal(), ebpf.UpdateAny)
}

// sweep moves the members whose process is gone to TimeWait and frees what
// the members whose TimeWait has passed held. Under the lock.
func (g *group) sweep(now time.Time, tw time.Duration) {
	changed := false
	for s := 0; s < MaxMembers; s++ {
		r := g.member(s)
		switch r.State {
		case stateLive:
			if !g.alive(s, r) {
				// The member's own TimeWait, not the sweeper's.
				if r.TWms != 0 {
					tw = time.Duration(r.TWms) * time.Millisecond
				}
				g.depart(s, r, now, tw)
				changed = true
			}
		case stateTimeWait:
			if now.UnixNano() >= r.FreeAt {
				g.free(s)
			}
		}
	}
	if changed {
		g.pickRejector()
	}
}

// depart puts slot s in TimeWait: its socket leaves the array, its
// listeners go (a REQ then reaches the rejector), its ranges stay
// assigned (so their packets are dropped, not delivered) until free.
func (g *group) depart(s int, r memberRec, now time.Time, tw time.Duration) {
	g.socks.Delete(uint32(s))
	g.deleteServices(s)
	r.State = stateTimeWait
	r.FreeAt = now.Add(tw).UnixNano()
	r.Rejector = 0
	g.setMember(s, r)
	var rej uint32
	if g.cfg.Lookup(uint32(cfgRejector), &rej) == nil && rej == uint32(s)+1 {
		g.cfg.Update(uint32(cfgRejector), uint32(0), ebpf.UpdateAny)
	}
}

// removeIfEmpty unpins the group when no slot is held (a join that failed
// to bind leaves nothing behind). Under the lock.
func (g *group) removeIfEmpty(lockPath string, lf *addrLock) {
	for s := 0; s < MaxMembers; s++ {
		if g.member(s).State != stateFree {
			return
		}
	}
	os.RemoveAll(g.dir)
	removeLock(lockPath, lf)
}

// free returns slot s and its QPN ranges.
func (g *group) free(s int) {
	if owners, err := g.rangeOwners(); err == nil {
		for r := uint32(1); r < numRanges; r++ {
			if owners[r] == uint32(s)+1 {
				g.ranges.Update(r, uint32(0), ebpf.UpdateAny)
			}
		}
	}
	g.setMember(s, memberRec{})
}

// rangeOwners returns the owner (slot+1, 0 for none) of every QPN range,
// indexed by range. It reads the array in one BPF_MAP_LOOKUP_BATCH where
// the kernel has it: a lookup per range cost 4,096 system calls in every
// free and lease, the bulk of a sharing process's start (4,681 of its
// 4,760 bpf calls), which a loaded machine stretched past the 300 ms a
// test allowed a server to start listening. Else one lookup per range.
func (g *group) rangeOwners() ([]uint32, error) {
	owners := make([]uint32, numRanges)
	keys := make([]uint32, numRanges)
	vals := make([]uint32, numRanges)
	var c ebpf.MapBatchCursor
	n, err := g.ranges.BatchLookup(&c, keys, vals, nil)
	if (err == nil || errors.Is(err, ebpf.ErrKeyNotExist)) && n == numRanges {
		for i, k := range keys {
			if k < numRanges {
				owners[k] = vals[i]
			}
		}
		return owners, nil
	}
	for r := uint32(1); r < numRanges; r++ {
		if err := g.ranges.Lookup(r, &owners[r]); err != nil {
			return nil, err
		}
	}
	return owners, nil
}

func (g *group) deleteServices(s int) {
	var key [8]byte
	var val uint32
	var del [][8]byte
	it := g.services.Iterate()
	for it.Next(&key, &val) {
		if val == uint32(s)+1 {
			del = append(del, key)
		}
	}
	for _, k := range del {
		g.services.Delete(k)
	}
}

// pickRejector makes the lowest live member that volunteered the rejector
// when there is none.
func (g *group) pickRejector() {
	var rej uint32
	if g.cfg.Lookup(uint32(cfgRejector), &rej) == nil && rej != 0 {
		if r := g.member(int(rej - 1)); r.State == stateLive && r.Rejector != 0 {
			return
		}
	}
	for s := 0; s < MaxMembers; s++ {
		if r := g.member(s); r.State == stateLive && r.Rejector != 0 {
			g.cfg.Update(uint32(cfgRejector), uint32(s)+1, ebpf.UpdateAny)
			return
		}
	}
	g.cfg.Update(uint32(cfgRejector), uint32(0), ebpf.UpdateAny)
}

// Member is one socket's membership in the group of an address: its slot,
// its QPN ranges and its listeners. Methods are safe for concurrent use.
type Member struct {
	ap   netip.AddrPort
	opts Options
	g    *group
	slot int
	lock string // the lock file
	key  string // the group's key: its abstract lock name

	// inNetns runs a function in the group's network namespace (the
	// thread that joined was in it), for the abstract lock's socket when
	// a later call comes on a thread of another namespace; netns is its
	// handle, closed by Close.
	inNetns func(func() error) error
	netns   *os.File

	mu     sync.Mutex
	closed bool
	owned  [numRanges / 64]atomic.Uint64 // bitmap of leased ranges
	svcs   map[uint64]bool
	stop   chan struct{} // closed by Close: watch returns
}

// Join makes a socket a member of the group on ap (its port is the
// group's): it checks the capabilities, loads or creates the pinned
// program and maps, takes a slot, and calls open with the steering
// program's descriptor. open must create the socket with SO_REUSEPORT
// (SetReusePort), bind it to ap, call AttachProgram(fd, progFD) and return
// its descriptor (which stays the caller's). The program must be attached
// after bind: a socket that has a program before bind forms a group of its
// own and cannot join the existing one (EADDRINUSE). The group's program
// is already in place when a later member binds, and the first member is
// alone until it attaches, so no datagram is ever picked by hash. Until the member leases QPN
// ranges, claims services or volunteers as rejector, nothing is steered
// to it.
//
// When every slot is taken but some only by members in TimeWait (processes
// that left or died within the last TimeWait: a reconnect loop of short
// runs next to a long-lived member), Join waits, without the lock, for the
// first of them to come free and tries again — at most twice TimeWait in
// all — instead of failing with ErrFull.
func Join(ap netip.AddrPort, opts *Options, open func(progFD int) (fd int, err error)) (*Member, error) {
	if err := CheckCapabilities(); err != nil {
		return nil, err
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	o.defaults()
	if err := ensureBPFFS(o.PinRoot); err != nil {
		return nil, err
	}
	// Once per process: unpin the groups whose members are all gone
	// (processes killed before they could leave), so that bpffs and the
	// kernel's maps do not fill up with them over a host's life.
	sweepOnce.Do(func() { Sweep(o.PinRoot, o.LockDir, o.TimeWait) })
	deadline := time.Now().Add(2 * o.TimeWait)
	for {
		m, freeAt, err := joinOnce(ap, &o, open)
		if freeAt.IsZero() || !freeAt.Before(deadline) || time.Now().After(deadline) {
			return m, err
		}
		time.Sleep(time.Until(freeAt) + time.Millisecond)
	}
}

// joinOnce is one try of Join. When the group is full it returns ErrFull
// and, if a slot is only in TimeWait, when the first such slot comes free.
func joinOnce(ap netip.AddrPort, opts *Options, open func(progFD int) (fd int, err error)) (*Member, time.Time, error) {
	o := *opts
	m, err := joinLocked(ap, &o, open)
	if err != nil && errors.Is(err, ErrFull) {
		var f *fullError
		if errors.As(err, &f) {
			return nil, f.freeAt, err
		}
	}
	return m, time.Time{}, err
}

// fullError is ErrFull with the time the first TimeWait slot comes free
// (zero when every slot is live).
type fullError struct {
	msg    string
	freeAt time.Time
}

func (e *fullError) Error() string { return e.msg }
func (e *fullError) Unwrap() error { return ErrFull }

// joinLocked takes the address's lock, a slot and the socket (Join).
func joinLocked(ap netip.AddrPort, opts *Options, open func(progFD int) (fd int, err error)) (*Member, error) {
	o := *opts
	lockPath, key := lockName(o.LockDir, ap), groupKey(ap)
	lf, err := lockAddr(lockPath, key, nil)
	if err != nil {
		return nil, err
	}
	defer lf.Close()
	g, err := openGroup(ap, dirName(o.PinRoot, ap), key)
	if err != nil {
		if _, serr := os.Stat(dirName(o.PinRoot, ap)); os.IsNotExist(serr) {
			removeLock(lockPath, lf) // no group: nothing for the file to serialize
		}
		return nil, err
	}
	now := time.Now()
	g.sweep(now, o.TimeWait)
	slot := -1
	for s := 0; s < MaxMembers; s++ {
		if g.member(s).State == stateFree {
			slot = s
			break
		}
	}
	if slot < 0 {
		var freeAt time.Time
		tw := 0
		for s := 0; s < MaxMembers; s++ {
			if r := g.member(s); r.State == stateTimeWait {
				tw++
				if t := time.Unix(0, r.FreeAt); freeAt.IsZero() || t.Before(freeAt) {
					freeAt = t
				}
			}
		}
		g.close()
		return nil, &fullError{msg: fmt.Sprintf("%v: %d members on %s, %d of them in TimeWait (processes that left within the last %v)", ErrFull, MaxMembers, ap, tw, o.TimeWait), freeAt: freeAt}
	}
	fd, err := open(g.prog.FD())
	if err != nil {
		g.removeIfEmpty(lockPath, lf)
		g.close()
		return nil, err
	}
	if err := g.socks.Update(uint32(slot), uint64(fd), ebpf.UpdateAny); err != nil {
		g.close()
		return nil, fmt.Errorf("share: add socket to the group's array: %w", err)
	}
	pid := uint32(os.Getpid())
	var cookie uint64
	if err := g.socks.Lookup(uint32(slot), &cookie); err != nil {
		g.socks.Delete(uint32(slot))
		g.close()
		return nil, fmt.Errorf("share: the socket's cookie in the group's array: %w", err)
	}
	rec := memberRec{PID: pid, State: stateLive, Start: procStart(pid), Joined: now.UnixNano(), Sock: cookie,
		TWms: uint32(min(o.TimeWait.Milliseconds(), 1<<32-1))}
	if err := g.setMember(slot, rec); err != nil {
		g.socks.Delete(uint32(slot))
		g.close()
		return nil, fmt.Errorf("share: member record: %w", err)
	}
	g.stats.Update(uint32(slot), uint64(0), ebpf.UpdateAny)
	m := &Member{ap: ap, opts: o, g: g, slot: slot, lock: lockPath, key: key, svcs: map[uint64]bool{}, stop: make(chan struct{})}
	m.inNetns, m.netns = netnsRunner()
	go m.watch()
	return m, nil
}

// watchEvery is how often a member sweeps its group while it lives: a
// member that died is put in TimeWait, and a dead rejector replaced,
// within it even when no process joins or leaves (a REQ for a service
// nobody listens on went to the dead rejector's socket, and the dialer got
// an ICMP port unreachable instead of a REJ, until someone joined).
const watchEvery = time.Second

// watch sweeps the group every watchEvery until Close, skipping a turn
// when another process holds the lock.
func (m *Member) watch() {
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		m.mu.Lock()
		if !m.closed {
			if f, err := tryLockAddr(m.lock, m.key, m.inNetns); err == nil && f != nil {
				m.g.sweep(time.Now(), m.opts.TimeWait)
				f.Close()
			}
		}
		m.mu.Unlock()
	}
}

// SetReusePort sets SO_REUSEPORT on fd; call it before bind.
func SetReusePort(fd int) error {
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		return fmt.Errorf("setsockopt SO_REUSEPORT: %w", err)
	}
	return nil
}

// AttachProgram attaches the steering program progFD to the bound socket fd
// (SO_ATTACH_REUSEPORT_EBPF), which replaces the group's program by the
// same one.
func AttachProgram(fd, progFD int) error {
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_EBPF, progFD); err != nil {
		return fmt.Errorf("setsockopt SO_ATTACH_REUSEPORT_EBPF: %w", err)
	}
	return nil
}

// locked runs f under the address's lock after a sweep.
func (m *Member) locked(f func() error) error {
	lf, err := lockAddr(m.lock, m.key, m.inNetns)
	if err != nil {
		return err
	}
	defer lf.Close()
	m.g.sweep(time.Now(), m.opts.TimeWait)
	return f()
}

// Slot returns the member's slot in the group (0 to MaxMembers-1).
func (m *Member) Slot() int { return m.slot }

// CommIDTag returns the bits that mark a communication ID (and a SIDR
// request ID) as this member's: the top byte, tag under mask. A CM reply
// is steered to the member its ID names.
func (m *Member) CommIDTag() (tag, mask uint32) {
	return uint32(tagBit|m.slot) << 24, 0xff << 24
}

// LeaseQPNs leases a free QPN range for the member and returns it.
func (m *Member) LeaseQPNs() (first, n uint32, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, 0, errors.New("share: member closed")
	}
	err = m.locked(func() error {
		owners, err := m.g.rangeOwners()
		if err != nil {
			return err
		}
		// From a random range on: a process restarted on the address
		// after its TimeWait does not take its previous life's range
		// (and QPNs) again while peers may still know them.
		r0 := 1 + uint32(rand.N(numRanges-1))
		for i := uint32(0); i < numRanges-1; i++ {
			r := 1 + (r0-1+i)%(numRanges-1)
			if owners[r] != 0 {
				continue
			}
			if err := m.g.ranges.Update(r, uint32(m.slot)+1, ebpf.UpdateAny); err != nil {
				return err
			}
			m.owned[r/64].Or(1 << (r % 64))
			first, n = r*RangeSize, RangeSize
			return nil
		}
		return errors.New("share: no free QPN range (every range leased or in TimeWait)")
	})
	return first, n, err
}

// Owns reports whether qpn is in one of the member's ranges (QP1 too: the
// program steers CM MADs to their member).
func (m *Member) Owns(qpn uint32) bool {
	if qpn == 1 {
		return true
	}
	r := (qpn & 0xffffff) >> rangeBits
	return m.owned[r/64].Load()&(1<<(r%64)) != 0
}

// ClaimService makes REQs and SIDR_REQs for service ID sid come to this
// member. Another live member's claim fails with ErrServiceInUse.
func (m *Member) ClaimService(sid uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errors.New("share: member closed")
	}
	var key [8]byte
	binary.BigEndian.PutUint64(key[:], sid)
	return m.locked(func() error {
		var owner uint32
		if m.g.services.Lookup(key, &owner) == nil && owner != 0 && owner != uint32(m.slot)+1 {
			return fmt.Errorf("%w: service %#x on %s is member %d's", ErrServiceInUse, sid, m.ap, owner-1)
		}
		if err := m.g.services.Update(key, uint32(m.slot)+1, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("share: claim service %#x: %w", sid, err)
		}
		m.svcs[sid] = true
		return nil
	})
}

// ReleaseService undoes ClaimService.
func (m *Member) ReleaseService(sid uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || !m.svcs[sid] {
		return
	}
	delete(m.svcs, sid)
	var key [8]byte
	binary.BigEndian.PutUint64(key[:], sid)
	m.locked(func() error {
		var owner uint32
		if m.g.services.Lookup(key, &owner) == nil && owner == uint32(m.slot)+1 {
			m.g.services.Delete(key)
		}
		return nil
	})
}

// VolunteerRejector offers the member as the one that receives REQs and
// SIDR_REQs for services nobody listens on (and answers each with one
// REJ). One member at a time is the rejector; when it leaves another
// volunteer takes over.
func (m *Member) VolunteerRejector() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errors.New("share: member closed")
	}
	return m.locked(func() error {
		r := m.g.member(m.slot)
		if r.Rejector == 0 {
			r.Rejector = 1
			if err := m.g.setMember(m.slot, r); err != nil {
				return err
			}
		}
		m.g.pickRejector()
		return nil
	})
}

// Steered returns how many datagrams the program handed to this member.
func (m *Member) Steered() uint64 {
	var v uint64
	m.g.stats.Lookup(uint32(m.slot), &v)
	return v
}

// Close leaves the group: the socket leaves the array, listeners go at
// once, and the ranges and slot return after TimeWait. The caller closes
// the socket.
func (m *Member) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	close(m.stop)
	err := m.locked(func() error {
		r := m.g.member(m.slot)
		if r.State == stateLive && r.PID == uint32(os.Getpid()) {
			m.g.depart(m.slot, r, time.Now(), m.opts.TimeWait)
			m.g.pickRejector()
		}
		return nil
	})
	m.g.close()
	if m.netns != nil {
		m.netns.Close()
	}
	return err
}

// Remove unpins the group of ap (in the calling thread's network
// namespace) when none of its members is alive, members in TimeWait
// included; it reports whether it did (false: a member is alive), and an
// error when no group is pinned. pinRoot "" is DefaultPinRoot.
func Remove(ap netip.AddrPort, pinRoot string) (bool, error) {
	var o Options
	o.PinRoot = pinRoot
	o.defaults()
	lockPath := lockName(o.LockDir, ap)
	lf, err := lockAddr(lockPath, groupKey(ap), nil)
	if err != nil {
		return false, err
	}
	defer lf.Close()
	dir := dirName(o.PinRoot, ap)
	g, err := loadPinned(dir, true)
	if err != nil {
		if _, serr := os.Stat(dir); serr == nil {
			// Pinned by an incompatible version, or half made: nothing
			// this version can read is live in it.
			err := os.RemoveAll(dir)
			if err == nil {
				removeLock(lockPath, lf)
			}
			return true, err
		}
		if _, serr := os.Stat(dir); os.IsNotExist(serr) {
			removeLock(lockPath, lf)
		}
		return false, fmt.Errorf("share: no group pinned in %s: %w", dir, err)
	}
	defer g.close()
	for s := 0; s < MaxMembers; s++ {
		if r := g.member(s); g.alive(s, r) {
			return false, nil
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return true, err
	}
	removeLock(lockPath, lf)
	return true, nil
}

var sweepOnce sync.Once

// Sweep unpins the groups under pinRoot (DefaultPinRoot when "") that no
// member holds any more, and returns how many it unpinned. A member whose
// process died without leaving (SIGKILL, a crash) is found by its PID and
// start time and put in TimeWait as Join does; a group is unpinned once
// every slot is free — its members left and their TimeWait (tw, or the
// DefaultTimeWait when 0) has passed — so a later sweep removes what this
// one put in TimeWait. Without it every group a killed process was the last
// member of stayed pinned in bpffs until the host rebooted, and a process
// that looks for a live group by enumerating the kernel's BPF maps
// (findLive) went through all of theirs (seconds, with thousands).
// A group whose lock another process holds is left alone. Join calls it
// once per process; lockDir "" is Options' default.
func Sweep(pinRoot, lockDir string, tw time.Duration) int {
	o := Options{PinRoot: pinRoot, LockDir: lockDir, TimeWait: tw}
	o.defaults()
	base := filepath.Join(o.PinRoot, "rocev2", shareDir)
	ents, err := os.ReadDir(base)
	if err != nil {
		return 0
	}
	n := 0
	now := time.Now()
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		if sweepGroup(filepath.Join(base, e.Name()), filepath.Join(o.LockDir, e.Name()+".lock"), now, o.TimeWait) {
			n++
		}
	}
	sweepLocks(base, o.LockDir)
	return n
}

// sweepLocks removes the lock files in lockDir whose group is not pinned
// under base and that nobody holds: those of groups pinned in a bpffs
// this process does not see — `ip netns exec` mounts a private one, gone
// with the command, so its groups were never swept and their lock files
// piled up by the thousand. A group still live there (in another mount
// namespace) loses nothing: its next change makes the file again, and a
// process that opened the old one finds it removed and takes the new one
// (lockFile).
func sweepLocks(base, lockDir string) {
	ents, err := os.ReadDir(lockDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".lock")
		if !ok || e.IsDir() {
			continue
		}
		if _, err := os.Stat(filepath.Join(base, name)); err == nil {
			continue // pinned here: sweepGroup's
		}
		path := filepath.Join(lockDir, e.Name())
		f, err := tryFlock(path)
		if err != nil || f == nil {
			continue // held: in use
		}
		if _, err := os.Stat(filepath.Join(base, name)); os.IsNotExist(err) {
			os.Remove(path)
		}
		f.Close()
	}
}

// sweepGroup sweeps the group pinned in dir under its lock file, unless
// another process holds that lock, and unpins it when no slot is held; it
// reports whether it did. A directory this version cannot load is left
// alone (Remove is the way to clear one).
func sweepGroup(dir, lockPath string, now time.Time, tw time.Duration) bool {
	f, err := tryLockAddr(lockPath, filepath.Base(dir), nil)
	if err != nil || f == nil {
		return false
	}
	defer f.Close()
	g, err := loadPinned(dir, false)
	if err != nil {
		return false
	}
	defer g.close()
	g.sweep(now, tw)
	for s := 0; s < MaxMembers; s++ {
		if g.member(s).State != stateFree {
			return false
		}
	}
	if os.RemoveAll(dir) != nil {
		return false
	}
	removeLock(lockPath, f)
	return true
}
