package memreg

import "strings"

// Access is a set of verbs access flags. The values equal libibverbs'
// enum ibv_access_flags so that they can be passed through unchanged.
type Access uint32

// Access flags (values equal libibverbs IBV_ACCESS_*).
const (
	// AccessLocalWrite lets the local consumer's work requests write the
	// memory (receive buffers, RDMA READ destinations, atomic results).
	// Local read is always allowed.
	AccessLocalWrite Access = 1
	// AccessRemoteWrite lets a peer RDMA WRITE into the memory.
	AccessRemoteWrite Access = 2
	// AccessRemoteRead lets a peer RDMA READ the memory.
	AccessRemoteRead Access = 4
	// AccessRemoteAtomic lets a peer run CompareSwap / FetchAdd on it.
	AccessRemoteAtomic Access = 8
	// AccessMWBind lets memory windows be bound to the region.
	AccessMWBind Access = 16
	// AccessOnDemand (IBV_ACCESS_ON_DEMAND) registers the region without
	// faulting its pages in: RegisterMR otherwise makes every page of the
	// region resident (and, for a region anyone may write, writable in
	// the page tables) before it returns, as ibv_reg_mr pins them, so that
	// the first transfer into fresh memory does not pay a page fault per
	// 4 KiB on the data path. A region much larger than what it will hold
	// (a sparse buffer) wants it: its untouched pages then cost nothing.
	// Nor does RegisterMR check such a region's pages (no ErrBadAddress):
	// they must be accessible as registered whenever a work request or a
	// peer may use them. A page that is not (PROT_NONE, a guard page, a
	// truncated file) faults in the process on the data path, which kills
	// it — a peer's RDMA READ of it included — where an RNIC's ODP would
	// fail the access.
	AccessOnDemand Access = 64
)

const (
	// accessRemote is every remote right.
	accessRemote = AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
	// accessMRValid is every flag a memory region may carry.
	accessMRValid = AccessLocalWrite | accessRemote | AccessMWBind | AccessOnDemand
	// accessNeedsLocalWrite is the set of rights that, by the verbs rule,
	// require AccessLocalWrite on the region.
	accessNeedsLocalWrite = AccessRemoteWrite | AccessRemoteAtomic
)

var accessNames = [...]struct {
	a    Access
	name string
}{
	{AccessLocalWrite, "LOCAL_WRITE"},
	{AccessRemoteWrite, "REMOTE_WRITE"},
	{AccessRemoteRead, "REMOTE_READ"},
	{AccessRemoteAtomic, "REMOTE_ATOMIC"},
	{AccessMWBind, "MW_BIND"},
	{AccessOnDemand, "ON_DEMAND"},
}

// String returns the flags as "LOCAL_WRITE|REMOTE_READ"; no flags is "NONE";
// unknown bits are shown as hex.
func (a Access) String() string {
	if a == 0 {
		return "NONE"
	}
	var sb strings.Builder
	rest := a
	for _, n := range accessNames {
		if a&n.a != 0 {
			if sb.Len() > 0 {
				sb.WriteByte('|')
			}
			sb.WriteString(n.name)
			rest &^= n.a
		}
	}
	if rest != 0 {
		if sb.Len() > 0 {
			sb.WriteByte('|')
		}
		sb.WriteString("0x")
		const hex = "0123456789abcdef"
		var buf [8]byte
		i := len(buf)
		for v := uint32(rest); v != 0; v >>= 4 {
			i--
			buf[i] = hex[v&0xf]
		}
		sb.Write(buf[i:])
	}
	return sb.String()
}

// validMR reports the first verbs rule the flags break for a memory
// region, or nil.
func validMR(a Access) error {
	if a&^accessMRValid != 0 {
		return errUnknownFlags
	}
	if a&accessNeedsLocalWrite != 0 && a&AccessLocalWrite == 0 {
		return errRemoteNeedsLocalWrite
	}
	return nil
}
