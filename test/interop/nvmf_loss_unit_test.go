//go:build linux

package interop

import (
	"os/exec"
	"strings"
	"testing"
)

// The VM's output of the CI run's failed "ctrl 20 rounds" (2026-12-07),
// in fail()'s present form.
const ciFastRegFail = `step reconnect 619.12
FAIL: no /dev/nvme0n1
[  667.054265] nvme nvme0: new ctrl: NQN "nqn.2026-12.io.rocev2:lab", addr 192.0.2.1:4420
[  667.056854] rdma_rxe: rxe_reg_fast_mr: mr->lkey = 0x223d7c not free
[  674.720153] nvme nvme0: I/O 0 QID 0 timeout
[  674.720313] nvme nvme0: starting error recovery
kernel since step: [  619.118040] rocev2lab: step reconnect
kernel since step: [  667.056854] rdma_rxe: rxe_reg_fast_mr: mr->lkey = 0x223d7c not free
`

func TestNvmfRxeFastRegBug(t *testing.T) {
	probs := []string{"step reconnect: VM script exit 1", "missing: ctrl 20 rounds"}
	line, ok := nvmfRxeFastRegBug(ciFastRegFail, "reconnect", probs)
	if !ok || line != "[  667.056854] rdma_rxe: rxe_reg_fast_mr: mr->lkey = 0x223d7c not free" {
		t.Fatalf("the CI failure: %q %v, want its kernel line", line, ok)
	}
	for _, c := range []struct {
		name  string
		out   string
		step  string
		probs []string
	}{
		{"no kernel line", strings.ReplaceAll(ciFastRegFail, "kernel since step: [  667.056854] rdma_rxe: rxe_reg_fast_mr: mr->lkey = 0x223d7c not free\n", ""), "reconnect", probs},
		// Only in the tail of all of dmesg, not marked as since the step.
		{"not since the step", strings.ReplaceAll(ciFastRegFail, "kernel since step: ", ""), "reconnect", probs},
		{"another rxe_reg_fast_mr failure", strings.ReplaceAll(ciFastRegFail, "kernel since step: [  667.056854] rdma_rxe: rxe_reg_fast_mr: mr->lkey = 0x223d7c not free",
			"kernel since step: [  667.056854] rdma_rxe: rxe_reg_fast_mr: qp->pd and mr->pd don't match"), "reconnect", probs},
		{"the script did not fail", strings.ReplaceAll(ciFastRegFail, "FAIL: no /dev/nvme0n1\n", ""), "reconnect", probs},
		{"data differs in the VM", strings.ReplaceAll(ciFastRegFail, "FAIL: no /dev/nvme0n1", "FAIL: data bs=4096"), "reconnect", probs},
		{"checksums differ", strings.ReplaceAll(ciFastRegFail, "FAIL: no /dev/nvme0n1", "/mnt/nv/f2: FAILED\nFAIL: checksums"), "reconnect", probs},
		{"md5sum -c alone", strings.ReplaceAll(ciFastRegFail, "FAIL: no /dev/nvme0n1", "/mnt/nv/f2: FAILED\nFAIL: umount"), "reconnect", probs},
		// The kernel log is not the step's: no mark (fail() passed all of
		// it), another step's mark, or the line before the mark.
		{"no step mark", strings.ReplaceAll(ciFastRegFail, "kernel since step: [  619.118040] rocev2lab: step reconnect\n", ""), "reconnect", probs},
		{"another step's mark", ciFastRegFail, "dd", probs},
		{"before the mark", strings.ReplaceAll(ciFastRegFail, "kernel since step: [  619.118040] rocev2lab: step reconnect\nkernel since step: [  667.056854] rdma_rxe: rxe_reg_fast_mr: mr->lkey = 0x223d7c not free",
			"kernel since step: [  667.056854] rdma_rxe: rxe_reg_fast_mr: mr->lkey = 0x223d7c not free\nkernel since step: [  619.118040] rocev2lab: step reconnect"), "reconnect", probs},
		{"the target's file differs", ciFastRegFail, "reconnect", append(probs[:1:1], "bs=65536: the target's file differs from what the VM wrote at 8388608")},
	} {
		if line, ok := nvmfRxeFastRegBug(c.out, c.step, c.probs); ok {
			t.Errorf("%s: recognised as rxe's fast-reg retry bug (%q)", c.name, line)
		}
	}
}

// TestNvmfSinceStep: fail() reads the kernel log from the last step's mark
// on, so that a "not free" of an earlier (passed) step is not taken for
// the failed one's.
func TestNvmfSinceStep(t *testing.T) {
	log := "[ 1.0] rdma_rxe: rxe_reg_fast_mr: mr->lkey = 0x1 not free\n[ 2.0] rocev2lab: step mkfs\n[ 2.5] rdma_rxe: rxe_reg_fast_mr: mr->lkey = 0x2 not free\n" +
		"[ 3.0] rocev2lab: step reset\n[ 4.0] nvme nvme0: new ctrl\n"
	cmd := exec.Command("sh", "-c", nvmfSinceStep)
	cmd.Stdin = strings.NewReader(log)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if want := "[ 3.0] rocev2lab: step reset\n[ 4.0] nvme nvme0: new ctrl\n"; string(out) != want {
		t.Errorf("since the last mark: %q, want %q", out, want)
	}
	cmd = exec.Command("sh", "-c", nvmfSinceStep)
	cmd.Stdin = strings.NewReader("[ 1.0] a\n[ 2.0] b\n")
	if out, err = cmd.CombinedOutput(); err != nil || string(out) != "[ 1.0] a\n[ 2.0] b\n" {
		t.Errorf("without a mark: %q %v, want all", out, err)
	}
}
