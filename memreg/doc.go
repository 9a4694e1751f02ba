// Package memreg is a software RNIC memory translation table: protection
// domains, memory regions over caller memory, memory windows, keys, the
// access checks a responder makes before touching memory, data placement,
// and 64-bit atomics.
//
// # Keys
//
// A key is index<<8 | keyByte, as in verbs: a 24-bit table index and an
// 8-bit key byte. Regions and windows share one index space; an MR's lkey
// and rkey are the same value. A released index is held back until 4096
// others have been released, then reused oldest-first and always with a new
// key byte, so a key that outlived its registration fails with ErrStaleKey
// for at least 256 × 4096 registrations after it (the byte wraps after 256
// reuses of the same index, as on hardware). Lookups are O(1) and lock-free: a fixed array of
// lazily allocated 4096-slot pages, each slot an atomic pointer to an
// immutable entry.
//
// # No placement after deregistration
//
// Every entry carries an atomic in-flight count with a "dead" bit. An
// access pins the entry (one atomic add; it fails if dead), copies, and
// unpins. Deregister, window unbind, invalidate and dealloc set the dead
// bit and then wait until the count drains, so when they return no access
// is still touching the memory and no new one can start: the memory is the
// caller's again. A receive path that places many packets in a row can
// hold the pin instead: BatchTarget.Write (RDMA WRITE data) and
// ScatterList.Scatter (SEND and READ response data) pin a registration
// into a Pins once per batch and Pins.Release unpins it, so a Deregister
// then waits for the end of that batch; inside it each packet is a bounds
// check and a copy. A work request's one-element SGE list can keep the
// region it was checked against (CheckSGEsRef returns a Ref, and so does
// CheckSGE, its call-free form for posting one valid element, which
// returns nil where CheckSGEsRef would say why; GatherRef and
// ScatterList.InitRef use it): a copy through it skips the key lookup but
// not the pin, and runs only while the Ref is the live region the lkey
// names, so it fails exactly when the lookup would. No check is cached
// across posts: each post looks its lkey up in the table (two atomic
// loads), so a Deregister or a window bind is seen by the next post. Memory from mmap can be registered like any byte
// slice; it must stay mapped until Deregister returns. The zero-copy
// send views (PD.GatherView, QPView.ReadView) are checked when taken and
// read later, when the packet leaves: the sender reads one only between
// its Hold's Acquire and Release, which pin the registration like any
// other access, so Deregister waits for a send in progress and a packet
// still queued after it is dropped, not sent. Memory a work request sends
// from must still not change until that request has completed (the verbs
// rule: the ICRC is computed when the packet leaves).
//
// # Access checks and NAK codes
//
// A remote access (rkey, va, length, rights) is checked in rxe's order:
// DMA length <= 2^31 (ErrLength), key index known (ErrUnknownKey), key
// byte current (ErrStaleKey), same PD (ErrWrongPD), window bound
// (ErrNotBound), type 2 window used from its QP (ErrWrongQP, only through
// ForQP), right granted (ErrAccessDenied), va+length does not wrap
// (ErrAddressWrap), inside the registration (ErrOutOfBounds), and for
// atomics an 8-byte aligned va (ErrMisaligned). A zero-length access is
// valid and checks no key. Errors are *AccessError values naming the
// operation, key, address, length and rule; NAKCode maps them to the AETH
// NAK code a responder sends (Remote Access Error for key/right/bounds
// violations, Invalid Request for a misaligned atomic, a bad length or a
// failed SEND with Invalidate, Remote Operational Error for a bad local
// receive SGE).
//
// # Atomics
//
// CompareSwap and FetchAdd work on 8 bytes of registered memory in host
// byte order with host-order operands (the caller decodes the big-endian
// AtomicETH). The va must be 8-byte aligned. When the host address is
// aligned too (always, unless a custom IOVA shifts it) they use
// sync/atomic; otherwise they fall back to a striped mutex keyed by host
// address, so all atomics on one host address stay atomic with respect to
// each other. Plain placements (WriteRemote, Scatter) are not atomic with
// respect to atomics, as on a NIC.
//
// # Memory windows
//
// Type 1 windows are bound with MW.Bind (each bind, or unbind with length
// 0, bumps the key byte) and cannot be invalidated. Type 2 windows are
// bound with MW.BindQP (the work request chooses the key byte, the window
// must be unbound, the length non-zero), are usable only from their QP
// (checked through ForQP), and end with a local invalidate
// (MW.Invalidate, InvalidateLocal) or a SEND with Invalidate
// (InvalidateRemote). Zero-based windows are not supported. A region with
// a window bound cannot be deregistered (ErrBusy).
//
// memreg plays the NIC's memory table for the transport above it (and for
// tools that check keys); of this module it imports only the wire packages
// (aeth, for the NAK codes of its errors), never transport, udp or cmd.
package memreg
