// Package pingpong is rocev2d's family of ibv_*_pingpong peers: pingpong
// (ibv_rc_pingpong), uc-pingpong (ibv_uc_pingpong), ud-pingpong
// (ibv_ud_pingpong) and srq-pingpong (ibv_srq_pingpong), each flag- and
// wire-compatible with its rdma-core tool, so that either side of a run may
// be the real tool on rxe or an RNIC.
//
// The four share their flags (parsePPFlags), their help texts' common
// lines (usage.go), and one session runner (session.go: the endpoint
// opened before or after the out-of-band TCP connection, the exchange,
// the loop, the result lines, -c and -v); what differs is a side: one QP
// of the kind's type (rc.go) or several RC QPs on one SRQ (srq.go).
// Commands returns them for rocev2d's dispatch.
//
// # Layering
//
// Under cmd/: it builds on cmd/internal/cli, cmd/internal/oob (the tools'
// out-of-band exchanges), transport and memreg; only rocev2d's main
// imports it.
package pingpong
