//go:build amd64 && !purego

package icrc

import "golang.org/x/sys/cpu"

// hasFold reports whether foldAVX512 can run: it needs VPCLMULQDQ on ZMM
// registers and AVX-512 F/VL (x/sys/cpu also checks that the OS saves the
// AVX-512 state).
var hasFold = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VPCLMULQDQ && cpu.X86.HasPCLMULQDQ

// foldAVX512 folds p into 16 bytes with four 512-bit carry-less multiply
// accumulators (see fold_amd64.s). len(p) >= 256, len(p)%16 == 0.
func foldAVX512(r uint32, p []byte, out *[16]byte) { foldCopyAVX512(r, p, nil, out) }

// foldCopyAVX512 is foldAVX512 that also copies p to dst (len(p) bytes
// must fit there) unless dst is nil; see fold_amd64.s.
//
//go:noescape
func foldCopyAVX512(r uint32, p []byte, dst *byte, out *[16]byte)

// hasSmall reports whether clmulSmall can run (PCLMULQDQ; PSHUFB and
// PEXTRD are SSSE3 and SSE4.1).
var hasSmall = cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSSE3 && cpu.X86.HasSSE41

// clmulSmall returns the CRC register after p from register r (both
// inverted, as foldAVX512 takes them), with one 128-bit carry-less
// multiply lane and no lookup tables (small_amd64.s). len(p) >= 16.
//
//go:noescape
func clmulSmall(r uint32, p []byte) uint32

// clmulShort returns the register after p from register r (both inverted,
// as for clmulSmall) with p[4], BTH byte 4, read as 0xff: shortPayload's
// CRC in one carry-less fold and the final reduction (small_amd64.s).
// 16 <= len(p) < 32.
//
//go:noescape
func clmulShort(r uint32, p []byte) uint32
