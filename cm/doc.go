// Package cm implements the wire format of the InfiniBand Communication
// Manager (IBTA vol. 1 ch. 12 and §13.4) as RoCEv2 carries it: 256-byte
// management datagrams (MADs) sent as UD SEND_ONLY payloads to QP1 with
// Q_Key 0x80010000 (QP1QKey).
//
// What it offers:
//
//   - MAD, a view of a 256-byte MAD with getters and setters for the
//     24-byte common header (HeaderFields), and the constants a CM needs:
//     management class 0x07, class version 2, methods, attribute IDs.
//   - One view type per CM message — REQ, MRA, REJ, REP, RTU, DREQ, DREP,
//     SIDRREQ, SIDRREP, LAP, APR — over the 232 bytes that follow the MAD
//     header (MAD.Data), with a getter and a setter for every field (byte
//     offsets in the code are those of the IBTA tables, counted from the
//     end of the MAD header), a plain Fields struct per message
//     (REQFields, ...) with the view's Encode and Fields, and Check for the
//     values a receiver must refuse.
//   - Encode and Decode for a whole MAD: a HeaderFields plus one Message
//     (a *REQFields, *REPFields, ...), validated, with errors that name the
//     message and the field (see Error) and never a panic.
//   - rdma_cm compatibility: the IP addressing header librdmacm and the
//     kernel's rdma_cm put at the start of REQ and SIDR_REQ private data
//     (CMAHeader, CMAHeaderFields) and the service IDs of the RDMA port
//     spaces (ServiceID, SplitServiceID).
//
// Reserved fields and bits are written as zero and ignored on decode, as
// IBTA asks of receivers; reserved values of enumerated fields (a path MTU
// of 7, a "message rejected" code of 3, an ARI length above 72, ...) are
// decode errors. Values wider than their field are masked by setters and
// Encode, as the other wire packages do.
//
// A quirk worth knowing when reading the messages: a REQ's or REP's
// StartingPSN is the PSN the sender's receive queue expects, so it is the
// first PSN the receiver of the message sends with (Linux sets the passive
// side's send PSN from the REQ and the active side's from the REP; the
// golden rping capture shows it).
//
// Goroutine safety: the views are slices over caller memory; reading one
// concurrently is safe, but any setter or Encode on a view while another
// goroutine reads or writes the same bytes is a data race. The Fields
// structs are plain values. Nothing in the package keeps state.
//
// A wire package: of this module it imports only bth (for MTU, the path
// MTU code a REQ carries, one type with transport's), so the CM state
// machine and the transport may both build on it. Views, Fields, Check, Encode and the Fields' Decode
// allocate nothing; Decode allocates the message it returns behind the
// Message interface, and errors are allocated when they happen.
package cm
