//go:build linux

package udp

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestParseCmsgsTOSMatches: parseCmsgsTOS's one-test recognition of a lone
// IP_TOS message gives what parseCmsgs gives, for that layout with every
// TOS byte and for every variation of its length, level, type and the
// buffer's length (each of which parseCmsgs treats otherwise), and for
// several messages.
func TestParseCmsgsTOSMatches(t *testing.T) {
	type variant struct {
		name       string
		len        int
		level, typ int32
		size       int
	}
	lenTOS, space := unix.CmsgLen(1), unix.CmsgSpace(1)
	vs := []variant{
		{"ip_tos", lenTOS, unix.IPPROTO_IP, unix.IP_TOS, space},
		{"no data", unix.CmsgLen(0), unix.IPPROTO_IP, unix.IP_TOS, space},
		{"int data", unix.CmsgLen(4), unix.IPPROTO_IP, unix.IP_TOS, space},
		{"len past buffer", space + 1, unix.IPPROTO_IP, unix.IP_TOS, space},
		{"tclass", unix.CmsgLen(4), unix.IPPROTO_IPV6, unix.IPV6_TCLASS, space},
		{"tclass level only", lenTOS, unix.IPPROTO_IPV6, unix.IP_TOS, space},
		{"other type", lenTOS, unix.IPPROTO_IP, unix.IP_TTL, space},
		{"gro", unix.CmsgLen(4), unix.SOL_UDP, unix.UDP_GRO, space},
		{"ovfl", unix.CmsgLen(4), unix.SOL_SOCKET, unix.SO_RXQ_OVFL, space},
		{"short buffer", lenTOS, unix.IPPROTO_IP, unix.IP_TOS, lenTOS},
		{"longer buffer", lenTOS, unix.IPPROTO_IP, unix.IP_TOS, space + 8},
	}
	for _, v := range vs {
		for tos := range 256 {
			b := make([]byte, cmsgSpace)
			h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
			h.Level, h.Type = v.level, v.typ
			h.SetLen(v.len)
			for i := unix.CmsgLen(0); i < unix.CmsgLen(0)+4; i++ {
				b[i] = byte(tos)
			}
			if got, want := parseCmsgsTOS(b[:v.size]), parseCmsgs(b[:v.size]); got != want {
				t.Fatalf("%s, byte %#x: parseCmsgsTOS = %+v, parseCmsgs = %+v", v.name, tos, got, want)
			}
		}
	}
	// IP_TOS followed by UDP_GRO: parsed whole.
	b := make([]byte, cmsgSpace)
	n := putTOSCmsg(b, ECNCE, false)
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[n]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_GRO
	h.SetLen(unix.CmsgLen(4))
	*(*int32)(unsafe.Pointer(&b[n+unix.CmsgLen(0)])) = 1052
	n += unix.CmsgSpace(4)
	if c := parseCmsgsTOS(b[:n]); c != parseCmsgs(b[:n]) || c.groSize != 1052 || c.tos != ECNCE {
		t.Errorf("tos and gro: %+v", c)
	}
}
