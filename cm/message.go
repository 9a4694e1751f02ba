package cm

// Message is the body of one CM message as plain values: *REQFields,
// *MRAFields, *REJFields, *REPFields, *RTUFields, *DREQFields,
// *DREPFields, *SIDRREQFields, *SIDRREPFields, *LAPFields or *APRFields.
// The set is closed.
type Message interface {
	// AttributeID returns the attribute ID of the message.
	AttributeID() AttrID
	// Decode fills the message from a body of at least DataSize bytes
	// (MAD.Data), validated as the view's Check does.
	Decode(body []byte) error
	// encode writes all DataSize bytes of the body.
	encode(body []byte)
}

var (
	_ Message = (*REQFields)(nil)
	_ Message = (*MRAFields)(nil)
	_ Message = (*REJFields)(nil)
	_ Message = (*REPFields)(nil)
	_ Message = (*RTUFields)(nil)
	_ Message = (*DREQFields)(nil)
	_ Message = (*DREPFields)(nil)
	_ Message = (*SIDRREQFields)(nil)
	_ Message = (*SIDRREPFields)(nil)
	_ Message = (*LAPFields)(nil)
	_ Message = (*APRFields)(nil)
)

// NewMessage returns a zero message of the attribute's type, or nil if a
// is not a CM message.
func NewMessage(a AttrID) Message {
	switch a {
	case AttrREQ:
		return new(REQFields)
	case AttrMRA:
		return new(MRAFields)
	case AttrREJ:
		return new(REJFields)
	case AttrREP:
		return new(REPFields)
	case AttrRTU:
		return new(RTUFields)
	case AttrDREQ:
		return new(DREQFields)
	case AttrDREP:
		return new(DREPFields)
	case AttrSIDRREQ:
		return new(SIDRREQFields)
	case AttrSIDRREP:
		return new(SIDRREPFields)
	case AttrLAP:
		return new(LAPFields)
	case AttrAPR:
		return new(APRFields)
	}
	return nil
}

// Encode writes a whole CM MAD into mad (at least MADSize bytes; exactly
// MADSize are written): the header from h, then the message. A zero
// h.AttributeID takes the message's; any other must equal it. Use
// NewHeader for the usual header. The message's values are masked to their
// fields' widths; Encode checks nothing else.
func Encode(mad []byte, h *HeaderFields, m Message) error {
	if err := need("MAD", mad, MADSize); err != nil {
		return err
	}
	hf := *h
	if hf.AttributeID == 0 {
		hf.AttributeID = m.AttributeID()
	} else if hf.AttributeID != m.AttributeID() {
		return &Error{Msg: m.AttributeID().String(), Field: "header attribute ID", Value: uint64(hf.AttributeID), Err: ErrMismatch}
	}
	v := MAD(mad[:MADSize])
	v.EncodeHeader(&hf)
	m.encode(v.Data())
	return nil
}

// Decode decodes a CM MAD, the UD payload received on QP1: ParseMAD's
// checks, then method Send (the only method of CM messages), a known CM
// attribute, and the message's own checks. The message returned is one of
// the *...Fields types; switch on its type or on the header's AttributeID.
func Decode(mad []byte) (HeaderFields, Message, error) {
	v, err := ParseMAD(mad)
	if err != nil {
		return HeaderFields{}, nil, err
	}
	h := v.Header()
	if h.Method != MethodSend {
		return h, nil, &Error{Msg: "MAD", Field: "method", Value: uint64(h.Method), Err: ErrUnsupported}
	}
	m := NewMessage(h.AttributeID)
	if m == nil {
		return h, nil, &Error{Msg: "MAD", Field: "attribute ID", Value: uint64(h.AttributeID), Err: ErrUnsupported}
	}
	if err := m.Decode(v.Data()); err != nil {
		return h, nil, err
	}
	return h, m, nil
}
