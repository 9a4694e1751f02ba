//go:build amd64 && !purego

#include "textflag.h"

// clmulSmall: CRC-32/IEEE (bit-reflected) of p, len(p) >= 16, with
// PCLMULQDQ on one 128-bit lane and no lookup tables, for the short pieces
// (a small packet's headers and payload, 16..255 bytes) that
// foldCopyAVX512 does not take. The register r (already inverted, as the
// folding kernel takes it) is XORed into the first four bytes of p.
//
// A length that is not a multiple of 16 is handled at the front: the first
// block is the first t bytes of p (t = len%16, or 16) shifted up behind
// 16-t zero bytes, which a CRC from a zero register does not see; the
// register's bytes that the shift pushes out (t < 4) are XORed into the
// next block instead. Every further block is a plain 16-byte fold, and the
// final 128 bits are reduced to 32 with the Barrett constants of Intel's
// "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ" paper
// (bit-reflected CRC-32, as in hash/crc32's and Linux's implementations).

// Byte indices 0..15, for the PSHUFB shift masks.
DATA smallIota<>+0(SB)/8, $0x0706050403020100
DATA smallIota<>+8(SB)/8, $0x0f0e0d0c0b0a0908
GLOBL smallIota<>(SB), RODATA, $16

// Fold by 128 bits (the k128 pair of fold_amd64.s).
DATA smallK128<>+0(SB)/8, $0x1751997d0
DATA smallK128<>+8(SB)/8, $0x0ccaa009e
GLOBL smallK128<>(SB), RODATA, $16

// 64 -> 32 bit fold constant, and the Barrett pair P' and mu.
DATA smallK5<>+0(SB)/8, $0x163cd6124
GLOBL smallK5<>(SB), RODATA, $8
DATA smallPoly<>+0(SB)/8, $0x1db710641
DATA smallPoly<>+8(SB)/8, $0x1f7011641
GLOBL smallPoly<>(SB), RODATA, $16

// REDUCE128 reduces the 128 bits in X1 (X0 holding k128) to the 32-bit
// register and returns it (ret+32(FP): both kernels' frames): 128 -> 64
// bits (plus 32 of headroom), 64 -> 32, then the Barrett reduction. X3 is
// the mask of the low 32 bits of each quadword.
#define REDUCE128 \
	PCMPEQB   X3, X3; \
	PCLMULQDQ $0x01, X1, X0; \
	PSRLDQ    $8, X1; \
	PXOR      X0, X1; \
	MOVOU     X1, X2; \
	MOVQ      smallK5<>(SB), X0; \
	PSRLQ     $32, X3; \
	PSRLDQ    $4, X2; \
	PAND      X3, X1; \
	PCLMULQDQ $0x00, X0, X1; \
	PXOR      X2, X1; \
	MOVOU     smallPoly<>(SB), X0; \
	MOVOU     X1, X2; \
	PAND      X3, X1; \
	PCLMULQDQ $0x10, X0, X1; \
	PAND      X3, X1; \
	PCLMULQDQ $0x00, X0, X1; \
	PXOR      X2, X1; \
	PEXTRD    $1, X1, AX; \
	MOVL      AX, ret+32(FP); \
	RET

// func clmulSmall(r uint32, p []byte) uint32
TEXT ·clmulSmall(SB), NOSPLIT, $0-36
	MOVL r+0(FP), X8            // R: the register in bytes 0..3, zeros above
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX

	// t = ((len-1) & 15) + 1, in 1..16; z = 16 - t.
	LEAQ -1(CX), DX
	ANDQ $15, DX
	INCQ DX
	MOVQ $16, AX
	SUBQ DX, AX

	MOVOU smallIota<>(SB), X11
	PXOR  X7, X7                // PSHUFB with X7 broadcasts byte 0

	// First block: (p[0:16] ^ R) shifted up by z bytes (mask iota - z:
	// the z low bytes go negative and PSHUFB zeroes them).
	MOVQ   AX, X12
	PSHUFB X7, X12
	MOVOU  X11, X13
	PSUBB  X12, X13
	MOVOU  (SI), X1
	PXOR   X8, X1
	PSHUFB X13, X1

	// Correction for the next block: R shifted down by t bytes (mask
	// iota + t, with the indices past 15 given their top bit so that
	// PSHUFB zeroes them).
	MOVQ    DX, X12
	PSHUFB  X7, X12
	MOVOU   X11, X13
	PADDB   X12, X13
	MOVQ    $15, BX
	MOVQ    BX, X15
	PSHUFB  X7, X15
	MOVOU   X13, X14
	PCMPGTB X15, X14
	POR     X14, X13
	MOVOU   X8, X9
	PSHUFB  X13, X9

	ADDQ DX, SI
	SUBQ DX, CX                 // a multiple of 16 is left
	MOVOU smallK128<>(SB), X0
	JZ   finish

loop:
	MOVOU     (SI), X10
	PXOR      X9, X10
	PXOR      X9, X9            // the correction is for the first block only
	MOVOU     X1, X5
	PCLMULQDQ $0x00, X0, X1
	PCLMULQDQ $0x11, X0, X5
	PXOR      X5, X1
	PXOR      X10, X1
	ADDQ      $16, SI
	SUBQ      $16, CX
	JNZ       loop

finish:
	REDUCE128

// shortWin: 16 bytes of 0x80, the indices 0..15, 16 bytes of 0x80. The 16
// bytes at shortWin+k are a PSHUFB mask that moves byte i to i+16-k (k <=
// 16) or byte i+k-16 to i (k >= 16), zeroing the rest.
DATA shortWin<>+0(SB)/8, $0x8080808080808080
DATA shortWin<>+8(SB)/8, $0x8080808080808080
DATA shortWin<>+16(SB)/8, $0x0706050403020100
DATA shortWin<>+24(SB)/8, $0x0f0e0d0c0b0a0908
DATA shortWin<>+32(SB)/8, $0x8080808080808080
DATA shortWin<>+40(SB)/8, $0x8080808080808080
GLOBL shortWin<>(SB), RODATA, $48

// 0xff in byte 4: BTH byte 4 (FECN, BECN, reserved), masked.
DATA shortBTH4<>+0(SB)/8, $0x000000ff00000000
DATA shortBTH4<>+8(SB)/8, $0
GLOBL shortBTH4<>(SB), RODATA, $16

// func clmulShort(r uint32, p []byte) uint32
//
// The register after p (16 <= len(p) < 32, a short packet's covered UDP
// payload) from register r, both inverted, with p[4] read as 0xff. With t
// = len-16, the message is A = p[0:16] (r XORed into bytes 0..3, byte 4
// masked) followed by the t bytes p[16:]. A CRC from a zero register does
// not see leading zero bytes, so that is the 32-byte message of 16-t zero
// bytes, A[0:t], then the last 16 bytes B = p[t:16+t] with A's changes to
// p (D = A ^ p[0:16]) moved down by t bytes: one 16-byte fold of the first
// block onto the second and clmulSmall's final reduction, no loop and no
// tables but the two shuffle masks at shortWin+t and shortWin+16+t. For
// t = 0 (an ACK's 16 bytes) A alone is reduced.
TEXT ·clmulShort(SB), NOSPLIT, $0-36
	MOVL  r+0(FP), X8
	MOVQ  p_base+8(FP), SI
	MOVQ  p_len+16(FP), CX
	LEAQ  shortWin<>(SB), AX
	LEAQ  -16(CX), DX          // t

	MOVOU (SI), X2              // p[0:16]
	MOVOU X2, X1
	PXOR  X8, X1
	POR   shortBTH4<>(SB), X1   // A
	MOVOU smallK128<>(SB), X0
	TESTQ DX, DX
	JZ    shortReduce           // t = 0 (an ACK): A is the whole message
	PXOR  X1, X2                // D = A ^ p[0:16]

	// First block: 16-t zero bytes, then A[0:t].
	MOVOU  (AX)(DX*1), X3
	PSHUFB X3, X1

	// Second block: p[t:16+t] ^ (D moved down by t bytes).
	MOVOU  -16(SI)(CX*1), X10
	MOVOU  16(AX)(DX*1), X4
	PSHUFB X4, X2
	PXOR   X2, X10

	// Fold the first block onto the second.
	MOVOU     X1, X5
	PCLMULQDQ $0x00, X0, X1
	PCLMULQDQ $0x11, X0, X5
	PXOR      X5, X1
	PXOR      X10, X1

shortReduce:
	REDUCE128
