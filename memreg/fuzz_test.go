package memreg

import (
	"errors"
	"testing"

	"github.com/gorocev2/rocev2/aeth"
)

// FuzzRemoteAccess throws arbitrary (key, va, length, rights) at the
// responder calls of a fixed table. It must never panic, every failure
// must be an *AccessError mapping to Invalid Request or Remote Access
// Error, and every success must lie inside a registration that grants the
// rights.
func FuzzRemoteAccess(f *testing.F) {
	fx := newFixture(f)
	keys := []uint32{fx.rw.RKey(), fx.ro.RKey(), fx.local.RKey(), fx.other.RKey(), fx.odd.RKey(),
		fx.staleKey, fx.staleByteKey, fx.unknownKey, fx.w1Key, fx.w2Key, fx.wUnboundKey, fx.wInvKey, 0}
	type grant struct {
		start, last uint64
		acc         Access
		qp          uint32
	}
	live := map[uint32]grant{
		fx.rw.RKey():  {ioRW, ioRW + 4095, allRights, 0},
		fx.ro.RKey():  {ioRO, ioRO + 4095, AccessRemoteRead, 0},
		fx.odd.RKey(): {ioOdd, ioOdd + 4095, allRights, 0},
		fx.w1Key:      {ioRW + 1024, ioRW + 2047, AccessRemoteRead, 0},
		fx.w2Key:      {ioRW + 2048, ioRW + 3071, AccessRemoteWrite | AccessRemoteAtomic, qpA},
	}
	f.Add(uint8(0), uint64(ioRW), uint32(16), uint8(2), uint8(0), uint32(0))
	f.Add(uint8(8), uint64(ioRW+1024), uint32(1024), uint8(4), uint8(1), uint32(0))
	f.Add(uint8(9), uint64(ioRW+2048), uint32(8), uint8(8), uint8(3), uint32(qpA))
	f.Add(uint8(200), ^uint64(0), uint32(1<<31+5), uint8(0xff), uint8(4), uint32(1))
	f.Fuzz(func(t *testing.T, ki uint8, va uint64, n uint32, acc uint8, op uint8, qp uint32) {
		key := uint32(ki) << 24
		if int(ki) < len(keys) {
			key = keys[ki]
		} else {
			key |= uint32(ki)
		}
		v := fx.pd.any()
		if qp != 0 {
			v = fx.pd.ForQP(qp)
		}
		n %= 1<<31 + 64
		o := opKind(op % 5)
		if o == doWrite || o == doRead {
			n %= 8192
		}
		err := run(v, o, key, va, n, Access(acc))
		if err == nil {
			if o == doCAS || o == doFAA {
				n = 8
			}
			if n == 0 {
				return
			}
			need := map[opKind]Access{doCheck: Access(acc), doWrite: AccessRemoteWrite, doRead: AccessRemoteRead,
				doCAS: AccessRemoteAtomic, doFAA: AccessRemoteAtomic}[o]
			r, ok := live[key]
			if !ok || va < r.start || va+uint64(n)-1 > r.last || va+uint64(n)-1 < va || r.acc&need != need ||
				(r.qp != 0 && qp != 0 && r.qp != qp&0xffffff) {
				t.Fatalf("%v key %#x va %#x len %d rights %v succeeded outside what it grants", o, key, va, n, need)
			}
			return
		}
		var ae *AccessError
		if !errors.As(err, &ae) {
			t.Fatalf("%T %v", err, err)
		}
		if c := NAKCode(err); c != aeth.NAKInvalidRequest && c != aeth.NAKRemoteAccessError {
			t.Fatalf("NAK %v for %v", c, err)
		}
	})
}
