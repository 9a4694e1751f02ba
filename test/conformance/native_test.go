package conformance

import "encoding/binary"

func putNative(b []byte, v uint64) { binary.NativeEndian.PutUint64(b, v) }
