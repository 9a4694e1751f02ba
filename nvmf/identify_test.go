package nvmf

import (
	"testing"
	"time"

	"github.com/gorocev2/rocev2/nvme"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestControllerType: Identify Controller says what kind of controller
// answers (CNTRLTYPE: 1 I/O, 2 discovery), as nvmet does; it said 0 ("not
// reported"), which Linux shows as "reserved" in
// /sys/class/nvme/nvmeN/cntrltype and nvme id-ctrl as cntrltype 0.
func TestControllerType(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 1, QueueSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	id := make([]byte, nvme.IdentifySize)
	if _, err := h.admin(ctx, &request{in: id, build: (&nvme.Identify{CNS: nvme.CNSController}).Put}); err != nil {
		t.Fatal(err)
	}
	if ct := nvme.IdentifyController(id).Fields().CNTRLTYPE; ct != nvme.CntrlTypeIO {
		t.Errorf("I/O controller: CNTRLTYPE %d, want %d", ct, nvme.CntrlTypeIO)
	}
	dh := &Controller{cfg: HostConfig{}.withDefaults(), subNQN: nvme.DiscoveryNQN}
	adm := rawQueue(t, p, 0, 32)
	if _, err := dh.connectQueue(ctx, adm, nvme.DynamicCNTLID, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := adm.do(ctx, &request{build: (&nvme.Property{Set: true, Offset: nvme.PropCC, Value: nvme.CCEnable | nvme.CCIOSQES6IOCQ4}).Put}); err != nil {
		t.Fatal(err)
	}
	if err := identify(ctx, adm, nvme.Identify{CNS: nvme.CNSController}, id); err != nil {
		t.Fatal(err)
	}
	if f := nvme.IdentifyController(id).Fields(); f.CNTRLTYPE != nvme.CntrlTypeDiscovery || f.SubNQN != nvme.DiscoveryNQN {
		t.Errorf("discovery controller: CNTRLTYPE %d (%s), want %d", f.CNTRLTYPE, f.SubNQN, nvme.CntrlTypeDiscovery)
	}
}
