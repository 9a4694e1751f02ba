package transport

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/udp"
)

// QPNSource supplies the QPNs a device hands out, a range at a time
// (DeviceConfig.QPNs). The device asks for a range when every QPN of the
// ranges it has is in use.
type QPNSource interface {
	// NextRange returns a new range of QPNs [first, first+n) the device
	// may use; QPNs 0 and 1 must not be in it. The device leaves out
	// 0xffffff (the multicast QPN) if the range ends there.
	NextRange() (first, n uint32, err error)
}

// wholeSpace is the default QPNSource: every QPN from firstQPN up, once.
type wholeSpace struct{ given bool }

func (w *wholeSpace) NextRange() (first, n uint32, err error) {
	if w.given {
		return 0, 0, fmt.Errorf("transport: every QPN is in use: %w", ErrLimit)
	}
	w.given = true
	return firstQPN, lastQPN + 1 - firstQPN, nil
}

// linkLeases is the QPNSource of a device on a shared link: the link's
// leases (udp.SharedLink.LeaseQPNs).
type linkLeases struct{ l udp.SharedLink }

func (s linkLeases) NextRange() (first, n uint32, err error) { return s.l.LeaseQPNs() }

// sharedLink returns the device's link as a udp.SharedLink when it is a
// member of a shared group, else nil.
// A link that wraps another (a fault injector, a capture tap) is looked
// through when it has an Unwrap() udp.Link method.
func (d *Device) sharedLink() udp.SharedLink { return sharedLinkOf(d.link) }

// sharedLinkOf is Device.sharedLink of link l.
func sharedLinkOf(l udp.Link) udp.SharedLink {
	for range 8 {
		if s, ok := l.(udp.SharedLink); ok {
			if s.Shared() {
				return s
			}
			return nil
		}
		u, ok := l.(interface{ Unwrap() udp.Link })
		if !ok {
			return nil
		}
		l = u.Unwrap()
	}
	return nil
}

// qpnAlloc hands out QPNs from the ranges a QPNSource gave, going round
// each range from its start (a random QPN of it on a shared link's
// leases) before the next. Under the device's mu.
type qpnAlloc struct {
	src    QPNSource
	ranges [][2]uint32 // first, n
	starts []uint32    // per range: the offset its round begins at
	cur    int         // the range being gone through
	pos    uint32      // the next candidate's place in it, from its start
	random bool        // start each range at a random QPN (a shared link's leases)

	walked     uint64    // candidates tried since roundStart
	roundStart time.Time // when the current round through the ranges began
}

// A QPN is not handed out again within qpnReuseMin of its last time while
// the device may take more ranges (at most qpnMaxRanges): when a round
// through its ranges ends sooner, the device asks its source for another
// range first. A shared link's lease is 4096 QPNs, and going round it
// again at once gave a QPN to a new connection while late packets of the
// last one to hold it could still arrive (longev25 F3: a repeat every
// 4096 QPs); rxe goes round a range of its own the same way, but a larger
// one.
const (
	qpnReuseMin  = time.Minute
	qpnMaxRanges = 8
)

// alloc returns a QPN for which busy is false, leasing a new range from
// the source when every QPN of the current ones is busy, or when a round
// through them ended within qpnReuseMin (then a failed lease only means
// the QPNs are reused). now is the device's clock.
func (a *qpnAlloc) alloc(now time.Time, busy func(uint32) bool) (uint32, error) {
	total := uint64(0)
	for _, r := range a.ranges {
		total += uint64(r[1])
	}
	if total > 0 && a.walked >= total {
		if now.Sub(a.roundStart) < qpnReuseMin && len(a.ranges) < qpnMaxRanges && a.lease() == nil {
			// The round goes on through the new range only: the
			// others' QPNs were just handed out.
			total += uint64(a.ranges[len(a.ranges)-1][1])
		} else {
			a.walked, a.roundStart = 0, now
		}
	}
	for tried := uint64(0); tried < total; tried++ {
		r := a.ranges[a.cur]
		n := r[0] + (a.starts[a.cur]+a.pos)%r[1]
		a.walked++
		if a.pos++; a.pos >= r[1] {
			a.cur, a.pos = (a.cur+1)%len(a.ranges), 0
		}
		if !busy(n) {
			return n, nil
		}
	}
	if total == 0 {
		a.roundStart = now
	}
	if err := a.lease(); err != nil {
		return 0, err
	}
	return a.alloc(now, busy)
}

// lease takes a new range from the source and makes it the current one.
func (a *qpnAlloc) lease() error {
	first, n, err := a.src.NextRange()
	if err != nil {
		return fmt.Errorf("transport: CreateQP: QPN range: %w", err)
	}
	if n == 0 || first <= 1 || uint64(first)+uint64(n) > bth.PSNMask+1 {
		return fmt.Errorf("transport: CreateQP: QPN source gave range [%#x, +%d): %w", first, n, ErrInvalidConfig)
	}
	if first+n-1 > lastQPN {
		// The last range of the space (a shared link's last lease)
		// ends at the multicast QPN, which is never a QP's.
		if n--; n == 0 {
			return fmt.Errorf("transport: CreateQP: QPN source gave range [%#x, +1): the multicast QPN: %w", first, ErrInvalidConfig)
		}
	}
	start := uint32(0)
	if a.random {
		// From a random QPN of the range on, as a device's first QPN
		// is random (DeviceConfig.FirstQPN): a restarted process given
		// the same range does not number its QPs as its previous life
		// did while peers may still know them.
		start = uint32(rand.N(n))
	}
	a.ranges = append(a.ranges, [2]uint32{first, n})
	a.starts = append(a.starts, start)
	a.cur, a.pos = len(a.ranges)-1, 0
	return nil
}

// QPNRanges returns the ranges of QPNs the device has taken from its
// QPNSource so far, as [first, last] pairs.
func (d *Device) QPNRanges() [][2]uint32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([][2]uint32, len(d.qpns.ranges))
	for i, r := range d.qpns.ranges {
		out[i] = [2]uint32{r[0], r[0] + r[1] - 1}
	}
	return out
}

// Shared reports whether the device's link shares its address with other
// processes (udp.SharedLink): then its QPNs come from the link's leases,
// and a connection manager must tag its communication IDs (CommIDTag) and
// claim the services it listens on (ClaimService).
func (d *Device) Shared() bool { return d.sharedLink() != nil }

// CommIDTag returns the bits (tag under mask) a connection manager puts in
// the communication IDs (and SIDR request IDs) it allocates, so that the
// replies are steered to this process on a shared address; 0, 0 when the
// link is not shared.
func (d *Device) CommIDTag() (tag, mask uint32) {
	if s := d.sharedLink(); s != nil {
		return s.CommIDTag()
	}
	return 0, 0
}

// ClaimService asks a shared link to steer CM REQs and SIDR_REQs for
// service ID sid to this device (nil on an unshared link, which receives
// them all).
func (d *Device) ClaimService(sid uint64) error {
	if s := d.sharedLink(); s != nil {
		return s.ClaimService(sid)
	}
	return nil
}

// ReleaseService undoes ClaimService.
func (d *Device) ReleaseService(sid uint64) {
	if s := d.sharedLink(); s != nil {
		s.ReleaseService(sid)
	}
}

// VolunteerRejector offers this device, on a shared link, to receive the
// REQs for services nobody on the address listens on, which its
// connection manager then rejects (nil on an unshared link).
func (d *Device) VolunteerRejector() error {
	if s := d.sharedLink(); s != nil {
		return s.VolunteerRejector()
	}
	return nil
}

// Simulated reports whether the device's link is a simulated network's
// (udp/memnet's in-memory link, or a link that wraps one): a link, or a
// link it wraps (Unwrap() udp.Link), with a Simulated() bool method that
// returns true. Its peers live in the same process, so what must outlive
// the process — rdmacm's connection journal — is not kept for it.
func (d *Device) Simulated() bool {
	l := d.link
	for range 8 {
		if s, ok := l.(interface{ Simulated() bool }); ok {
			return s.Simulated()
		}
		u, ok := l.(interface{ Unwrap() udp.Link })
		if !ok {
			return false
		}
		l = u.Unwrap()
	}
	return false
}
