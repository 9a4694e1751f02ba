package cm

// CommIDTag is the part of a communication ID (and of a SIDR request ID)
// that names its owner: where processes share one address, the kernel
// steers a CM message to the process whose tag the communication ID it is
// addressed to carries (the RemoteCommID of REP, RTU, MRA, REJ, DREQ, DREP,
// LAP and APR; the RequestID of a SIDR_REP). The zero value tags nothing.
//
// A connection manager draws its IDs as it likes (randomly, to avoid
// stale-connection confusion across restarts) and passes them through
// Apply, which keeps the random bits outside Mask.
type CommIDTag struct {
	Tag, Mask uint32
}

// Apply returns id with the bits under Mask replaced by Tag's.
func (t CommIDTag) Apply(id uint32) uint32 { return id&^t.Mask | t.Tag&t.Mask }

// Owns reports whether id carries the tag.
func (t CommIDTag) Owns(id uint32) bool { return id&t.Mask == t.Tag&t.Mask }
