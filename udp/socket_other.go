//go:build !linux

package udp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// SocketLink is the kernel UDP socket backend; it is implemented on Linux only.
type SocketLink struct{}

var _ Link = (*SocketLink)(nil)

// ListenSocket is not supported on this platform.
func ListenSocket(addr netip.Addr, opts *SocketOptions) (*SocketLink, error) {
	return nil, fmt.Errorf("udp: socket backend on %v: %w", addr, errors.ErrUnsupported)
}

// Send is not supported on this platform.
func (l *SocketLink) Send(pkts []Packet) error { return errors.ErrUnsupported }

// Recv is not supported on this platform.
func (l *SocketLink) Recv(pkts []Packet) (int, error) { return 0, net.ErrClosed }

// LocalAddr returns the zero address.
func (l *SocketLink) LocalAddr() netip.Addr { return netip.Addr{} }

// BatchSize returns 1.
func (l *SocketLink) BatchSize() int { return 1 }

// Stats returns zero counters.
func (l *SocketLink) Stats() Stats { return Stats{} }

// Close does nothing.
func (l *SocketLink) Close() error { return nil }

// RawLink is the raw IPv4 socket backend; it is implemented on Linux only.
type RawLink struct{ SocketLink }

var _ Link = (*RawLink)(nil)

// ListenRaw is not supported on this platform.
func ListenRaw(addr netip.Addr, opts *RawOptions) (*RawLink, error) {
	return nil, fmt.Errorf("udp: raw backend on %v: %w", addr, errors.ErrUnsupported)
}

// SourcePortFallbacks returns 0 (SocketLink is Linux-only).
func (l *SocketLink) SourcePortFallbacks() uint64 { return 0 }

// GSO returns false (SocketLink is Linux-only).
func (l *SocketLink) GSO() bool { return false }

// SetDeferVerify does nothing on this platform.
func (l *SocketLink) SetDeferVerify(on bool) {}

// VerifyICRC returns false (SocketLink is Linux-only).
func (l *SocketLink) VerifyICRC(p *Packet) bool { return false }

// ZeroCopy returns false (SocketLink is Linux-only).
func (l *SocketLink) ZeroCopy() bool { return false }

// GROCoalesced returns 0 (SocketLink is Linux-only).
func (l *SocketLink) GROCoalesced() uint64 { return 0 }

// SetRecvInPlace does nothing on this platform.
func (l *SocketLink) SetRecvInPlace(on bool) {}

// Shared returns false (SocketLink is Linux-only).
func (l *SocketLink) Shared() bool { return false }

// LeaseQPNs is not supported on this platform.
func (l *SocketLink) LeaseQPNs() (first, n uint32, err error) { return 0, 0, errors.ErrUnsupported }

// CommIDTag returns no tag.
func (l *SocketLink) CommIDTag() (tag, mask uint32) { return 0, 0 }

// ClaimService is not supported on this platform.
func (l *SocketLink) ClaimService(sid uint64) error { return errors.ErrUnsupported }

// ReleaseService does nothing on this platform.
func (l *SocketLink) ReleaseService(sid uint64) {}

// VolunteerRejector is not supported on this platform.
func (l *SocketLink) VolunteerRejector() error { return errors.ErrUnsupported }
