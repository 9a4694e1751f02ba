package cmtools

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/nvme"
	"github.com/gorocev2/rocev2/nvmf"
	"github.com/gorocev2/rocev2/transport"
)

func init() {
	commands.Register("nvmf-target", "NVMe over Fabrics (RDMA) target: a file, block device or memory as a namespace", nvmfTargetUsage, runNvmfTarget)
	commands.Register("nvmf-host", "NVMe over Fabrics (RDMA) host: discover, identify, read, write, verify, bench", nvmfHostUsage, runNvmfHost)
}

const nvmfTargetUsage = `usage: rocev2d nvmf-target --bind ADDR [--port 4420] --nqn NQN (--file PATH | --size BYTES) [--ro] [options]

An NVMe over Fabrics target on RDMA (package nvmf): Linux's nvme-rdma host
(echo "transport=rdma,traddr=ADDR,trsvcid=4420,nqn=NQN" > /dev/nvme-fabrics)
or rocev2d nvmf-host connects to it through rdma_cm. It exports one
subsystem with one namespace, and the discovery controller
(nqn.2014-08.org.nvmexpress.discovery) that lists it. It serves until
SIGINT/SIGTERM, then disconnects every host.

SIGHUP reads the size of --file again (a file that grew or shrank, a
block device resized; whole blocks count) and, when it changed, tells the
connected hosts with a Namespace Attribute Changed event (Linux's host
revalidates the namespace and the block device takes the new size without
reconnecting); it prints the namespace's size either way. A memory
namespace keeps its size. With --ns-list, SIGHUP also reads the list
again: namespaces added to it are added, ones gone from it (or given
another path) removed, the others' sizes read again; the hosts are told
of each change (Linux's host adds or deletes nvmeXnY).

options:
  --bind ADDR        local address for RoCEv2 (UDP 4791); required
  --port N           rdma_cm port (TCP port space; default 4420)
  --nqn NQN          the subsystem's NQN (required)
  --file PATH        a regular file or block device as the namespace; a
                     file that does not exist is created with --size bytes
  --size BYTES       the namespace's size (memory when no --file); k/m/g
                     suffixes (powers of 1024); whole blocks of --block-size
  --ns-list FILE     more namespaces: one "NSID PATH" a line (NSID 2 and up; a
                     file or block device that exists; # comments), read at
                     the start and at every SIGHUP
  --ro               read-only namespaces (writes fail: write protected)
  --nguid HEX        the namespace's NGUID (32 hex digits). Default: derived
                     from the NQN and the file's device, inode and birth time
                     (the same file keeps it across restarts; a new file, or
                     memory, which a restart empties, gets another, so that a
                     reconnecting host sees another namespace, not its old
                     disk with other data)
  --block-size N     LBA size, 512 (default) or 4096
  --inline N         in-capsule data per I/O command (default 4096, 0: none)
  --queue-size N     largest I/O queue (default 128)
  --io-queues N      I/O queues per controller (default 8)
  --mtu N            largest path MTU of the queues: 256..4096 (default 1024);
                     a queue takes the host's, and a host asking for more is
                     rejected (use 4096 where the link carries it)
  --host NQN         allow only this host (repeatable; default any host)
  --no-selective-repeat  refuse selective repeat to hosts that offer it (a
                     rocev2 host's --selective-repeat): every queue runs
                     go-back-N, as with Linux's nvmet-rdma
  --discovery-kato DUR  keep-alive timeout of a discovery controller whose
                     host asks for none (KATO 0, as nvme-cli's discover):
                     default 120s, nvmet's; 1ms .. 49.7 days (KATO is a 32-bit
                     count of milliseconds); 0: none, such a controller lives
                     as long as its connection
  -v                 log connections; print the target's and the device's
                     counters at the end (SIGUSR1 prints the device's)
  --cpuprofile FILE  write a Go CPU profile (pprof) of the whole run, from
                     the start until SIGINT/SIGTERM, to FILE
` + cli.SocketUsage + `
Exit status: 0 after a clean stop, 1 when the target could not start, 2 bad usage.
`

// nvmfListening, when set (by tests), is called once the target listens.
var nvmfListening func(addr netip.AddrPort)

// nvmfHangup returns the channel on which nvmf-target learns of SIGHUP,
// and the function that stops it (tests replace it).
var nvmfHangup = func() (<-chan os.Signal, func()) {
	ch := make(chan os.Signal, 1)
	if len(cli.HangupSignals) == 0 {
		return ch, func() {}
	}
	signal.Notify(ch, cli.HangupSignals...)
	return ch, func() { signal.Stop(ch) }
}

// nvmfHostConfig, when set (by tests), sees the host's configuration
// before it connects.
var nvmfHostConfig func(cfg nvmf.HostConfig)

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

// parseSize parses 4096, 64k, 256M, 1g.
func parseSize(s string) (int64, error) {
	mul := int64(1)
	switch {
	case strings.HasSuffix(strings.ToLower(s), "k"):
		mul, s = 1<<10, s[:len(s)-1]
	case strings.HasSuffix(strings.ToLower(s), "m"):
		mul, s = 1<<20, s[:len(s)-1]
	case strings.HasSuffix(strings.ToLower(s), "g"):
		mul, s = 1<<30, s[:len(s)-1]
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<50)/mul {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return n * mul, nil
}

func runNvmfTarget(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("nvmf-target")
	var bind, nqn, file, size, cpuprofile, nsList string
	var port, bs, inline, qsize, ioq, mtuBytes int
	var ro, verbose, noSR bool
	var hosts multiFlag
	var sock cli.SocketFlags
	discKATO := 120 * time.Second
	fs.DurationVar(&discKATO, "discovery-kato", discKATO, "")
	fs.StringVar(&bind, "bind", "", "")
	fs.StringVar(&nqn, "nqn", "", "")
	fs.StringVar(&file, "file", "", "")
	fs.StringVar(&nsList, "ns-list", "", "")
	fs.StringVar(&size, "size", "", "")
	var nguid string
	fs.StringVar(&nguid, "nguid", "", "")
	fs.StringVar(&cpuprofile, "cpuprofile", "", "")
	fs.IntVar(&port, "port", nvme.Port, "")
	fs.IntVar(&bs, "block-size", 512, "")
	fs.IntVar(&inline, "inline", 4096, "")
	fs.IntVar(&qsize, "queue-size", 128, "")
	fs.IntVar(&ioq, "io-queues", 8, "")
	fs.IntVar(&mtuBytes, "mtu", 1024, "")
	fs.BoolVar(&ro, "ro", false, "")
	fs.BoolVar(&noSR, "no-selective-repeat", false, "")
	fs.BoolVar(&verbose, "v", false, "")
	fs.Var(&hosts, "host", "")
	cli.AddSocketFlags(fs, &sock)
	err := fs.Parse(args)
	if err == nil && fs.NArg() > 0 {
		err = fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var local netip.Addr
	var nbytes int64
	if err == nil {
		local, err = cli.ParseBind(bind)
		if err == nil && !local.IsValid() {
			err = errors.New("--bind is required")
		}
	}
	if err == nil && nqn == "" {
		err = errors.New("--nqn is required")
	}
	if err == nil && size != "" {
		if nbytes, err = parseSize(size); err != nil {
			err = fmt.Errorf("--size: %v", err)
		} else if nbytes == 0 {
			err = errors.New("--size 0: a namespace needs at least one block")
		}
	}
	if err == nil && file == "" && size == "" {
		err = errors.New("give --file or --size")
	}
	var nguidVal [16]byte
	if err == nil && nguid != "" {
		b, herr := hex.DecodeString(strings.ReplaceAll(nguid, "-", ""))
		if herr != nil || len(b) != 16 || [16]byte(b) == ([16]byte{}) {
			err = fmt.Errorf("--nguid %q: want 32 hex digits, not all zero", nguid)
		} else {
			nguidVal = [16]byte(b)
		}
	}
	switch {
	case err != nil:
	case port <= 0 || port > 65535:
		err = fmt.Errorf("--port %d: want 1..65535", port)
	case bs != 512 && bs != 4096:
		err = fmt.Errorf("--block-size %d: want 512 or 4096", bs)
	case nbytes%int64(bs) != 0:
		// The tail beyond the last whole block would be reported in the
		// size and never reachable.
		err = fmt.Errorf("--size %s: %d bytes is not a multiple of the %d-byte block size (--block-size)", size, nbytes, bs)
	case qsize < 2 || qsize > 1024:
		err = fmt.Errorf("--queue-size %d: want 2..1024", qsize)
	case ioq < 1 || ioq > 1024:
		err = fmt.Errorf("--io-queues %d: want 1..1024", ioq)
	case inline < 0 || inline > 16384:
		err = fmt.Errorf("--inline %d: want 0 (none) .. 16384", inline)
	case discKATO < 0 || discKATO > 0 && discKATO < time.Millisecond || discKATO > nvmf.MaxKATO:
		err = fmt.Errorf("--discovery-kato %v: want 0 (none) or %v .. %v", discKATO, time.Millisecond, nvmf.MaxKATO)
	}
	if discKATO == 0 {
		discKATO = -1 // TargetConfig: none
	}
	if err == nil && inline == 0 {
		inline = -1
	}
	var mtu transport.MTU
	if err == nil {
		mtu, err = nvmfMTU(mtuBytes)
	}
	if code, done := cli.FlagsResult("nvmf-target", nvmfTargetUsage, err, stdout, stderr); done {
		return code
	}
	if cpuprofile != "" {
		f, err := os.Create(cpuprofile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
			if err != nil {
				f.Close()
			}
		}
		if err != nil {
			fmt.Fprintf(stderr, "rocev2d nvmf-target: --cpuprofile: %v\n", err)
			return cli.ExitFail
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	var backend nvmf.Backend
	if file != "" {
		fb, err := nvmf.OpenFile(file, nbytes, ro)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) && size == "" {
				fmt.Fprintf(stderr, "rocev2d nvmf-target: --file: %v (--size creates it)\n", err)
				return cli.ExitFail
			}
			fmt.Fprintf(stderr, "rocev2d nvmf-target: --file: %v\n", err)
			return cli.ExitFail
		}
		defer fb.Close()
		backend = fb
	} else {
		// Mapped, not made: a size beyond the host's memory is an error
		// from mmap, where Go's heap would end the process.
		buf, free, err := []byte(nil), func() {}, error(nil)
		if int64(int(nbytes)) != nbytes {
			err = errors.New("beyond this platform's address space")
		} else {
			buf, free, err = cli.MapMemory(int(nbytes))
		}
		if err != nil {
			fmt.Fprintf(stderr, "rocev2d nvmf-target: --size %s: cannot map %d bytes for the namespace: %v "+
				"(more than this host's memory? --file backs a namespace with a file)\n", size, nbytes, err)
			return cli.ExitFail
		}
		defer free()
		backend = nvmf.MemBackendOn(buf)
	}
	link, err := cli.ListenSocket(local, sock.Options(false, 0), "pick another address with --bind")
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d nvmf-target: %v\n", err)
		return cli.ExitFail
	}
	dev, err := transport.NewDevice(link, transport.DeviceConfig{Congestion: sock.CC.Config()})
	if err != nil {
		link.Close()
		fmt.Fprintf(stderr, "rocev2d nvmf-target: %v\n", err)
		return cli.ExitFail
	}
	defer dev.Close()
	// The namespace's NGUID names its data, not only the NQN: a host that
	// reconnects to a target restarted on other data (a new file, or
	// memory, which a restart empties) must see another namespace, as
	// Linux's host does when the identifiers change, and not read the new
	// data as its old disk.
	var guid [16]byte
	switch {
	case nguid != "":
		guid = nguidVal
	case file != "":
		id, err := fileIdentity(file)
		if err != nil {
			fmt.Fprintf(stderr, "rocev2d nvmf-target: --file %s: %v\n", file, err)
			return cli.ExitFail
		}
		h := sha256.Sum256([]byte(nqn + "\x00" + id))
		copy(guid[:], h[:16])
	default:
		rand.Read(guid[:])
	}
	nss := []*nvmf.Namespace{{ID: 1, Backend: backend, BlockSize: bs, ReadOnly: ro, NGUID: guid}}
	var more *nsListState
	if nsList != "" {
		more = &nsListState{list: nsList, nqn: nqn, blockSize: bs, ro: ro}
		extra, err := more.initial()
		if err != nil {
			fmt.Fprintf(stderr, "rocev2d nvmf-target: --ns-list: %v\n", err)
			return cli.ExitFail
		}
		defer func() { more.close() }()
		nss = append(nss, extra...)
	}
	cfg := nvmf.TargetConfig{Port: uint16(port), InlineDataSize: inline, PathMTU: mtu, MaxQueueSize: qsize, MaxIOQueues: ioq,
		DiscoveryKATO: discKATO, NoSelectiveRepeat: noSR,
		Subsystems: []*nvmf.Subsystem{{NQN: nqn, AllowedHosts: hosts, Namespaces: nss}}}
	var logMu sync.Mutex
	if verbose {
		cfg.Log = func(format string, args ...any) {
			logMu.Lock()
			defer logMu.Unlock()
			fmt.Fprintf(stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
		}
	}
	hup, stopHup := nvmfHangup()
	defer stopHup()
	t, err := nvmf.Listen(dev, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d nvmf-target: %v\n", err)
		return cli.ExitFail
	}
	if nvmfListening != nil {
		nvmfListening(t.Addr())
	}
	u := cli.WatchSIGUSR1(stdout)
	u.Add(local.String(), dev)
	defer u.Stop()
	nsBytes := backend.Size() / int64(bs) * int64(bs)
	fmt.Fprintf(stdout, "nvmf-target: %s on %v, namespace 1: %d bytes in %d-byte blocks%s, nguid %x\n", nqn, t.Addr(), nsBytes, bs,
		map[bool]string{true: " (read-only)", false: ""}[ro], guid)
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-hup:
			// Revalidate the namespace's size (nvmet's revalidate_size).
			changed, err := t.RevalidateNamespace(nqn, 1)
			switch {
			case err != nil:
				fmt.Fprintf(stderr, "rocev2d nvmf-target: SIGHUP: %v\n", err)
			case changed:
				was := nsBytes
				nsBytes = backend.Size() / int64(bs) * int64(bs)
				fmt.Fprintf(stdout, "nvmf-target: namespace 1 resized: %d bytes, was %d; hosts notified\n", nsBytes, was)
			default:
				fmt.Fprintf(stdout, "nvmf-target: namespace 1: %d bytes, unchanged\n", nsBytes)
			}
			if more != nil {
				more.reload(t, stdout, stderr)
			}
		}
	}
	err = t.Close()
	if verbose {
		s := t.Stats()
		fmt.Fprintf(stdout, "target: connections %d rejected %d disconnects %d controllers %d commands %d errors %d malformed %d read_bytes %d write_bytes %d kato_expired %d transport_errors %d buffer_waits %d send_invalidate %d\n",
			s.Connections, s.Rejected, s.Disconnects, s.Controllers, s.Commands, s.Errors, s.Malformed, s.ReadBytes, s.WriteBytes,
			s.KATOExpired, s.TransportErrs, s.Waits, s.Invalidates)
		cli.PrintCounters(stdout, local.String(), dev)
	}
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d nvmf-target: %v\n", err)
	}
	fmt.Fprintln(stdout, "nvmf-target: stopped")
	return cli.ExitOK
}

const nvmfHostUsage = `usage: rocev2d nvmf-host discover --bind ADDR --addr TARGET [--port 4420]
       rocev2d nvmf-host identify --bind ADDR --addr TARGET --nqn NQN
       rocev2d nvmf-host read     --bind ADDR --addr TARGET --nqn NQN --offset N --length N [--out FILE]
       rocev2d nvmf-host write    --bind ADDR --addr TARGET --nqn NQN --offset N (--in FILE | --length N) [--verify]
       rocev2d nvmf-host verify   --bind ADDR --addr TARGET --nqn NQN [--offset N] [--length 64m] [--bs 4k,128k,1m] [--qd 1,4,32]
       rocev2d nvmf-host bench    --bind ADDR --addr TARGET --nqn NQN [--bs 4k,128k] [--qd 1,16] [--time 2s] [--rw read]

An NVMe over Fabrics host on RDMA (package nvmf): connects the admin queue
and I/O queues (one rdma_cm connection each) to a target — Linux's
nvmet-rdma or rocev2d nvmf-target — and moves data with keyed SGLs (the
target RDMA READs the host's writes and RDMA WRITEs its reads), small
writes in the command capsule when the target offers it.

  discover   list the discovery log page's entries
  identify   print the controller's and the namespaces' identify data
  read       read --length bytes at --offset (multiples of the block size)
             to --out (default stdout)
  write      write --in's bytes (or --length random bytes) at --offset;
             --verify reads them back and compares
  verify     split --length bytes at --offset into one region per block
             size and queue depth (--bs, --qd; default 64m over 4k,128k,1m
             x 1,4,32; a region's size grows with the square root of its
             block size), write random data to each in --bs commands with
             --qd of them in flight, read it back the same way and compare
             every byte; then read the whole span back in MDTS-sized
             commands and compare again
  bench      for each block size and queue depth: random reads (--rw read),
             writes (write) or both (rw, 50/50) for --time; prints IOPS and MB/s

options:
  --bind ADDR      local address for RoCEv2 (UDP 4791); required
  --addr TARGET    the target's address (required)
  --port N         rdma_cm port (default 4420)
  --nqn NQN        the subsystem (identify, read, write, verify, bench)
  --nsid N         namespace (default the first active one)
  --io-queues N    I/O queues (default 4)
  --queue-size N   entries per I/O queue (default 128)
  --no-inline      never send write data in the command capsule
  --invalidate     a key of its own for every data command, which the
                   target is asked to invalidate (SEND with Invalidate;
                   keyed SGL subtype 0xF, as Linux's host does)
  --selective-repeat  offer selective repeat on every queue (a rocev2
                   target accepts it; others answer go-back-N): loss costs
                   far less than go-back-N's ACK timeouts (docs/NVMEOF.md)
  --mtu N          path MTU the queues ask for: 256..4096 (default 1024;
                   the target rejects more than its own --mtu)
  --range BYTES    bench: the span of the namespace it touches (default all)
  --ctrl-loss-tmo DUR  how long to keep reconnecting after the controller is
                   lost (default 60s; 0: fail at once); a lost controller and
                   each attempt are printed on stderr
  --io-timeout DUR how long a command on an I/O queue may go unanswered
                   before the host reconnects and sends it again (default
                   30s, Linux's io_timeout; 0: forever)
  --admin-timeout DUR  the same for the admin queue (Connect, Identify,
                   Property Get/Set, Get Log Page, ...; default 60s, Linux's
                   admin_timeout; 0: forever)
  -v               log connection events; print the device's counters
` + cli.SocketUsage + `
Exit status: 0 success, 1 failure (connection refused or lost, an NVMe
error status, a data mismatch), 2 bad usage.
`

func runNvmfHost(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			fmt.Fprint(stdout, nvmfHostUsage)
			return cli.ExitOK
		}
		fmt.Fprintf(stderr, "rocev2d nvmf-host: missing subcommand\n%s", nvmfHostUsage)
		return cli.ExitUsage
	}
	sub := args[0]
	switch sub {
	case "discover", "identify", "read", "write", "verify", "bench":
	default:
		fmt.Fprintf(stderr, "rocev2d nvmf-host: unknown subcommand %q\n(see `rocev2d help nvmf-host`)\n", sub)
		return cli.ExitUsage
	}
	fs := cli.NewFlagSet("nvmf-host")
	var bind, addr, nqn, out, in, bsList, qdList, rw, length, offset, span string
	var port, nsid, ioq, qsize, mtuBytes int
	var verbose, verify, noInline, invalidate, sr bool
	var dur time.Duration
	var sock cli.SocketFlags
	fs.StringVar(&bind, "bind", "", "")
	fs.StringVar(&addr, "addr", "", "")
	fs.StringVar(&nqn, "nqn", "", "")
	fs.StringVar(&out, "out", "", "")
	fs.StringVar(&in, "in", "", "")
	fs.StringVar(&bsList, "bs", "4k,128k", "")
	fs.StringVar(&qdList, "qd", "1,16", "")
	fs.StringVar(&rw, "rw", "read", "")
	fs.StringVar(&length, "length", "", "")
	fs.StringVar(&offset, "offset", "0", "")
	fs.StringVar(&span, "range", "", "")
	fs.IntVar(&port, "port", nvme.Port, "")
	fs.IntVar(&nsid, "nsid", 0, "")
	fs.IntVar(&ioq, "io-queues", 4, "")
	fs.IntVar(&qsize, "queue-size", 128, "")
	fs.IntVar(&mtuBytes, "mtu", 1024, "")
	fs.BoolVar(&verbose, "v", false, "")
	fs.BoolVar(&verify, "verify", false, "")
	fs.BoolVar(&noInline, "no-inline", false, "")
	fs.BoolVar(&invalidate, "invalidate", false, "")
	fs.BoolVar(&sr, "selective-repeat", false, "")
	fs.DurationVar(&dur, "time", 2*time.Second, "")
	lossTmo := 60 * time.Second
	fs.DurationVar(&lossTmo, "ctrl-loss-tmo", lossTmo, "")
	ioTmo := 30 * time.Second
	fs.DurationVar(&ioTmo, "io-timeout", ioTmo, "")
	adminTmo := 60 * time.Second
	fs.DurationVar(&adminTmo, "admin-timeout", adminTmo, "")
	cli.AddSocketFlags(fs, &sock)
	err := fs.Parse(args[1:])
	var local, peer netip.Addr
	if err == nil && fs.NArg() > 0 {
		err = fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err == nil {
		if local, err = cli.ParseBind(bind); err == nil && !local.IsValid() {
			err = errors.New("--bind is required")
		}
	}
	if err == nil {
		if addr == "" {
			err = errors.New("--addr (the target's address) is required")
		} else {
			peer, err = cli.ParseIP("--addr", addr, "--port")
		}
	}
	if err == nil && sub != "discover" && nqn == "" {
		err = errors.New("--nqn is required")
	}
	if err == nil && rw != "read" && rw != "write" && rw != "rw" {
		err = fmt.Errorf("--rw %q (read, write or rw)", rw)
	}
	var mtu transport.MTU
	if err == nil {
		mtu, err = nvmfMTU(mtuBytes)
	}
	if err == nil {
		err = nvmfHostChecks(sub, ioq, qsize, port, dur, lossTmo, ioTmo, adminTmo)
	}
	var off, n, limit int64
	if err == nil && (sub == "read" || sub == "write" || sub == "verify") {
		if off, err = parseSize(offset); err != nil {
			err = fmt.Errorf("--offset: %v", err)
		}
	}
	if err == nil && (sub == "read" || sub == "write" || sub == "verify") {
		if sub == "verify" && length == "" {
			length = "64m"
		}
		switch {
		case sub == "write" && in != "" && length != "":
			err = errors.New("--in and --length: give one (the file's bytes, or N random bytes)")
		case sub == "write" && in != "":
		case length == "":
			err = fmt.Errorf("--length is required (%s)", map[string]string{"read": "bytes to read", "write": "or --in FILE"}[sub])
		default:
			if n, err = parseSize(length); err != nil || n == 0 || n > 1<<30 {
				err = fmt.Errorf("--length %q: want 1 byte to 1 GiB", length)
			}
		}
	}
	if err == nil && span != "" {
		if limit, err = parseSize(span); err != nil || limit == 0 {
			err = fmt.Errorf("--range %q: want a size above 0", span)
		}
	}
	var bss, qds []int
	if sub == "verify" {
		if !isSet(fs, "bs") {
			bsList = "4k,128k,1m"
		}
		if !isSet(fs, "qd") {
			qdList = "1,4,32"
		}
	}
	if err == nil && (sub == "bench" || sub == "verify") {
		bss, err = parseList("--bs", bsList, 1<<30)
		if err == nil {
			qds, err = parseList("--qd", qdList, nvmfMaxQD)
		}
	}
	if code, done := cli.FlagsResult("nvmf-host", nvmfHostUsage, err, stdout, stderr); done {
		return code
	}
	target := netip.AddrPortFrom(peer, uint16(port))
	fail := func(err error) int {
		fmt.Fprintf(stderr, "rocev2d nvmf-host %s: %v\n", sub, nvmfHostErr(ctx, err, target, local, nqn))
		return cli.ExitFail
	}
	link, err := cli.ListenSocket(local, sock.Options(false, 0), "pick another address with --bind")
	if err != nil {
		return fail(err)
	}
	dev, err := transport.NewDevice(link, transport.DeviceConfig{Congestion: sock.CC.Config()})
	if err != nil {
		link.Close()
		return fail(err)
	}
	defer dev.Close()
	if verbose {
		defer cli.PrintCounters(stdout, local.String(), dev)
	}
	cfg := &nvmf.HostConfig{IOQueues: ioq, QueueSize: qsize, NoInline: noInline, PathMTU: mtu, RemoteInvalidate: invalidate,
		SelectiveRepeat: sr, CtrlLossTimeout: lossTmo, IOTimeout: ioTmo, AdminTimeout: adminTmo}
	if lossTmo == 0 {
		cfg.CtrlLossTimeout = -1 // fail at once
	}
	if ioTmo == 0 {
		cfg.IOTimeout = -1 // wait forever
	}
	if adminTmo == 0 {
		cfg.AdminTimeout = -1 // wait forever
	}
	if nvmfHostConfig != nil {
		nvmfHostConfig(*cfg)
	}
	// A lost controller, each reconnection attempt and the reconnection
	// are always told: without them a run waiting for its target is silent.
	cfg.Log = func(format string, args ...any) { fmt.Fprintf(stderr, format+"\n", args...) }
	if sub == "discover" {
		es, err := nvmf.Discover(ctx, dev, target, cfg)
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "Discovery Log Number of Records %d\n", len(es))
		for i, e := range es {
			fmt.Fprintf(stdout, "=====Discovery Log Entry %d======\ntrtype:  %s\nadrfam:  %s\nsubtype: %s\nportid:  %d\ntrsvcid: %s\nsubnqn:  %s\ntraddr:  %s\n",
				i, map[uint8]string{nvme.TrtypeRDMA: "rdma", nvme.TrtypeTCP: "tcp"}[e.TrType],
				map[uint8]string{nvme.AdrfamIPv4: "ipv4", nvme.AdrfamIPv6: "ipv6"}[e.AdrFam],
				map[uint8]string{nvme.SubtypeNVMe: "nvme subsystem", nvme.SubtypeDisc: "discovery subsystem"}[e.SubType],
				e.PortID, e.TrSvcID, e.SubNQN, e.TrAddr)
		}
		return cli.ExitOK
	}
	h, err := nvmf.Connect(ctx, dev, target, nqn, cfg)
	if err != nil {
		return fail(err)
	}
	defer h.Close()
	if verbose || sub == "verify" {
		defer func() {
			s := h.Stats()
			fmt.Fprintf(stdout, "host: commands %d errors %d reconnects %d keep_alives %d requeued %d remote_invalidations %d local_invalidations %d\n",
				s.Commands, s.Errors, s.Reconnects, s.KeepAlives, s.Requeued, s.RemoteInvalidations, s.LocalInvalidations)
		}()
	}
	if nsid == 0 {
		ids, err := h.ActiveNamespaces(ctx)
		if err != nil {
			return fail(err)
		}
		if len(ids) == 0 {
			return fail(errors.New("the controller has no active namespace"))
		}
		nsid = int(ids[0])
	}
	ns, err := h.Namespace(ctx, uint32(nsid))
	if err != nil {
		return fail(err)
	}
	switch sub {
	case "identify":
		id, _ := h.Identify(ctx)
		ids, _ := h.ActiveNamespaces(ctx)
		fmt.Fprintf(stdout, "sn     : %s\nmn     : %s\nfr     : %s\ncntlid : %d\nver    : %d.%d\nmdts   : %d\nkas    : %d\nmaxcmd : %d\nnn     : %d\nsgls   : %#x\nioccsz : %d\niorcsz : %d\nsubnqn : %s\nio queues: %d\nnamespaces: %v\n",
			id.SN, id.MN, id.FR, id.CNTLID, id.VER>>16, id.VER>>8&0xff, id.MDTS, id.KAS, id.MAXCMD, id.NN, id.SGLS, id.IOCCSZ, id.IORCSZ, id.SubNQN, h.IOQueues(), ids)
		fmt.Fprintf(stdout, "namespace %d: %d bytes, %d-byte blocks%s\n", ns.ID(), ns.Size(), ns.BlockSize(), map[bool]string{true: ", read-only"}[ns.ReadOnly()])
		return cli.ExitOK
	case "read", "write":
		var data []byte
		if sub == "write" && in != "" {
			if data, err = os.ReadFile(in); err != nil {
				return fail(err)
			}
		} else {
			data = make([]byte, n)
			if sub == "write" {
				rand.Read(data)
			}
		}
		start := time.Now()
		if sub == "read" {
			if _, err := ns.ReadAtContext(ctx, data, off); err != nil {
				return fail(err)
			}
			w := stdout
			if out != "" {
				f, err := os.Create(out)
				if err != nil {
					return fail(err)
				}
				defer f.Close()
				w = f
			}
			if _, err := w.Write(data); err != nil {
				return fail(err)
			}
			if out != "" {
				fmt.Fprintf(stdout, "read %d bytes at %d in %v\n", len(data), off, time.Since(start).Round(time.Microsecond))
			}
			return cli.ExitOK
		}
		if _, err := ns.WriteAtContext(ctx, data, off); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "wrote %d bytes at %d in %v\n", len(data), off, time.Since(start).Round(time.Microsecond))
		if verify {
			back := make([]byte, len(data))
			if _, err := ns.ReadAtContext(ctx, back, off); err != nil {
				return fail(err)
			}
			if !bytes.Equal(back, data) {
				return fail(errors.New("read back differs from what was written"))
			}
			fmt.Fprintln(stdout, "verified")
		}
		return cli.ExitOK
	}
	if sub == "verify" {
		if err := nvmfVerify(ctx, stdout, ns, off, n, bss, qds); err != nil {
			return fail(err)
		}
		return cli.ExitOK
	}
	if limit == 0 || limit > ns.Size() {
		limit = ns.Size()
	}
	fmt.Fprintf(stdout, "%-8s %-4s %-6s %12s %10s %12s\n", "bs", "qd", "rw", "IOPS", "MB/s", "avg_lat_us")
	for _, bs := range bss {
		for _, qd := range qds {
			r, err := nvmfBench(ctx, ns, bs, qd, rw, dur, limit)
			if err != nil {
				return fail(err)
			}
			fmt.Fprintf(stdout, "%-8d %-4d %-6s %12.0f %10.1f %12.1f\n", bs, qd, rw, r.iops, r.mbps, r.latUs)
		}
	}
	return cli.ExitOK
}

// nvmfMTU converts --mtu (bytes) to a path MTU.
func nvmfMTU(b int) (transport.MTU, error) {
	m, ok := transport.MTUFromBytes(b)
	if !ok {
		return 0, fmt.Errorf("--mtu %d: must be 256, 512, 1024, 2048 or 4096", b)
	}
	return m, nil
}

// nvmfHostChecks checks nvmf-host's numeric flags before anything connects.
func nvmfHostChecks(sub string, ioq, qsize, port int, dur, lossTmo, ioTmo, adminTmo time.Duration) error {
	switch {
	case ioq < 1 || ioq > 1024:
		return fmt.Errorf("--io-queues %d: want 1..1024", ioq)
	case qsize < 2 || qsize > 1024:
		return fmt.Errorf("--queue-size %d: want 2..1024", qsize)
	case port < 1 || port > 65535:
		return fmt.Errorf("--port %d: want 1..65535", port)
	case sub == "bench" && dur <= 0:
		return fmt.Errorf("--time %v: want a duration above 0", dur)
	case lossTmo < 0:
		return fmt.Errorf("--ctrl-loss-tmo %v: want 0 or more", lossTmo)
	case ioTmo < 0:
		return fmt.Errorf("--io-timeout %v: want 0 or more", ioTmo)
	case adminTmo < 0:
		return fmt.Errorf("--admin-timeout %v: want 0 or more", adminTmo)
	}
	return nil
}

// parseList parses the list of flag name (--bs, --qd): sizes of 1 to max
// each (4096, 64k, 1m).
func parseList(name, s string, max int64) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := parseSize(strings.TrimSpace(f))
		if err != nil || v <= 0 || v > max {
			return nil, fmt.Errorf("%s %q: %q is not a number from 1 to %d (the list is comma-separated)", name, s, f, max)
		}
		out = append(out, int(v))
	}
	return out, nil
}

// nvmfMaxQD bounds --qd: the commands a bench or verify keeps in flight,
// one goroutine each (a million of them starved the keep-alive and made
// the process deaf to SIGTERM); four times Linux's largest I/O queue.
const nvmfMaxQD = 4096

// nvmfHostErr is err with what it means when the command line can say
// more than the library: the context's cause when a signal or a timeout
// ended the run ("context canceled" before), no answer from the target, a
// Connect the target refused.
func nvmfHostErr(ctx context.Context, err error, target netip.AddrPort, local netip.Addr, nqn string) error {
	var st nvme.Status
	switch {
	case ctx.Err() != nil:
		if cause := context.Cause(ctx); cause != nil && !strings.Contains(err.Error(), cause.Error()) {
			return fmt.Errorf("%w (%v)", err, cause)
		}
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w\n  (no answer from %v: is a target (rocev2d nvmf-target, Linux's nvmet-rdma) listening on that address and --port, "+
			"and does UDP 4791 reach it from --bind %v?)", err, target, local)
	case errors.As(err, &st) && st.Code() == nvme.StatusConnectInvalidParam:
		return fmt.Errorf("%w\n  (the target refused the Connect: has it a subsystem --nqn %q? `rocev2d nvmf-host discover` lists them; or is --queue-size above its own?)", err, nqn)
	case errors.As(err, &st) && st.Code() == nvme.StatusConnectInvalidHost:
		return fmt.Errorf("%w\n  (the target does not allow this host's NQN: see its --host list)", err)
	}
	return err
}

type benchResult struct{ iops, mbps, latUs float64 }

// nvmfBench runs qd goroutines doing bs-byte random I/O for d.
func nvmfBench(ctx context.Context, ns *nvmf.HostNamespace, bs, qd int, rw string, d time.Duration, limit int64) (benchResult, error) {
	if bs%ns.BlockSize() != 0 || int64(bs) > limit {
		return benchResult{}, fmt.Errorf("block size %d does not fit (namespace blocks of %d, range %d)", bs, ns.BlockSize(), limit)
	}
	slots := limit / int64(bs)
	var ops atomic.Int64
	var lat atomic.Int64
	var firstErr atomic.Value
	bctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now()
	for g := 0; g < qd; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, bs)
			seed := uint64(g)*0x9e3779b97f4a7c15 + 1
			for i := 0; bctx.Err() == nil; i++ {
				seed ^= seed << 13
				seed ^= seed >> 7
				seed ^= seed << 17
				off := int64(seed%uint64(slots)) * int64(bs)
				t0 := time.Now()
				var err error
				if rw == "write" || (rw == "rw" && i%2 == 1) {
					_, err = ns.WriteAtContext(ctx, buf, off)
				} else {
					_, err = ns.ReadAtContext(ctx, buf, off)
				}
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					cancel()
					return
				}
				lat.Add(int64(time.Since(t0)))
				ops.Add(1)
			}
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	if err, _ := firstErr.Load().(error); err != nil {
		return benchResult{}, err
	}
	n := float64(ops.Load())
	r := benchResult{iops: n / el, mbps: n * float64(bs) / el / 1e6}
	if n > 0 {
		r.latUs = float64(lat.Load()) / n / 1e3
	}
	return r, nil
}

// isSet reports whether the flag was given on the command line.
func isSet(fs interface{ Visit(func(*flag.Flag)) }, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// nvmfVerify writes and reads back [off, off+n) of ns in one region per
// (block size, queue depth) pair, every byte compared, then reads the
// whole span back once more.
func nvmfVerify(ctx context.Context, w io.Writer, ns *nvmf.HostNamespace, off, n int64, bss, qds []int) error {
	maxBS := 0
	for _, bs := range bss {
		if bs%ns.BlockSize() != 0 {
			return fmt.Errorf("block size %d is not a multiple of the namespace's %d", bs, ns.BlockSize())
		}
		maxBS = max(maxBS, bs)
	}
	if off%int64(ns.BlockSize()) != 0 || off+n > ns.Size() {
		return fmt.Errorf("--offset %d --length %d does not fit the namespace (%d bytes, %d-byte blocks)", off, n, ns.Size(), ns.BlockSize())
	}
	// Region sizes grow with the square root of the block size (a 4 KiB
	// region of a 64 MiB sweep is about 1 MiB, 256 commands; a 1 MiB one
	// about 15 MiB), each a whole number of its blocks, the last taking
	// what is left.
	combos := len(bss) * len(qds)
	weight := func(bs int) float64 { return math.Sqrt(float64(bs) / 4096) }
	total := 0.0
	for _, bs := range bss {
		total += weight(bs) * float64(len(qds))
	}
	sizes := make([]int64, 0, combos)
	used := int64(0)
	for _, bs := range bss {
		for range qds {
			r := int64(float64(n)*weight(bs)/total) / int64(bs) * int64(bs)
			if r == 0 {
				return fmt.Errorf("--length %d too short for %d regions (block size %d)", n, combos, bs)
			}
			sizes = append(sizes, r)
			used += r
		}
	}
	sizes[len(sizes)-1] += n - used
	want := make([]byte, n)
	rand.Read(want)
	// run moves [lo, hi) of the span in bs-byte commands (the last may be
	// shorter), qd of them in flight at once.
	run := func(lo, hi int64, bs, qd int, write bool, got []byte) error {
		var next atomic.Int64
		next.Store(lo)
		var firstErr atomic.Value
		var wg sync.WaitGroup
		for g := 0; g < qd; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					o := next.Add(int64(bs)) - int64(bs)
					if o >= hi || firstErr.Load() != nil {
						return
					}
					e := min(o+int64(bs), hi)
					var err error
					if write {
						_, err = ns.WriteAtContext(ctx, want[o:e], off+o)
					} else {
						_, err = ns.ReadAtContext(ctx, got[o:e], off+o)
					}
					if err != nil {
						firstErr.CompareAndSwap(nil, fmt.Errorf("%s %d bytes at %d (bs %d, qd %d): %w",
							map[bool]string{true: "write", false: "read"}[write], e-o, off+o, bs, qd, err))
						return
					}
				}
			}()
		}
		wg.Wait()
		if err, _ := firstErr.Load().(error); err != nil {
			return err
		}
		return nil
	}
	got := make([]byte, n)
	start := time.Now()
	lo := int64(0)
	i := 0
	for _, bs := range bss {
		for _, qd := range qds {
			hi := lo + sizes[i]
			i++
			t0 := time.Now()
			if err := run(lo, hi, bs, qd, true, nil); err != nil {
				return err
			}
			t1 := time.Now()
			if err := run(lo, hi, bs, qd, false, got); err != nil {
				return err
			}
			t2 := time.Now()
			if j := firstDiff(got[lo:hi], want[lo:hi]); j >= 0 {
				return fmt.Errorf("bs %d qd %d: the byte at %d read back differs from what was written", bs, qd, off+lo+int64(j))
			}
			fmt.Fprintf(w, "verified bs=%d qd=%d offset=%d bytes=%d write_MB/s=%.1f read_MB/s=%.1f\n", bs, qd, off+lo, hi-lo,
				float64(hi-lo)/t1.Sub(t0).Seconds()/1e6, float64(hi-lo)/t2.Sub(t1).Seconds()/1e6)
			lo = hi
		}
	}
	// The whole span once more: no region's I/O touched another's.
	clear(got)
	if err := run(0, n, ns.MaxTransfer(), 4, false, got); err != nil {
		return err
	}
	if j := firstDiff(got, want); j >= 0 {
		return fmt.Errorf("reading the whole span back: the byte at %d differs from what was written", off+int64(j))
	}
	fmt.Fprintf(w, "verified all %d bytes at %d in %d regions (bs %v x qd %v) in %v\n", n, off, combos, bss, qds, time.Since(start).Round(time.Millisecond))
	return nil
}

// firstDiff returns the index of the first byte where a and b differ, or -1.
func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}
