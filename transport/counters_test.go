package transport

import (
	"reflect"
	"testing"
)

// TestCountersListed: every Counters field is named in List, once, and
// snapshot copies every one of them.
func TestCountersListed(t *testing.T) {
	var c Counters
	v := reflect.ValueOf(&c).Elem()
	for i := 0; i < v.NumField(); i++ {
		v.Field(i).SetUint(uint64(i + 1))
	}
	s := c.snapshot()
	if s != c {
		t.Fatalf("snapshot %+v != %+v", s, c)
	}
	l := s.List()
	if len(l) != v.NumField() {
		t.Fatalf("List has %d counters, Counters %d fields", len(l), v.NumField())
	}
	seen := map[uint64]string{}
	for _, x := range l {
		if prev, dup := seen[x.Value]; dup {
			t.Errorf("%s and %s read the same field", prev, x.Name)
		}
		seen[x.Value] = x.Name
	}
}
