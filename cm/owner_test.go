package cm_test

import (
	"testing"

	"github.com/gorocev2/rocev2/cm"
)

func TestCommIDTag(t *testing.T) {
	for _, tc := range []struct {
		tag      cm.CommIDTag
		id, want uint32
	}{
		{cm.CommIDTag{}, 0x12345678, 0x12345678},
		{cm.CommIDTag{Tag: 0x85000000, Mask: 0xff000000}, 0x12345678, 0x85345678},
		{cm.CommIDTag{Tag: 0x85000000, Mask: 0xff000000}, 0xffffffff, 0x85ffffff},
		{cm.CommIDTag{Tag: 0x80000000, Mask: 0xf0000000}, 0x0abcdef0, 0x8abcdef0},
		{cm.CommIDTag{Tag: 0xffff0000, Mask: 0x0f000000}, 0x00000001, 0x0f000001}, // bits outside Mask ignored
	} {
		got := tc.tag.Apply(tc.id)
		if got != tc.want {
			t.Errorf("%+v.Apply(%#x) = %#x, want %#x", tc.tag, tc.id, got, tc.want)
		}
		if !tc.tag.Owns(got) {
			t.Errorf("%+v does not own %#x", tc.tag, got)
		}
	}
	if (cm.CommIDTag{Tag: 0x85000000, Mask: 0xff000000}).Owns(0x86000001) {
		t.Error("owns another member's ID")
	}
}
