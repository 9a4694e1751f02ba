//go:build linux

package interop

import (
	"context"
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
// each dio run's length (default 5s).
func BenchmarkVMNvmf(b *testing.B) {
	cfg, img := prepareBench(b)
	cache := cfg.CacheDir
	pimg, err := PairImage(cfg, img, "")
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
	var rows []string
	for round := 1; round <= rounds; round++ {
		for _, kind := range []string{"kernel", "rocev2d"} {
			name := fmt.Sprintf("r%d/%s", round, kind)
			b.Run(name, func(b *testing.B) {
				iops, mbps, note, err := nb.round(ctx, kind)
				if err != nil {
					rows = append(rows, fmt.Sprintf("%-12s FAILED: %s", name, strings.SplitN(err.Error(), "\n", 2)[0]))
					b.Fatal(err)
				}
				nb.res[kind+"/iops"] = append(nb.res[kind+"/iops"], iops)
				nb.res[kind+"/mbps"] = append(nb.res[kind+"/mbps"], mbps)
				rows = append(rows, fmt.Sprintf("%-12s 4k_randread_qd16 %8.0f IOPS   128k_seqread_qd4 %7.2f MB/s   %s", name, iops, mbps, note))
				b.ReportMetric(iops, "4k-IOPS")
				b.ReportMetric(mbps, "128k-MB/s")
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
	b.Logf("rounds (one boot, in order):\n%s\nmeans: kernel %.0f IOPS %.2f MB/s; rocev2d %.0f IOPS %.2f MB/s; rocev2d/kernel: 4k %s, 128k %s",
		strings.Join(rows, "\n"), mean("kernel/iops"), mean("kernel/mbps"), mean("rocev2d/iops"), mean("rocev2d/mbps"),
		ratio(mean("rocev2d/iops"), mean("kernel/iops")), ratio(mean("rocev2d/mbps"), mean("kernel/mbps")))
}

const vmNvmfNQN = "nqn.2026-12.io.rocev2:vmbench"

// nvmfBench holds one BenchmarkVMNvmf run.
type nvmfBench struct {
	p   *VMPair
	dur string
	res map[string][]float64
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

var reDio = regexp.MustCompile(`(?m)^dio bs=(\d+) qd=\d+ rw=\S+ ios=\d+ secs=\S+ IOPS=([0-9.]+) MB/s=([0-9.]+)$`)

// round runs one round against kind's target: connect from vm1, fill,
// the two dio runs, disconnect.
func (nb *nvmfBench) round(ctx context.Context, kind string) (iops, mbps float64, note string, err error) {
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
			return 0, 0, "", fmt.Errorf("vm0: nvmet port: exit %d %v\n%s", r.Exit, err, r.Output)
		}
		defer vm0.Run(ctx, `C=/sys/kernel/config/nvmet; rm -f $C/ports/1/subsystems/*; rmdir $C/ports/1`, time.Minute)
	case "rocev2d":
		r, err := vm0.Run(ctx, `rdma link delete rxe0 && rmmod rdma_rxe && ! grep -q rdma_rxe /proc/modules`, time.Minute)
		if err != nil || r.Exit != 0 {
			return 0, 0, "", fmt.Errorf("vm0: rxe off: exit %d %v\n%s", r.Exit, err, r.Output)
		}
		defer vm0.Run(ctx, `m=$(grep rdma_rxe /etc/rocev2lab/modules) && insmod /lib/modules/$(uname -r)/$m && rdma link add rxe0 type rxe netdev eth0`, time.Minute)
		tgt, err = vm0.StartVM(ctx, agentproto.Request{Cmd: "rocev2d nvmf-target --bind " + p.IP[0] + " --nqn " + vmNvmfNQN +
			" --size 256m --block-size 4096 -v", TimeoutSec: 600})
		if err != nil {
			return 0, 0, "", err
		}
		defer func() {
			tr, _ := tgt.Cancel()
			if err != nil {
				err = fmt.Errorf("%w\n--- rocev2d nvmf-target:\n%s", err, tail(tr.Output, 30))
			}
		}()
	}
	script := `T=` + p.IP[0] + `; N=` + vmNvmfNQN + `; rc=0
ok=
for i in $(seq 1 60); do echo "transport=rdma,traddr=$T,trsvcid=4420,nqn=$N" > /dev/nvme-fabrics 2>/dev/null && ok=1 && break; sleep 0.5; done
[ -n "$ok" ] || { echo "FAIL: connect"; dmesg | grep -i nvme | tail -10; exit 1; }
i=0; while [ ! -b /dev/nvme0n1 ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done
[ -b /dev/nvme0n1 ] || { echo "FAIL: no /dev/nvme0n1"; exit 1; }
echo "ctrl $(cat /sys/class/nvme/nvme0/model) queues=$(ls /sys/block/nvme0n1/mq | wc -l)"
dd if=/dev/zero of=/dev/nvme0n1 bs=1048576 count=64 oflag=direct 2>/dev/null || { echo "FAIL: fill"; rc=1; }
[ $rc = 0 ] && { dio -bs 4096 -qd 16 -time ` + nb.dur + ` -range 64m /dev/nvme0n1 || rc=1; }
[ $rc = 0 ] && { dio -bs 131072 -qd 4 -seq -time ` + nb.dur + ` -range 64m /dev/nvme0n1 || rc=1; }
echo 1 > /sys/class/nvme/nvme0/delete_controller
i=0; while [ -e /sys/class/nvme/nvme0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
exit $rc`
	r, err := p.VM[1].Run(ctx, script, 5*time.Minute)
	if err != nil || r.Exit != 0 {
		return 0, 0, "", fmt.Errorf("vm1: exit %d %v\n%s", r.Exit, err, r.Output)
	}
	for _, m := range reDio.FindAllStringSubmatch(r.Output, -1) {
		i, _ := strconv.ParseFloat(m[2], 64)
		mb, _ := strconv.ParseFloat(m[3], 64)
		switch m[1] {
		case "4096":
			iops = i
		case "131072":
			mbps = mb
		}
	}
	if iops == 0 || mbps == 0 {
		return 0, 0, "", fmt.Errorf("vm1: no dio results\n%s", r.Output)
	}
	return iops, mbps, strings.TrimSpace(firstLine(r.Output, "ctrl ")), nil
}
