package transport

import "encoding/binary"

func nativePut(b []byte, v uint64) { binary.NativeEndian.PutUint64(b, v) }
func nativeGet(b []byte) uint64    { return binary.NativeEndian.Uint64(b) }
