package rdmacm

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/gorocev2/rocev2/cm"

	"github.com/gorocev2/rocev2/transport"
)

// The package-level API: each function is its Manager method on the
// device's manager, which the first call starts (managerFor) and which
// stays until the device closes (or Close stops it). A program that wants
// the manager in hand — to read its Stats, to Close it apart from the
// device, or simply to say which device it works on — calls NewManager and
// uses the methods.

// Dial connects to the rdma_cm listener at addr through dev's connection
// manager: Manager.Dial.
func Dial(ctx context.Context, dev *transport.Device, addr netip.AddrPort, opts *Options) (*Conn, error) {
	if dev == nil {
		return nil, errNilDevice("Dial")
	}
	m, err := managerFor(dev)
	if err != nil {
		return nil, err
	}
	return m.Dial(ctx, addr, opts)
}

// Listen starts accepting connection requests for port on dev:
// Manager.Listen.
func Listen(dev *transport.Device, port uint16, opts *ListenOptions) (*Listener, error) {
	if dev == nil {
		return nil, errNilDevice("Listen")
	}
	if opts != nil {
		if err := opts.Options.check("Listen", cm.REPPrivateDataSize); err != nil {
			return nil, err
		}
	}
	m, err := managerFor(dev)
	if err != nil {
		return nil, err
	}
	return m.Listen(port, opts)
}

// ResolveUD asks the UD service at addr for its QP number and Q_Key
// through dev's connection manager: Manager.ResolveUD.
func ResolveUD(ctx context.Context, dev *transport.Device, addr netip.AddrPort, opts *UDOptions) (UDPeer, error) {
	if dev == nil {
		return UDPeer{}, errNilDevice("ResolveUD")
	}
	m, err := managerFor(dev)
	if err != nil {
		return UDPeer{}, err
	}
	return m.ResolveUD(ctx, addr, opts)
}

// ListenUD serves SIDR requests for port on dev with the UD QP qp:
// Manager.ListenUD.
func ListenUD(dev *transport.Device, port uint16, qp *transport.QP, qkey uint32, privateData []byte) (*UDListener, error) {
	if dev == nil {
		return nil, errNilDevice("ListenUD")
	}
	m, err := managerFor(dev)
	if err != nil {
		return nil, err
	}
	return m.ListenUD(port, qp, qkey, privateData)
}

// ManagerOf returns dev's running connection manager — the one NewManager
// started, or the one the package-level functions started on first use —
// or nil if none runs.
func ManagerOf(dev *transport.Device) *Manager {
	byDeviceMu.Lock()
	defer byDeviceMu.Unlock()
	return byDevice[dev]
}

// StatsOf returns the counters of dev's connection manager (zero if it
// never started, or after it shut down).
func StatsOf(dev *transport.Device) Stats {
	byDeviceMu.Lock()
	m := byDevice[dev]
	byDeviceMu.Unlock()
	if m == nil {
		return Stats{}
	}
	return m.Stats()
}

// errNilDevice is the error of a package-level call (or NewManager) given
// a nil device: an argument error naming the call, not a nil dereference.
func errNilDevice(op string) error {
	return fmt.Errorf("rdmacm: %s: dev is nil: %w", op, transport.ErrInvalidArgument)
}
