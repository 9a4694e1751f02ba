package nvmf

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/nvme"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// A Connect the target refuses names what it refused — the subsystem NQN,
// the host NQN — as Linux's nvmf_log_connect_error does, not only the
// status ("invalid connect parameters" said nothing of which).
func TestConnectRefusalNamesField(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{Subsystems: []*Subsystem{
		{NQN: testNQN, Namespaces: []*Namespace{{Backend: mustMem(t)}}},
		{NQN: testNQN + "-only", AllowedHosts: []string{"nqn.2026-12.io.example:someone-else"},
			Namespaces: []*Namespace{{Backend: mustMem(t)}}},
	}})
	ctx := ctxT(t, 30*time.Second)
	_, err := Connect(ctx, p.hdev, p.targetAddr, "nqn.2026-12.io.example:nope", nil)
	if !errors.Is(err, nvme.StatusConnectInvalidParam|nvme.StatusDNR) ||
		!strings.Contains(err.Error(), `subsystem NQN "nqn.2026-12.io.example:nope"`) {
		t.Errorf("unknown NQN: %v", err)
	}
	_, err = Connect(ctx, p.hdev, p.targetAddr, testNQN+"-only", &HostConfig{HostNQN: "nqn.2026-12.io.example:me"})
	if !errors.Is(err, nvme.StatusConnectInvalidHost|nvme.StatusDNR) ||
		!strings.Contains(err.Error(), `host NQN "nqn.2026-12.io.example:me"`) {
		t.Errorf("host not allowed: %v", err)
	}
	if p.t.Stats().LiveCtrls != 0 {
		t.Errorf("live controllers %d after refused Connects", p.t.Stats().LiveCtrls)
	}
}

func mustMem(t *testing.T) *MemBackend {
	m, err := NewMemBackend(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A nil device or a nil entry in the configuration is an error naming it,
// not a nil-pointer panic inside the library.
func TestNilArgumentsAreErrors(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 10*time.Second)
	check := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming %q", what, err, want)
		}
	}
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("Connect with a nil device panicked: %v", r)
			}
		}()
		_, err := Connect(ctx, nil, p.targetAddr, testNQN, nil)
		check("Connect(nil dev)", err, "dev is nil")
		_, err = Discover(ctx, nil, p.targetAddr, nil)
		check("Discover(nil dev)", err, "dev is nil")
	}()
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("Listen with a nil argument panicked: %v", r)
			}
		}()
		_, err := Listen(nil, TargetConfig{Subsystems: []*Subsystem{{NQN: testNQN, Namespaces: []*Namespace{{Backend: mustMem(t)}}}}})
		check("Listen(nil dev)", err, "dev is nil")
		_, err = Listen(p.hdev, TargetConfig{Subsystems: []*Subsystem{nil}})
		check("nil subsystem", err, "Subsystems[0] is nil")
		_, err = Listen(p.hdev, TargetConfig{Subsystems: []*Subsystem{{NQN: testNQN, Namespaces: []*Namespace{nil}}}})
		check("nil namespace", err, "Namespaces[0] is nil")
	}()
}

// A Connect that finds no listener or no answer names the address and,
// when the host's own step timeout ran out, that timeout: a library user
// got a bare "nvmf: queue 0: context deadline exceeded" for a target that
// does not answer, and a REJ without the port it came for.
func TestConnectFailureNamesAddress(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	wrongPort := netip.AddrPortFrom(targetIP, 4421)
	_, err := Connect(ctx, p.hdev, wrongPort, testNQN, nil)
	if err == nil || !strings.Contains(err.Error(), wrongPort.String()) {
		t.Errorf("Connect to a port nobody listens on: %v, want it to name %v", err, wrongPort)
	}
	nobody := netip.AddrPortFrom(netip.MustParseAddr("192.0.2.77"), nvme.Port)
	_, err = Connect(ctx, p.hdev, nobody, testNQN, &HostConfig{ConnectTimeout: 100 * time.Millisecond})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), nobody.String()) ||
		!strings.Contains(err.Error(), "ConnectTimeout") {
		t.Errorf("Connect to an address that never answers: %v, want it to name %v and ConnectTimeout", err, nobody)
	}
	if ctx.Err() != nil {
		t.Fatal("the caller's context ended")
	}
}

// A queue size or queue count Connect cannot honour is an error naming
// the field (QueueSize 1 connected with 2, 100000 with 1024, silently).
func TestConnectRefusesBadQueueConfig(t *testing.T) {
	p := newPair(t, memnet.Faults{}, TargetConfig{})
	ctx := ctxT(t, 30*time.Second)
	for _, cfg := range []HostConfig{{QueueSize: 1}, {QueueSize: 1025}, {QueueSize: -5}, {IOQueues: -1}} {
		h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &cfg)
		if err == nil {
			h.Close()
			t.Errorf("%+v: connected", cfg)
			continue
		}
		if want := map[bool]string{true: "HostConfig.IOQueues", false: "HostConfig.QueueSize"}[cfg.IOQueues != 0]; !strings.Contains(err.Error(), want) {
			t.Errorf("QueueSize %d IOQueues %d: %v, want it to name %s", cfg.QueueSize, cfg.IOQueues, err, want)
		}
	}
	h, err := Connect(ctx, p.hdev, p.targetAddr, testNQN, &HostConfig{QueueSize: 2, IOQueues: 1})
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
}
