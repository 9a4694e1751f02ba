package cm_test

import (
	"bytes"
	"math/bits"
	"testing"

	"github.com/gorocev2/rocev2/cm"
)

// The layout tests set each field of each view to all ones in a zero body
// and to zero in an all-ones body, and check that exactly the field's bits
// change — so every getter and setter agrees with the IBTA table (the byte
// and bit positions below are written from IBTA vol. 1 ch. 12's tables as
// Linux's include/rdma/ibta_vol1_c12.h states them, not from the code) and
// no field overlaps another.

// span is a run of bits: byte off, the bits of mask.
type span struct {
	off  int
	mask byte
}

// by returns n whole bytes from off.
func by(off, n int) []span {
	out := make([]span, n)
	for i := range out {
		out[i] = span{off + i, 0xff}
	}
	return out
}

// bi returns the bits mask of byte off.
func bi(off int, mask byte) []span { return []span{{off, mask}} }

// field is one field of a view, reached through uint64 for the test.
type field struct {
	name string
	set  func(b []byte, v uint64)
	get  func(b []byte) uint64
	at   []span // a byte-array field (more than 8 spans) reads 1 for all ones
}

// arr is a byte-array field: set fills it with 0xff or 0, get returns 1 if
// all 0xff, 0 if all zero, 2 otherwise.
func arr(name string, part func(b []byte) []byte, off, n int) field {
	return field{
		name: name,
		set: func(b []byte, v uint64) {
			fill := byte(0)
			if v != 0 {
				fill = 0xff
			}
			p := part(b)
			if len(p) != n {
				panic(name + ": wrong length")
			}
			for i := range p {
				p[i] = fill
			}
		},
		get: func(b []byte) uint64 {
			p := part(b)
			switch {
			case bytes.Count(p, []byte{0xff}) == len(p):
				return 1
			case bytes.Count(p, []byte{0}) == len(p):
				return 0
			}
			return 2
		},
		at: by(off, n),
	}
}

func gidField(name string, get func(b []byte) cm.GID, set func(b []byte, g cm.GID), off int) field {
	return field{
		name: name,
		set: func(b []byte, v uint64) {
			var g cm.GID
			if v != 0 {
				g = cm.GID(bytes.Repeat([]byte{0xff}, 16))
			}
			set(b, g)
		},
		get: func(b []byte) uint64 {
			g := get(b)
			switch g {
			case cm.GID(bytes.Repeat([]byte{0xff}, 16)):
				return 1
			case cm.GID{}:
				return 0
			}
			return 2
		},
		at: by(off, 16),
	}
}

func boolField(name string, get func(b []byte) bool, set func(b []byte, v bool), at []span) field {
	return field{
		name: name,
		set:  func(b []byte, v uint64) { set(b, v != 0) },
		get: func(b []byte) uint64 {
			if get(b) {
				return 1
			}
			return 0
		},
		at: at,
	}
}

func checkLayout(t *testing.T, msg string, size int, fields []field) {
	t.Helper()
	covered := make([]byte, size)
	for _, f := range fields {
		want := make([]byte, size)
		width := 0
		for _, s := range f.at {
			want[s.off] |= s.mask
			if covered[s.off]&s.mask != 0 {
				t.Errorf("%s %s: overlaps another field at byte %d", msg, f.name, s.off)
			}
			covered[s.off] |= s.mask
			width += bits.OnesCount8(s.mask)
		}
		max := uint64(1)<<width - 1
		if f.get(make([]byte, size)) != 0 {
			t.Errorf("%s %s: zero body reads %d", msg, f.name, f.get(make([]byte, size)))
		}
		b := make([]byte, size)
		f.set(b, ^uint64(0))
		if !bytes.Equal(b, want) {
			t.Errorf("%s %s: set all ones in a zero body\n got % x\nwant % x", msg, f.name, b, want)
		}
		got := f.get(b)
		if len(f.at) > 8 {
			max = 1
		}
		if got != max {
			t.Errorf("%s %s: reads %#x after setting all ones, want %#x", msg, f.name, got, max)
		}
		b = bytes.Repeat([]byte{0xff}, size)
		f.set(b, 0)
		for i := range want {
			want[i] = ^want[i]
		}
		if !bytes.Equal(b, want) {
			t.Errorf("%s %s: set zero in an all-ones body\n got % x\nwant % x", msg, f.name, b, want)
		}
		if got := f.get(b); got != 0 {
			t.Errorf("%s %s: reads %#x after setting zero", msg, f.name, got)
		}
	}
	t.Logf("%s: %d fields, %d of %d bytes wholly theirs", msg, len(fields), bytes.Count(covered, []byte{0xff}), size)
}

// pathFields are the fields of a path view at its own offsets; rate, tc
// and hl are where the layout puts the packet rate, traffic class and hop
// limit.
func pathFields[P cm.REQPath | cm.LAPPath](rate, tc, hl int) []field {
	type pv interface {
		LocalLID() uint16
		SetLocalLID(uint16)
		RemoteLID() uint16
		SetRemoteLID(uint16)
		LocalGID() cm.GID
		SetLocalGID(cm.GID)
		RemoteGID() cm.GID
		SetRemoteGID(cm.GID)
		FlowLabel() uint32
		SetFlowLabel(uint32)
		PacketRate() uint8
		SetPacketRate(uint8)
		TrafficClass() uint8
		SetTrafficClass(uint8)
		HopLimit() uint8
		SetHopLimit(uint8)
		SL() uint8
		SetSL(uint8)
		SubnetLocal() bool
		SetSubnetLocal(bool)
		LocalACKTimeout() uint8
		SetLocalACKTimeout(uint8)
	}
	v := func(b []byte) pv { return any(P(b)).(pv) }
	return []field{
		{"local LID", func(b []byte, x uint64) { v(b).SetLocalLID(uint16(x)) }, func(b []byte) uint64 { return uint64(v(b).LocalLID()) }, by(0, 2)},
		{"remote LID", func(b []byte, x uint64) { v(b).SetRemoteLID(uint16(x)) }, func(b []byte) uint64 { return uint64(v(b).RemoteLID()) }, by(2, 2)},
		gidField("local GID", func(b []byte) cm.GID { return v(b).LocalGID() }, func(b []byte, g cm.GID) { v(b).SetLocalGID(g) }, 4),
		gidField("remote GID", func(b []byte) cm.GID { return v(b).RemoteGID() }, func(b []byte, g cm.GID) { v(b).SetRemoteGID(g) }, 20),
		{"flow label", func(b []byte, x uint64) { v(b).SetFlowLabel(uint32(x)) }, func(b []byte) uint64 { return uint64(v(b).FlowLabel()) }, append(by(36, 2), span{38, 0xf0})},
		{"packet rate", func(b []byte, x uint64) { v(b).SetPacketRate(uint8(x)) }, func(b []byte) uint64 { return uint64(v(b).PacketRate()) }, bi(rate, 0x3f)},
		{"traffic class", func(b []byte, x uint64) { v(b).SetTrafficClass(uint8(x)) }, func(b []byte) uint64 { return uint64(v(b).TrafficClass()) }, by(tc, 1)},
		{"hop limit", func(b []byte, x uint64) { v(b).SetHopLimit(uint8(x)) }, func(b []byte) uint64 { return uint64(v(b).HopLimit()) }, by(hl, 1)},
		{"SL", func(b []byte, x uint64) { v(b).SetSL(uint8(x)) }, func(b []byte) uint64 { return uint64(v(b).SL()) }, bi(42, 0xf0)},
		boolField("subnet local", func(b []byte) bool { return v(b).SubnetLocal() }, func(b []byte, x bool) { v(b).SetSubnetLocal(x) }, bi(42, 0x08)),
		{"local ACK timeout", func(b []byte, x uint64) { v(b).SetLocalACKTimeout(uint8(x)) }, func(b []byte) uint64 { return uint64(v(b).LocalACKTimeout()) }, bi(43, 0xf8)},
	}
}

// shift moves a path's fields to where the path sits in a message.
func shift(fs []field, base int, view func(b []byte) []byte, prefix string) []field {
	out := make([]field, len(fs))
	for i, f := range fs {
		f := f
		at := make([]span, len(f.at))
		for j, s := range f.at {
			at[j] = span{s.off + base, s.mask}
		}
		out[i] = field{
			name: prefix + f.name,
			set:  func(b []byte, v uint64) { f.set(view(b), v) },
			get:  func(b []byte) uint64 { return f.get(view(b)) },
			at:   at,
		}
	}
	return out
}

func TestLayoutPaths(t *testing.T) {
	checkLayout(t, "REQPath", cm.PathSize, pathFields[cm.REQPath](39, 40, 41))
	checkLayout(t, "LAPPath", cm.PathSize, pathFields[cm.LAPPath](41, 39, 40))
}

func TestLayoutREQ(t *testing.T) {
	r := func(b []byte) cm.REQ { return cm.REQ(b) }
	fs := []field{
		{"local comm ID", func(b []byte, v uint64) { r(b).SetLocalCommID(uint32(v)) }, func(b []byte) uint64 { return uint64(r(b).LocalCommID()) }, by(0, 4)},
		{"vendor ID", func(b []byte, v uint64) { r(b).SetVendorID(uint32(v)) }, func(b []byte) uint64 { return uint64(r(b).VendorID()) }, by(5, 3)},
		{"service ID", func(b []byte, v uint64) { r(b).SetServiceID(v) }, func(b []byte) uint64 { return r(b).ServiceID() }, by(8, 8)},
		{"local CA GUID", func(b []byte, v uint64) { r(b).SetLocalCAGUID(v) }, func(b []byte) uint64 { return r(b).LocalCAGUID() }, by(16, 8)},
		{"local Q_Key", func(b []byte, v uint64) { r(b).SetLocalQKey(uint32(v)) }, func(b []byte) uint64 { return uint64(r(b).LocalQKey()) }, by(28, 4)},
		{"local QPN", func(b []byte, v uint64) { r(b).SetLocalQPN(uint32(v)) }, func(b []byte) uint64 { return uint64(r(b).LocalQPN()) }, by(32, 3)},
		{"responder resources", func(b []byte, v uint64) { r(b).SetResponderResources(uint8(v)) }, func(b []byte) uint64 { return uint64(r(b).ResponderResources()) }, by(35, 1)},
		{"local EECN", func(b []byte, v uint64) { r(b).SetLocalEECN(uint32(v)) }, func(b []byte) uint64 { return uint64(r(b).LocalEECN()) }, by(36, 3)},
		{"initiator depth", func(b []byte, v uint64) { r(b).SetInitiatorDepth(uint8(v)) }, func(b []byte) uint64 { return uint64(r(b).InitiatorDepth()) }, by(39, 1)},
		{"remote EECN", func(b []byte, v uint64) { r(b).SetRemoteEECN(uint32(v)) }, func(b []byte) uint64 { return uint64(r(b).RemoteEECN()) }, by(40, 3)},
		{"remote CM response timeout", func(b []byte, v uint64) { r(b).SetRemoteCMResponseTimeout(uint8(v)) }, func(b []byte) uint64 { return uint64(r(b).RemoteCMResponseTimeout()) }, bi(43, 0xf8)},
		{"transport service type", func(b []byte, v uint64) { r(b).SetTransportServiceType(cm.TransportType(v)) }, func(b []byte) uint64 { return uint64(r(b).TransportServiceType()) }, bi(43, 0x06)},
		boolField("end-to-end flow control", func(b []byte) bool { return r(b).EndToEndFlowControl() }, func(b []byte, v bool) { r(b).SetEndToEndFlowControl(v) }, bi(43, 0x01)),
		{"starting PSN", func(b []byte, v uint64) { r(b).SetStartingPSN(uint32(v)) }, func(b []byte) uint64 { return uint64(r(b).StartingPSN()) }, by(44, 3)},
		{"local CM response timeout", func(b []byte, v uint64) { r(b).SetLocalCMResponseTimeout(uint8(v)) }, func(b []byte) uint64 { return uint64(r(b).LocalCMResponseTimeout()) }, bi(47, 0xf8)},
		{"retry count", func(b []byte, v uint64) { r(b).SetRetryCount(uint8(v)) }, func(b []byte) uint64 { return uint64(r(b).RetryCount()) }, bi(47, 0x07)},
		{"P_Key", func(b []byte, v uint64) { r(b).SetPKey(uint16(v)) }, func(b []byte) uint64 { return uint64(r(b).PKey()) }, by(48, 2)},
		{"path MTU", func(b []byte, v uint64) { r(b).SetPathMTU(cm.MTU(v)) }, func(b []byte) uint64 { return uint64(r(b).PathMTU()) }, bi(50, 0xf0)},
		boolField("RDC exists", func(b []byte) bool { return r(b).RDCExists() }, func(b []byte, v bool) { r(b).SetRDCExists(v) }, bi(50, 0x08)),
		{"RNR retry count", func(b []byte, v uint64) { r(b).SetRNRRetryCount(uint8(v)) }, func(b []byte) uint64 { return uint64(r(b).RNRRetryCount()) }, bi(50, 0x07)},
		{"max CM retries", func(b []byte, v uint64) { r(b).SetMaxCMRetries(uint8(v)) }, func(b []byte) uint64 { return uint64(r(b).MaxCMRetries()) }, bi(51, 0xf0)},
		boolField("SRQ", func(b []byte) bool { return r(b).SRQ() }, func(b []byte, v bool) { r(b).SetSRQ(v) }, bi(51, 0x08)),
		{"extended transport type", func(b []byte, v uint64) { r(b).SetExtendedTransportType(uint8(v)) }, func(b []byte) uint64 { return uint64(r(b).ExtendedTransportType()) }, bi(51, 0x07)},
		boolField("SAP supported", func(b []byte) bool { return r(b).SAPSupported() }, func(b []byte, v bool) { r(b).SetSAPSupported(v) }, bi(139, 0x04)),
		arr("private data", func(b []byte) []byte { return r(b).PrivateData() }, 140, 92),
	}
	fs = append(fs, shift(pathFields[cm.REQPath](39, 40, 41), 52, func(b []byte) []byte { return r(b).Primary() }, "primary ")...)
	fs = append(fs, shift(pathFields[cm.REQPath](39, 40, 41), 96, func(b []byte) []byte { return r(b).Alternate() }, "alternate ")...)
	checkLayout(t, "REQ", cm.DataSize, fs)
}

func TestLayoutREP(t *testing.T) {
	r := func(b []byte) cm.REP { return cm.REP(b) }
	checkLayout(t, "REP", cm.DataSize, []field{
		{"local comm ID", func(b []byte, v uint64) { r(b).SetLocalCommID(uint32(v)) }, func(b []byte) uint64 { return uint64(r(b).LocalCommID()) }, by(0, 4)},
		{"remote comm ID", func(b []byte, v uint64) { r(b).SetRemoteCommID(uint32(v)) }, func(b []byte) uint64 { return uint64(r(b).RemoteCommID()) }, by(4, 4)},
		{"local Q_Key", func(b []byte, v uint64) { r(b).SetLocalQKey(uint32(v)) }, func(b []byte) uint64 { return uint64(r(b).LocalQKey()) }, by(8, 4)},
		{"local QPN", func(b []byte, v uint64) { r(b).SetLocalQPN(uint32(v)) }, func(b []byte) uint64 { return uint64(r(b).LocalQPN()) }, by(12, 3)},
		{"vendor ID", func(b []byte, v uint64) { r(b).SetVendorID(uint32(v)) }, func(b []byte) uint64 { return uint64(r(b).VendorID()) }, []span{{15, 0xff}, {19, 0xff}, {23, 0xff}}},
		{"local EECN", func(b []byte, v uint64) { r(b).SetLocalEECN(uint32(v)) }, func(b []byte) uint64 { return uint64(r(b).LocalEECN()) }, by(16, 3)},
		{"starting PSN", func(b []byte, v uint64) { r(b).SetStartingPSN(uint32(v)) }, func(b []byte) uint64 { return uint64(r(b).StartingPSN()) }, by(20, 3)},
		{"responder resources", func(b []byte, v uint64) { r(b).SetResponderResources(uint8(v)) }, func(b []byte) uint64 { return uint64(r(b).ResponderResources()) }, by(24, 1)},
		{"initiator depth", func(b []byte, v uint64) { r(b).SetInitiatorDepth(uint8(v)) }, func(b []byte) uint64 { return uint64(r(b).InitiatorDepth()) }, by(25, 1)},
		{"target ACK delay", func(b []byte, v uint64) { r(b).SetTargetACKDelay(uint8(v)) }, func(b []byte) uint64 { return uint64(r(b).TargetACKDelay()) }, bi(26, 0xf8)},
		{"failover accepted", func(b []byte, v uint64) { r(b).SetFailoverAccepted(uint8(v)) }, func(b []byte) uint64 { return uint64(r(b).FailoverAccepted()) }, bi(26, 0x06)},
		boolField("end-to-end flow control", func(b []byte) bool { return r(b).EndToEndFlowControl() }, func(b []byte, v bool) { r(b).SetEndToEndFlowControl(v) }, bi(26, 0x01)),
		{"RNR retry count", func(b []byte, v uint64) { r(b).SetRNRRetryCount(uint8(v)) }, func(b []byte) uint64 { return uint64(r(b).RNRRetryCount()) }, bi(27, 0xe0)},
		boolField("SRQ", func(b []byte) bool { return r(b).SRQ() }, func(b []byte, v bool) { r(b).SetSRQ(v) }, bi(27, 0x10)),
		{"local CA GUID", func(b []byte, v uint64) { r(b).SetLocalCAGUID(v) }, func(b []byte) uint64 { return r(b).LocalCAGUID() }, by(28, 8)},
		arr("private data", func(b []byte) []byte { return r(b).PrivateData() }, 36, 196),
	})
}

// commFields are the two comm IDs every connected-mode message starts with.
func commFields(setL, setR func(b []byte, v uint32), getL, getR func(b []byte) uint32) []field {
	return []field{
		{"local comm ID", func(b []byte, v uint64) { setL(b, uint32(v)) }, func(b []byte) uint64 { return uint64(getL(b)) }, by(0, 4)},
		{"remote comm ID", func(b []byte, v uint64) { setR(b, uint32(v)) }, func(b []byte) uint64 { return uint64(getR(b)) }, by(4, 4)},
	}
}

func TestLayoutSmall(t *testing.T) {
	mra := func(b []byte) cm.MRA { return cm.MRA(b) }
	checkLayout(t, "MRA", cm.DataSize, append(commFields(
		func(b []byte, v uint32) { mra(b).SetLocalCommID(v) }, func(b []byte, v uint32) { mra(b).SetRemoteCommID(v) },
		func(b []byte) uint32 { return mra(b).LocalCommID() }, func(b []byte) uint32 { return mra(b).RemoteCommID() }),
		field{"message MRAed", func(b []byte, v uint64) { mra(b).SetMessageMRAed(cm.MsgKind(v)) }, func(b []byte) uint64 { return uint64(mra(b).MessageMRAed()) }, bi(8, 0xc0)},
		field{"service timeout", func(b []byte, v uint64) { mra(b).SetServiceTimeout(uint8(v)) }, func(b []byte) uint64 { return uint64(mra(b).ServiceTimeout()) }, bi(9, 0xf8)},
		arr("private data", func(b []byte) []byte { return mra(b).PrivateData() }, 10, 222),
	))

	rej := func(b []byte) cm.REJ { return cm.REJ(b) }
	checkLayout(t, "REJ", cm.DataSize, append(commFields(
		func(b []byte, v uint32) { rej(b).SetLocalCommID(v) }, func(b []byte, v uint32) { rej(b).SetRemoteCommID(v) },
		func(b []byte) uint32 { return rej(b).LocalCommID() }, func(b []byte) uint32 { return rej(b).RemoteCommID() }),
		field{"message rejected", func(b []byte, v uint64) { rej(b).SetMessageRejected(cm.MsgKind(v)) }, func(b []byte) uint64 { return uint64(rej(b).MessageRejected()) }, bi(8, 0xc0)},
		field{"rejected info length", func(b []byte, v uint64) { rej(b).SetRejectedInfoLength(uint8(v)) }, func(b []byte) uint64 { return uint64(rej(b).RejectedInfoLength()) }, bi(9, 0xfe)},
		field{"reason", func(b []byte, v uint64) { rej(b).SetReason(cm.RejectReason(v)) }, func(b []byte) uint64 { return uint64(rej(b).Reason()) }, by(10, 2)},
		arr("ARI", func(b []byte) []byte { return rej(b).ARI() }, 12, 72),
		arr("private data", func(b []byte) []byte { return rej(b).PrivateData() }, 84, 148),
	))

	rtu := func(b []byte) cm.RTU { return cm.RTU(b) }
	checkLayout(t, "RTU", cm.DataSize, append(commFields(
		func(b []byte, v uint32) { rtu(b).SetLocalCommID(v) }, func(b []byte, v uint32) { rtu(b).SetRemoteCommID(v) },
		func(b []byte) uint32 { return rtu(b).LocalCommID() }, func(b []byte) uint32 { return rtu(b).RemoteCommID() }),
		arr("private data", func(b []byte) []byte { return rtu(b).PrivateData() }, 8, 224),
	))

	dreq := func(b []byte) cm.DREQ { return cm.DREQ(b) }
	checkLayout(t, "DREQ", cm.DataSize, append(commFields(
		func(b []byte, v uint32) { dreq(b).SetLocalCommID(v) }, func(b []byte, v uint32) { dreq(b).SetRemoteCommID(v) },
		func(b []byte) uint32 { return dreq(b).LocalCommID() }, func(b []byte) uint32 { return dreq(b).RemoteCommID() }),
		field{"remote QPN/EECN", func(b []byte, v uint64) { dreq(b).SetRemoteQPN(uint32(v)) }, func(b []byte) uint64 { return uint64(dreq(b).RemoteQPN()) }, by(8, 3)},
		arr("private data", func(b []byte) []byte { return dreq(b).PrivateData() }, 12, 220),
	))

	drep := func(b []byte) cm.DREP { return cm.DREP(b) }
	checkLayout(t, "DREP", cm.DataSize, append(commFields(
		func(b []byte, v uint32) { drep(b).SetLocalCommID(v) }, func(b []byte, v uint32) { drep(b).SetRemoteCommID(v) },
		func(b []byte) uint32 { return drep(b).LocalCommID() }, func(b []byte) uint32 { return drep(b).RemoteCommID() }),
		arr("private data", func(b []byte) []byte { return drep(b).PrivateData() }, 8, 224),
	))
}

func TestLayoutSIDR(t *testing.T) {
	q := func(b []byte) cm.SIDRREQ { return cm.SIDRREQ(b) }
	checkLayout(t, "SIDR_REQ", cm.DataSize, []field{
		{"request ID", func(b []byte, v uint64) { q(b).SetRequestID(uint32(v)) }, func(b []byte) uint64 { return uint64(q(b).RequestID()) }, by(0, 4)},
		{"P_Key", func(b []byte, v uint64) { q(b).SetPKey(uint16(v)) }, func(b []byte) uint64 { return uint64(q(b).PKey()) }, by(4, 2)},
		{"service ID", func(b []byte, v uint64) { q(b).SetServiceID(v) }, func(b []byte) uint64 { return q(b).ServiceID() }, by(8, 8)},
		arr("private data", func(b []byte) []byte { return q(b).PrivateData() }, 16, 216),
	})
	p := func(b []byte) cm.SIDRREP { return cm.SIDRREP(b) }
	checkLayout(t, "SIDR_REP", cm.DataSize, []field{
		{"request ID", func(b []byte, v uint64) { p(b).SetRequestID(uint32(v)) }, func(b []byte) uint64 { return uint64(p(b).RequestID()) }, by(0, 4)},
		{"status", func(b []byte, v uint64) { p(b).SetStatus(cm.SIDRStatus(v)) }, func(b []byte) uint64 { return uint64(p(b).Status()) }, by(4, 1)},
		{"additional information length", func(b []byte, v uint64) { p(b).SetAdditionalInfoLength(uint8(v)) }, func(b []byte) uint64 { return uint64(p(b).AdditionalInfoLength()) }, by(5, 1)},
		{"vendor ID", func(b []byte, v uint64) { p(b).SetVendorID(uint32(v)) }, func(b []byte) uint64 { return uint64(p(b).VendorID()) }, append(by(6, 2), span{11, 0xff})},
		{"QPN", func(b []byte, v uint64) { p(b).SetQPN(uint32(v)) }, func(b []byte) uint64 { return uint64(p(b).QPN()) }, by(8, 3)},
		{"service ID", func(b []byte, v uint64) { p(b).SetServiceID(v) }, func(b []byte) uint64 { return p(b).ServiceID() }, by(12, 8)},
		{"Q_Key", func(b []byte, v uint64) { p(b).SetQKey(uint32(v)) }, func(b []byte) uint64 { return uint64(p(b).QKey()) }, by(20, 4)},
		arr("additional information", func(b []byte) []byte { return p(b).AdditionalInfo() }, 24, 72),
		arr("private data", func(b []byte) []byte { return p(b).PrivateData() }, 96, 136),
	})
}

func TestLayoutLAPAPR(t *testing.T) {
	l := func(b []byte) cm.LAP { return cm.LAP(b) }
	fs := append(commFields(
		func(b []byte, v uint32) { l(b).SetLocalCommID(v) }, func(b []byte, v uint32) { l(b).SetRemoteCommID(v) },
		func(b []byte) uint32 { return l(b).LocalCommID() }, func(b []byte) uint32 { return l(b).RemoteCommID() }),
		field{"remote QPN/EECN", func(b []byte, v uint64) { l(b).SetRemoteQPN(uint32(v)) }, func(b []byte) uint64 { return uint64(l(b).RemoteQPN()) }, by(12, 3)},
		field{"remote CM response timeout", func(b []byte, v uint64) { l(b).SetRemoteCMResponseTimeout(uint8(v)) }, func(b []byte) uint64 { return uint64(l(b).RemoteCMResponseTimeout()) }, bi(15, 0xf8)},
		arr("private data", func(b []byte) []byte { return l(b).PrivateData() }, 64, 168),
	)
	fs = append(fs, shift(pathFields[cm.LAPPath](41, 39, 40), 20, func(b []byte) []byte { return l(b).Alternate() }, "alternate ")...)
	checkLayout(t, "LAP", cm.DataSize, fs)

	a := func(b []byte) cm.APR { return cm.APR(b) }
	checkLayout(t, "APR", cm.DataSize, append(commFields(
		func(b []byte, v uint32) { a(b).SetLocalCommID(v) }, func(b []byte, v uint32) { a(b).SetRemoteCommID(v) },
		func(b []byte) uint32 { return a(b).LocalCommID() }, func(b []byte) uint32 { return a(b).RemoteCommID() }),
		field{"additional information length", func(b []byte, v uint64) { a(b).SetAdditionalInfoLength(uint8(v)) }, func(b []byte) uint64 { return uint64(a(b).AdditionalInfoLength()) }, by(8, 1)},
		field{"AP status", func(b []byte, v uint64) { a(b).SetStatus(cm.APRStatus(v)) }, func(b []byte) uint64 { return uint64(a(b).Status()) }, by(9, 1)},
		arr("additional information", func(b []byte) []byte { return a(b).AdditionalInfo() }, 12, 72),
		arr("private data", func(b []byte) []byte { return a(b).PrivateData() }, 84, 148),
	))
}

func TestLayoutMADHeader(t *testing.T) {
	m := func(b []byte) cm.MAD { return cm.MAD(b) }
	checkLayout(t, "MAD header", cm.HeaderSize, []field{
		{"base version", func(b []byte, v uint64) { m(b).SetBaseVersion(uint8(v)) }, func(b []byte) uint64 { return uint64(m(b).BaseVersion()) }, by(0, 1)},
		{"management class", func(b []byte, v uint64) { m(b).SetMgmtClass(uint8(v)) }, func(b []byte) uint64 { return uint64(m(b).MgmtClass()) }, by(1, 1)},
		{"class version", func(b []byte, v uint64) { m(b).SetClassVersion(uint8(v)) }, func(b []byte) uint64 { return uint64(m(b).ClassVersion()) }, by(2, 1)},
		{"R|method", func(b []byte, v uint64) { m(b).SetMethod(cm.Method(v)) }, func(b []byte) uint64 { return uint64(m(b).Method()) }, by(3, 1)},
		{"status", func(b []byte, v uint64) { m(b).SetStatus(uint16(v)) }, func(b []byte) uint64 { return uint64(m(b).Status()) }, by(4, 2)},
		{"class specific", func(b []byte, v uint64) { m(b).SetClassSpecific(uint16(v)) }, func(b []byte) uint64 { return uint64(m(b).ClassSpecific()) }, by(6, 2)},
		{"transaction ID", func(b []byte, v uint64) { m(b).SetTransactionID(v) }, func(b []byte) uint64 { return m(b).TransactionID() }, by(8, 8)},
		{"attribute ID", func(b []byte, v uint64) { m(b).SetAttributeID(cm.AttrID(v)) }, func(b []byte) uint64 { return uint64(m(b).AttributeID()) }, by(16, 2)},
		{"attribute modifier", func(b []byte, v uint64) { m(b).SetAttributeModifier(uint32(v)) }, func(b []byte) uint64 { return uint64(m(b).AttributeModifier()) }, by(20, 4)},
	})
}

func TestLayoutCMAHeader(t *testing.T) {
	h := func(b []byte) cm.CMAHeader { return cm.CMAHeader(b) }
	checkLayout(t, "cma_hdr", cm.CMAHeaderSize, []field{
		{"cma_version", func(b []byte, v uint64) { h(b).SetVersion(uint8(v)) }, func(b []byte) uint64 { return uint64(h(b).Version()) }, by(0, 1)},
		{"ip_version", func(b []byte, v uint64) { h(b).SetIPVersion(uint8(v)) }, func(b []byte) uint64 { return uint64(h(b).IPVersion()) }, bi(1, 0xf0)},
		{"port", func(b []byte, v uint64) { h(b).SetSrcPort(uint16(v)) }, func(b []byte) uint64 { return uint64(h(b).SrcPort()) }, by(2, 2)},
	})
}
