package rdmacm

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// loopbackFor returns 127.b1.b2.host, distinct per process so that tests
// of concurrent processes do not meet.
func loopbackFor(host byte) netip.Addr {
	p := os.Getpid()
	return netip.AddrFrom4([4]byte{127, byte(40 + p%200), byte(1 + (p/200)%250), host})
}

// Dial (or ResolveUD) to an address where nothing listens on UDP 4791:
// the kernel's ICMP port unreachable ends it at once (not after 16
// response timeouts), with an error matching ErrUnreachable and
// ECONNREFUSED and naming the address. ResolveUD used to ignore it and
// time out after 16 s.
func TestDialUnreachableFailsFast(t *testing.T) {
	for i, tc := range []struct {
		name string
		call func(dev *transport.Device, to netip.AddrPort) error
	}{
		{"Dial", func(dev *transport.Device, to netip.AddrPort) error {
			_, err := Dial(ctxT(t, 30*time.Second), dev, to, nil) // default: 1 s response timeout, 15 retries
			return err
		}},
		{"ResolveUD", func(dev *transport.Device, to netip.AddrPort) error {
			_, err := ResolveUD(ctxT(t, 30*time.Second), dev, to, nil) // as Dial
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := udp.ListenSocket(loopbackFor(byte(1+i)), nil)
			if err != nil {
				t.Fatal(err)
			}
			dev, err := transport.NewDevice(l, transport.DeviceConfig{})
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			to := netip.AddrPortFrom(loopbackFor(9), 7500)
			start := time.Now()
			err = tc.call(dev, to)
			el := time.Since(start)
			if !errors.Is(err, ErrUnreachable) || !errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("%s to a closed port: %v, want ErrUnreachable (ECONNREFUSED)", tc.name, err)
			}
			if !strings.Contains(err.Error(), to.String()) {
				t.Errorf("error %q does not name %v", err, to)
			}
			if el > 900*time.Millisecond {
				t.Errorf("%s failed after %v, want at once (before the first response timeout)", tc.name, el)
			}
			if s := StatsOf(dev); s.Unreachable == 0 {
				t.Errorf("Unreachable not counted: %+v", s)
			}
			if s := StatsOf(dev); tc.name == "Dial" && (s.Ended[CauseUnreachable] != 1 || s.Ended[CauseError] != 0) {
				// It was counted as "error" (probe lib26/rpc: Accepts
				// whose REP bounced off a killed requester).
				t.Errorf("ended by: %v, want one unreachable", s.Ended)
			}
			if c := dev.Counters().DestUnreachable; c == 0 {
				t.Errorf("dest_unreachable = 0")
			}
			t.Logf("%v after %v", err, el)
		})
	}
}

// A peer that never answers (no CM there): the timeout names the
// address and the number of REQs sent.
func TestDialTimeoutSaysWhere(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	// B answers nothing (every packet it would send is dropped; a device
	// without a CM would refuse the REQ: REJ invalid service ID).
	silent := func(l udp.Link) udp.Link {
		return &filterLink{Wrap: udp.Wrap{Link: l}, drop: func(*packet.Packet) bool { return true }}
	}
	da, _ := newDev(t, n, addrA, nil), newDev(t, n, addrB, silent)
	to := netip.AddrPortFrom(addrB, 7501)
	_, err := Dial(ctxT(t, 10*time.Second), da, to, &fast)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("Dial: %v, want ErrTimeout", err)
	}
	for _, want := range []string{to.String(), fmt.Sprintf("%d REQs", fast.MaxRetries+1)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
