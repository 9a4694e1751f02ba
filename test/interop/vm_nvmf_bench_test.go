//go:build linux

package interop

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/test/interop/agentproto"
)

// BenchmarkVMNvmf boots the two VMs of BenchmarkVM once and measures the
// VM's Linux NVMe-oF host (nvme-rdma over rxe, in vm1) against two targets
// in vm0 with the same memory backing and 4 KiB blocks: (a) Linux's
// nvmet-rdma on null_blk memory_backed, and (b) rocev2d nvmf-target on a
// memory namespace, with rdma_rxe unloaded in vm0 (both bind UDP 4791).
// Each round connects, fills the first 64 MiB, then runs vmtools/dio:
// 4 KiB random reads at queue depth 16 (IOPS) and 128 KiB sequential
// reads at queue depth 4 (MB/s), within those 64 MiB, and disconnects.
// The rounds interleave (a) and (b) in one boot; the summary reports each
// round and the means, with ours / kernel.
//
//	sudo ROCEV2_INTEROP=1 go test -run '^$' -bench BenchmarkVMNvmf -benchtime 1x -timeout 30m -v ./test/interop/
//
// ROCEV2_VMBENCH_ROUNDS sets the rounds (default 3), ROCEV2_VMNVMF_TIME
// each dio run's length (default 5s), ROCEV2_VMBENCH_ALT=DIR adds another
// checkout's rocev2d as a third target in every round, and
// ROCEV2_VMNVMF_PROFILE=DIR first profiles each rocev2d build's target
// during the 4 KiB reads (pprof files in DIR; ROCEV2_VMNVMF_PROFILE_BS=128k
// profiles the 128 KiB reads instead), and ROCEV2_VMNVMF_TARGETLOG=1 adds
// the last lines of each rocev2d target's output (-v) to its row. Each row also reports, per
// I/O, the packets and bytes on vm1's eth0 each way and vm0's busy CPU.
func BenchmarkVMNvmf(b *testing.B) {
	cfg, img := prepareBench(b)
	cache := cfg.CacheDir
	// ROCEV2_VMBENCH_ALT=DIR (another checkout) adds its rocev2d as a
	// third target, "alt", in every round: two builds in one boot.
	alt := os.Getenv("ROCEV2_VMBENCH_ALT")
	pimg, err := PairImage(cfg, img, alt)
	if err != nil {
		b.Fatal(err)
	}
	runDir := filepath.Join(cache, "run-vm-nvmf")
	os.RemoveAll(runDir)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	p, err := StartVMPair(ctx, pimg, runDir, b.Logf)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	b.Logf("pair: boot %.1fs", p.BootTime.Seconds())
	rounds := 3
	if s := os.Getenv("ROCEV2_VMBENCH_ROUNDS"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			rounds = n
		}
	}
	dur := "5s"
	if s := os.Getenv("ROCEV2_VMNVMF_TIME"); s != "" {
		if _, err := time.ParseDuration(s); err == nil {
			dur = s
		}
	}
	nb := &nvmfBench{p: p, dur: dur, res: map[string][]float64{}}
	if err := nb.setupKernelTarget(ctx); err != nil {
		b.Fatal(err)
	}
	kinds := []string{"kernel", "rocev2d"}
	if alt != "" {
		kinds = append(kinds, "alt")
	}
	var rows []string
	// ROCEV2_VMNVMF_PROFILE=DIR: first a round with this checkout's
	// target under --cpuprofile during the 4 KiB reads only (the alt
	// build may predate the flag); the profile lands in
	// DIR/nvmf-target-rocev2d-4k.pprof.
	// ROCEV2_VMNVMF_PROFILE_BS=128k profiles the 128 KiB sequential
	// reads instead (file nvmf-target-rocev2d-128k.pprof).
	nb.profile = "4k"
	if os.Getenv("ROCEV2_VMNVMF_PROFILE_BS") == "128k" {
		nb.profile = "128k"
	}
	if dir := os.Getenv("ROCEV2_VMNVMF_PROFILE"); dir != "" {
		for _, kind := range []string{"rocev2d"} {
			b.Run("profile/"+kind, func(b *testing.B) {
				k4, k128, prof, _, err := nb.round(ctx, kind, true)
				if err != nil {
					b.Fatal(err)
				}
				f := filepath.Join(dir, "nvmf-target-"+kind+"-"+nb.profile+".pprof")
				if err := os.WriteFile(f, prof, 0o644); err != nil {
					b.Fatal(err)
				}
				if nb.profile == "128k" {
					rows = append(rows, fmt.Sprintf("%-12s 128k_seqread_qd4 %7.2f MB/s (profiled: %s, %d bytes)  [128k %v]", "profile/"+kind, k128.mbps, f, len(prof), k128))
				} else {
					rows = append(rows, fmt.Sprintf("%-12s 4k_randread_qd16 %8.0f IOPS (profiled: %s, %d bytes)  [4k %v]", "profile/"+kind, k4.iops, f, len(prof), k4))
				}
			})
		}
	}
	for round := 1; round <= rounds; round++ {
		for _, kind := range kinds {
			name := fmt.Sprintf("r%d/%s", round, kind)
			b.Run(name, func(b *testing.B) {
				k4, k128, _, note, err := nb.round(ctx, kind, false)
				if err != nil {
					rows = append(rows, fmt.Sprintf("%-12s FAILED: %s", name, strings.SplitN(err.Error(), "\n", 2)[0]))
					b.Fatal(err)
				}
				nb.res[kind+"/iops"] = append(nb.res[kind+"/iops"], k4.iops)
				nb.res[kind+"/mbps"] = append(nb.res[kind+"/mbps"], k128.mbps)
				rows = append(rows, fmt.Sprintf("%-12s 4k_randread_qd16 %8.0f IOPS   128k_seqread_qd4 %7.2f MB/s   %s\n             [4k %v]\n             [128k %v]",
					name, k4.iops, k128.mbps, note, k4, k128))
				b.ReportMetric(k4.iops, "4k-IOPS")
				b.ReportMetric(k128.mbps, "128k-MB/s")
			})
		}
	}
	mean := func(k string) float64 {
		v := nb.res[k]
		if len(v) == 0 {
			return 0
		}
		s := 0.0
		for _, x := range v {
			s += x
		}
		return s / float64(len(v))
	}
	ratio := func(a, z float64) string {
		if z == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2fx", a/z)
	}
	sum := fmt.Sprintf("means: kernel %.0f IOPS %.2f MB/s; rocev2d %.0f IOPS %.2f MB/s; rocev2d/kernel: 4k %s, 128k %s",
		mean("kernel/iops"), mean("kernel/mbps"), mean("rocev2d/iops"), mean("rocev2d/mbps"),
		ratio(mean("rocev2d/iops"), mean("kernel/iops")), ratio(mean("rocev2d/mbps"), mean("kernel/mbps")))
	if alt != "" {
		sum += fmt.Sprintf("\n       alt %.0f IOPS %.2f MB/s; alt/kernel: 4k %s, 128k %s; alt/rocev2d: 4k %s, 128k %s",
			mean("alt/iops"), mean("alt/mbps"), ratio(mean("alt/iops"), mean("kernel/iops")), ratio(mean("alt/mbps"), mean("kernel/mbps")),
			ratio(mean("alt/iops"), mean("rocev2d/iops")), ratio(mean("alt/mbps"), mean("rocev2d/mbps")))
	}
	b.Logf("rounds (one boot, in order):\n%s\n%s", strings.Join(rows, "\n"), sum)
}

const vmNvmfNQN = "nqn.2026-12.io.rocev2:vmbench"

// nvmfBench holds one BenchmarkVMNvmf run.
type nvmfBench struct {
	p       *VMPair
	dur     string
	profile string // the profile round's reads: "4k" or "128k"
	res     map[string][]float64
}

// setupKernelTarget creates nvmet's subsystem on null_blk in vm0 (its
// port is added for each kernel round and removed after it).
func (nb *nvmfBench) setupKernelTarget(ctx context.Context) error {
	r, err := nb.p.VM[0].Run(ctx, `set -e
mount -t configfs none /sys/kernel/config 2>/dev/null || true
rmmod null_blk 2>/dev/null || true # loaded at boot without a memory backing
insmod $(find /lib/modules -name 'null_blk.ko*' | head -1) memory_backed=1 gb=1 nr_devices=1 bs=4096
C=/sys/kernel/config/nvmet; N=`+vmNvmfNQN+`
mkdir $C/subsystems/$N && echo 1 > $C/subsystems/$N/attr_allow_any_host
mkdir $C/subsystems/$N/namespaces/1 && echo -n /dev/nullb0 > $C/subsystems/$N/namespaces/1/device_path
echo -n 1 > $C/subsystems/$N/namespaces/1/enable
echo "nvmet subsystem ready"`, time.Minute)
	if err != nil || r.Exit != 0 {
		return fmt.Errorf("vm0: nvmet setup: exit %d %v\n%s", r.Exit, err, r.Output)
	}
	return nil
}

var reDio = regexp.MustCompile(`(?m)^dio bs=(\d+) qd=\d+ rw=\S+ ios=(\d+) secs=\S+ IOPS=([0-9.]+) MB/s=([0-9.]+)$`)

// dioStat is one dio run of a round with what the wire and vm0's CPU
// did meanwhile: vm1's eth0 packets and bytes each way (the target's
// traffic: vm1 talks to nobody else), vm0's busy CPU time (user, system,
// irq and softirq jiffies of /proc/stat, in ms) and the I/Os dio did.
type dioStat struct {
	ios              float64
	txPkts, rxPkts   float64 // vm1 → target, target → vm1
	txBytes, rxBytes float64
	busyMs, idleMs   float64 // vm0
	busy1Ms, idle1Ms float64 // vm1 (the host)
	iops, mbps       float64
}

func (d dioStat) String() string {
	if d.ios == 0 {
		return "-"
	}
	return fmt.Sprintf("pkts/io %.2f out %.2f in (%.0f+%.0f B/io), vm0 busy %.0f%% = %.0f us/io, vm1 busy %.0f%% = %.0f us/io",
		d.txPkts/d.ios, d.rxPkts/d.ios, d.txBytes/d.ios, d.rxBytes/d.ios,
		100*d.busyMs/max(d.busyMs+d.idleMs, 1), 1000*d.busyMs/d.ios,
		100*d.busy1Ms/max(d.busy1Ms+d.idle1Ms, 1), 1000*d.busy1Ms/d.ios)
}

const vmNetStat = `cd /sys/class/net/eth0/statistics && echo "net $(cat tx_packets) $(cat rx_packets) $(cat tx_bytes) $(cat rx_bytes)"`
const vmCPUStat = `head -1 /proc/stat`

var reCPU = regexp.MustCompile(`(?m)^cpu .*$`)

var reNet = regexp.MustCompile(`net (\d+) (\d+) (\d+) (\d+)`)

// parseNet returns vm1's eth0 tx/rx packets and bytes.
func parseNet(out string) [4]float64 {
	var v [4]float64
	if m := reNet.FindStringSubmatch(out); m != nil {
		for i := range v {
			v[i], _ = strconv.ParseFloat(m[i+1], 64)
		}
	}
	return v
}

// parseCPU returns busy and idle ms from /proc/stat's cpu line (USER_HZ 100).
func parseCPU(out string) (busy, idle float64) {
	f := strings.Fields(out)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, 0
	}
	n := func(i int) float64 { v, _ := strconv.ParseFloat(f[i], 64); return v * 10 }
	busy = n(1) + n(2) + n(3) + n(6) + n(7)
	idle = n(4) + n(5)
	return busy, idle
}

// dio runs one dio command in vm1 with the counters around it.
func (nb *nvmfBench) dio(ctx context.Context, args string) (dioStat, string, error) {
	p := nb.p
	var d dioStat
	c0, _ := p.VM[0].Run(ctx, vmCPUStat, time.Minute)
	r, err := p.VM[1].Run(ctx, vmNetStat+"; "+vmCPUStat+"; dio "+args+" /dev/nvme0n1; rc=$?; "+vmCPUStat+"; "+vmNetStat+"; exit $rc", 5*time.Minute)
	c1, _ := p.VM[0].Run(ctx, vmCPUStat, time.Minute)
	if err != nil || r.Exit != 0 {
		return d, r.Output, fmt.Errorf("vm1: dio %s: exit %d %v\n%s", args, r.Exit, err, r.Output)
	}
	m := reDio.FindStringSubmatch(r.Output)
	if m == nil {
		return d, r.Output, fmt.Errorf("vm1: no dio result\n%s", r.Output)
	}
	d.ios, _ = strconv.ParseFloat(m[2], 64)
	d.iops, _ = strconv.ParseFloat(m[3], 64)
	d.mbps, _ = strconv.ParseFloat(m[4], 64)
	nets := reNet.FindAllString(r.Output, -1)
	if len(nets) == 2 {
		a, z := parseNet(nets[0]), parseNet(nets[1])
		d.txPkts, d.rxPkts, d.txBytes, d.rxBytes = z[0]-a[0], z[1]-a[1], z[2]-a[2], z[3]-a[3]
	}
	if cpus := reCPU.FindAllString(r.Output, -1); len(cpus) == 2 {
		b0, i0 := parseCPU(cpus[0])
		b1, i1 := parseCPU(cpus[1])
		d.busy1Ms, d.idle1Ms = b1-b0, i1-i0
	}
	b0, i0 := parseCPU(c0.Output)
	b1, i1 := parseCPU(c1.Output)
	d.busyMs, d.idleMs = b1-b0, i1-i0
	return d, r.Output, nil
}

// round runs one round against kind's target ("kernel", "rocev2d" or
// "alt", the ROCEV2_VMBENCH_ALT build): connect from vm1, fill, the two
// dio runs, disconnect. With profile set (rocev2d and alt only), the
// round runs only the 4 KiB reads with the target under --cpuprofile and
// returns the profile's bytes.
func (nb *nvmfBench) round(ctx context.Context, kind string, profile bool) (k4, k128 dioStat, prof []byte, note string, err error) {
	p := nb.p
	vm0 := p.VM[0]
	var tgt *VMCmd
	switch kind {
	case "kernel":
		r, err := vm0.Run(ctx, `set -e; C=/sys/kernel/config/nvmet; N=`+vmNvmfNQN+`
mkdir $C/ports/1 && echo rdma > $C/ports/1/addr_trtype && echo ipv4 > $C/ports/1/addr_adrfam
echo `+p.IP[0]+` > $C/ports/1/addr_traddr && echo 4420 > $C/ports/1/addr_trsvcid
ln -s $C/subsystems/$N $C/ports/1/subsystems/$N`, time.Minute)
		if err != nil || r.Exit != 0 {
			return k4, k128, nil, "", fmt.Errorf("vm0: nvmet port: exit %d %v\n%s", r.Exit, err, r.Output)
		}
		defer vm0.Run(ctx, `C=/sys/kernel/config/nvmet; rm -f $C/ports/1/subsystems/*; rmdir $C/ports/1`, time.Minute)
	case "rocev2d", "alt":
		r, err := vm0.Run(ctx, `rdma link delete rxe0 && rmmod rdma_rxe && ! grep -q rdma_rxe /proc/modules`, time.Minute)
		if err != nil || r.Exit != 0 {
			return k4, k128, nil, "", fmt.Errorf("vm0: rxe off: exit %d %v\n%s", r.Exit, err, r.Output)
		}
		defer vm0.Run(ctx, `m=$(grep rdma_rxe /etc/rocev2lab/modules) && insmod /lib/modules/$(uname -r)/$m && rdma link add rxe0 type rxe netdev eth0`, time.Minute)
		bin := "rocev2d"
		if kind == "alt" {
			bin = "rocev2d-alt"
		}
		cmd := bin + " nvmf-target --bind " + p.IP[0] + " --nqn " + vmNvmfNQN + " --size 256m --block-size 4096 -v"
		if profile {
			cmd = "rm -f /tmp/nvmf-cpu.prof; exec " + cmd + " --cpuprofile /tmp/nvmf-cpu.prof"
		}
		tgt, err = vm0.StartVM(ctx, agentproto.Request{Cmd: cmd, TimeoutSec: 600})
		if err != nil {
			return k4, k128, nil, "", err
		}
		defer func() {
			tr, _ := tgt.Cancel()
			if os.Getenv("ROCEV2_VMNVMF_TARGETLOG") != "" {
				note += "\n--- target:\n" + tail(tr.Output, 40)
			}
			if err != nil {
				err = fmt.Errorf("%w\n--- rocev2d nvmf-target:\n%s", err, tail(tr.Output, 30))
			}
		}()
	}
	connect := `T=` + p.IP[0] + `; N=` + vmNvmfNQN + `
ok=
for i in $(seq 1 60); do echo "transport=rdma,traddr=$T,trsvcid=4420,nqn=$N" > /dev/nvme-fabrics 2>/dev/null && ok=1 && break; sleep 0.5; done
[ -n "$ok" ] || { echo "FAIL: connect"; dmesg | grep -i nvme | tail -10; exit 1; }
i=0; while [ ! -b /dev/nvme0n1 ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done
[ -b /dev/nvme0n1 ] || { echo "FAIL: no /dev/nvme0n1"; exit 1; }
echo "ctrl $(cat /sys/class/nvme/nvme0/model) queues=$(ls /sys/block/nvme0n1/mq | wc -l)"
`
	if !profile {
		// The profile rounds read a memory namespace nobody wrote:
		// the same copy path, without the fill's RDMA READs in the profile.
		connect += `dd if=/dev/zero of=/dev/nvme0n1 bs=1048576 count=64 oflag=direct 2>/dev/null || { echo "FAIL: fill"; exit 1; }`
	}
	disconnect := func() {
		p.VM[1].Run(ctx, `echo 1 > /sys/class/nvme/nvme0/delete_controller
i=0; while [ -e /sys/class/nvme/nvme0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done`, time.Minute)
	}
	r, err := p.VM[1].Run(ctx, connect, 5*time.Minute)
	if err != nil || r.Exit != 0 {
		disconnect()
		return k4, k128, nil, "", fmt.Errorf("vm1: exit %d %v\n%s", r.Exit, err, r.Output)
	}
	note = strings.TrimSpace(firstLine(r.Output, "ctrl "))
	defer disconnect()
	if profile && nb.profile == "128k" {
		k128, _, err = nb.dio(ctx, "-bs 131072 -qd 4 -seq -time "+nb.dur+" -range 64m")
	} else {
		k4, _, err = nb.dio(ctx, "-bs 4096 -qd 16 -time "+nb.dur+" -range 64m")
	}
	if err != nil {
		return k4, k128, nil, note, err
	}
	if profile {
		disconnect()
		r, err := vm0.Run(ctx, `kill -INT $(pidof rocev2d rocev2d-alt); i=0
while pidof rocev2d rocev2d-alt >/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
base64 /tmp/nvmf-cpu.prof`, time.Minute)
		if err != nil || r.Exit != 0 {
			return k4, k128, nil, note, fmt.Errorf("vm0: profile: exit %d %v\n%s", r.Exit, err, r.Output)
		}
		prof, err = base64.StdEncoding.DecodeString(strings.Join(strings.Fields(r.Output), ""))
		return k4, k128, prof, note, err
	}
	if k128, _, err = nb.dio(ctx, "-bs 131072 -qd 4 -seq -time "+nb.dur+" -range 64m"); err != nil {
		return k4, k128, nil, note, err
	}
	return k4, k128, nil, note, nil
}
