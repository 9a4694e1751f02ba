//go:build !amd64 || purego

package icrc

// hasFold is false: there is no folding kernel for this architecture (or the
// purego build tag is set), and update uses hash/crc32.
const hasFold = false

func foldAVX512(r uint32, p []byte, out *[16]byte) { panic("icrc: no folding kernel") }

func foldCopyAVX512(r uint32, p []byte, dst *byte, out *[16]byte) { panic("icrc: no folding kernel") }

// hasSmall is false: there is no carry-less multiply kernel here.
const hasSmall = false

func clmulSmall(r uint32, p []byte) uint32 { panic("icrc: no carry-less multiply kernel") }

func clmulShort(r uint32, p []byte) uint32 { panic("icrc: no carry-less multiply kernel") }
