package nvmf

import (
	"errors"
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

// TestGetFeatureHostID: Get Features Host Identifier (0x81) with EXHID
// returns the 16-byte host ID of the Connect, as nvmet does (nvme
// get-feature -f 0x81 -c 1 -l 16 got Invalid Field); without EXHID it is
// Invalid Field, with a buffer of another size Data SGL Length Invalid,
// as nvmet; Set Features of it is Command Sequence Error (a fabrics host
// sets it in Connect), nvmet's answer when no data comes with it (with
// data nvmet refuses the data first: Data SGL Length Invalid).
func TestGetFeatureHostID(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	hostID := [16]byte{0x11, 0x11, 0x11, 0x11, 0x22, 0x22, 0x33, 0x33, 0x44, 0x44, 0x55, 0x55, 0x55, 0x55, 0x55, 0x55}
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{IOQueues: 1, QueueSize: 16, HostID: hostID})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	get := func(exhid uint32, buf []byte) error {
		_, err := h.admin(ctx, &request{in: buf, build: func(s nvme.SQE) { (&nvme.Features{FID: nvme.FeatHostID, Value: exhid}).Put(s, nvme.AdminGetFeatures) }})
		return err
	}
	buf := make([]byte, 16)
	if err := get(1, buf); err != nil || [16]byte(buf) != hostID {
		t.Errorf("Get Features Host ID (EXHID): %v, %x, want %x", err, buf, hostID)
	}
	if err := get(0, make([]byte, 16)); !errors.Is(err, nvme.StatusInvalidField|nvme.StatusDNR) {
		t.Errorf("without EXHID: %v, want Invalid Field", err)
	}
	if err := get(1, make([]byte, 8)); !errors.Is(err, nvme.StatusSGLInvalidData|nvme.StatusDNR) {
		t.Errorf("8-byte buffer: %v, want Data SGL Length Invalid", err)
	}
	if _, err := h.admin(ctx, &request{out: buf, build: func(s nvme.SQE) { (&nvme.Features{FID: nvme.FeatHostID, Value: 1}).Put(s, nvme.AdminSetFeatures) }}); !errors.Is(err, nvme.StatusCmdSeqError|nvme.StatusDNR) {
		t.Errorf("Set Features Host ID: %v, want Command Sequence Error", err)
	}
}
