//go:build amd64 && !purego

#include "textflag.h"

// FOLD folds accumulator A forward over the distance whose constants are in
// K and XORs in D: A = clmul(A.lo, K.lo) ^ clmul(A.hi, K.hi) ^ D, per 128-bit
// lane (ZMM or XMM registers alike). T is clobbered.
#define FOLD(K, A, T, D) \
	VPCLMULQDQ $0x11, K, A, T; \
	VPCLMULQDQ $0x00, K, A, A; \
	VPTERNLOGD $0x96, D, T, A

// FOLDINTO folds A forward over the distance of K and XORs it into B:
// B ^= clmul(A.lo, K.lo) ^ clmul(A.hi, K.hi). A and T are clobbered.
#define FOLDINTO(K, A, T, B) \
	VPCLMULQDQ $0x11, K, A, T; \
	VPCLMULQDQ $0x00, K, A, A; \
	VPTERNLOGD $0x96, T, A, B

// Fold constants for CRC-32/IEEE in the bit-reflected domain. Folding a
// 128-bit lane X forward by D bits is
//
//	X' = clmul(X.lo, K_lo) ^ clmul(X.hi, K_hi)
//
// with K_lo = rev32(x^(D+32) mod P) << 1 and K_hi = rev32(x^(D-32) mod P) << 1
// (TestFoldConstants recomputes them). Each constant pair is repeated over
// the four 128-bit lanes of a ZMM register.

// D = 2048: four accumulators of 64 bytes, 256 bytes per step.
DATA k2048<>+0(SB)/8, $0x11542778a
DATA k2048<>+8(SB)/8, $0x1322d1430
DATA k2048<>+16(SB)/8, $0x11542778a
DATA k2048<>+24(SB)/8, $0x1322d1430
DATA k2048<>+32(SB)/8, $0x11542778a
DATA k2048<>+40(SB)/8, $0x1322d1430
DATA k2048<>+48(SB)/8, $0x11542778a
DATA k2048<>+56(SB)/8, $0x1322d1430
GLOBL k2048<>(SB), RODATA, $64

// D = 512: one accumulator of 64 bytes.
DATA k512<>+0(SB)/8, $0x154442bd4
DATA k512<>+8(SB)/8, $0x1c6e41596
DATA k512<>+16(SB)/8, $0x154442bd4
DATA k512<>+24(SB)/8, $0x1c6e41596
DATA k512<>+32(SB)/8, $0x154442bd4
DATA k512<>+40(SB)/8, $0x1c6e41596
DATA k512<>+48(SB)/8, $0x154442bd4
DATA k512<>+56(SB)/8, $0x1c6e41596
GLOBL k512<>(SB), RODATA, $64

// D = 128: one 16-byte lane.
DATA k128<>+0(SB)/8, $0x1751997d0
DATA k128<>+8(SB)/8, $0x0ccaa009e
GLOBL k128<>(SB), RODATA, $16

// func foldCopyAVX512(r uint32, p []byte, dst *byte, out *[16]byte)
//
// r is the CRC register (^crc in hash/crc32's convention). len(p) must be at
// least 256 and a multiple of 16. It writes to out 16 bytes whose CRC from a
// zero register equals the CRC of p from register r. When dst is not nil it
// also copies p to dst (len(p) bytes), storing each block as it is loaded:
// the copy rides on the loads the fold makes anyway, and the carry-less
// multiplies, not the memory traffic, bound the loop. With dst nil (the
// plain CRC, foldAVX512) the stores are skipped by a branch per block that
// always goes the same way.
//
// Register use: SI walks p, R8 = dst - p (so block (SI) goes to (SI)(R8*1)),
// R9 = dst (zero: no copy), CX = bytes left, DI = out, Z0 the fold constants,
// Z1..Z4 the accumulators.
TEXT ·foldCopyAVX512(SB), NOSPLIT, $0-48
	MOVL r+0(FP), AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX
	MOVQ dst+32(FP), R9
	MOVQ out+40(FP), DI
	MOVQ R9, R8
	SUBQ SI, R8

	// Four accumulators over the first 256 bytes; r goes into the first
	// four bytes of the message.
	VMOVDQU64 (SI), Z1
	VMOVDQU64 64(SI), Z2
	VMOVDQU64 128(SI), Z3
	VMOVDQU64 192(SI), Z4
	TESTQ     R9, R9
	JZ        first
	VMOVDQU64 Z1, (SI)(R8*1)
	VMOVDQU64 Z2, 64(SI)(R8*1)
	VMOVDQU64 Z3, 128(SI)(R8*1)
	VMOVDQU64 Z4, 192(SI)(R8*1)

first:
	VPXORQ    Z10, Z10, Z10
	VMOVD     AX, X10
	VPXORQ    Z10, Z1, Z1
	ADDQ      $256, SI
	SUBQ      $256, CX

	VMOVDQU64 k2048<>(SB), Z0
	CMPQ      CX, $256
	JB        combine

loop256:
	// The four folds are independent; the core overlaps them.
	VMOVDQU64 (SI), Z11
	VMOVDQU64 64(SI), Z12
	VMOVDQU64 128(SI), Z13
	VMOVDQU64 192(SI), Z14
	TESTQ     R9, R9
	JZ        fold256
	VMOVDQU64 Z11, (SI)(R8*1)
	VMOVDQU64 Z12, 64(SI)(R8*1)
	VMOVDQU64 Z13, 128(SI)(R8*1)
	VMOVDQU64 Z14, 192(SI)(R8*1)

fold256:
	FOLD(Z0, Z1, Z5, Z11)
	FOLD(Z0, Z2, Z6, Z12)
	FOLD(Z0, Z3, Z7, Z13)
	FOLD(Z0, Z4, Z8, Z14)
	ADDQ      $256, SI
	SUBQ      $256, CX
	CMPQ      CX, $256
	JAE       loop256

combine:
	// Fold Z1 into Z2, Z2 into Z3, Z3 into Z4 (64 bytes apart).
	VMOVDQU64 k512<>(SB), Z0
	FOLDINTO(Z0, Z1, Z5, Z2)
	FOLDINTO(Z0, Z2, Z5, Z3)
	FOLDINTO(Z0, Z3, Z5, Z4)
	CMPQ       CX, $64
	JB         lanes

loop64:
	VMOVDQU64  (SI), Z11
	TESTQ      R9, R9
	JZ         fold64
	VMOVDQU64  Z11, (SI)(R8*1)

fold64:
	FOLD(Z0, Z4, Z5, Z11)
	ADDQ       $64, SI
	SUBQ       $64, CX
	CMPQ       CX, $64
	JAE        loop64

lanes:
	// Fold the four 128-bit lanes of Z4 into X1, oldest first.
	VMOVDQU       k128<>(SB), X0
	VEXTRACTI32X4 $1, Z4, X2
	VEXTRACTI32X4 $2, Z4, X3
	VEXTRACTI32X4 $3, Z4, X8
	VMOVDQA       X4, X1
	FOLD(X0, X1, X5, X2)
	FOLD(X0, X1, X5, X3)
	FOLD(X0, X1, X5, X8)
	CMPQ          CX, $16
	JB            done

loop16:
	VMOVDQU    (SI), X11
	TESTQ      R9, R9
	JZ         fold16
	VMOVDQU    X11, (SI)(R8*1)

fold16:
	FOLD(X0, X1, X5, X11)
	ADDQ       $16, SI
	SUBQ       $16, CX
	CMPQ       CX, $16
	JAE        loop16

done:
	VMOVDQU X1, (DI)
	VZEROUPPER
	RET
