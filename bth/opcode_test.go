package bth

import "testing"

func TestOpcodeNames(t *testing.T) {
	tests := []struct {
		op   Opcode
		name string
	}{
		{RCSendFirst, "RC_SEND_FIRST"},
		{RCSendMiddle, "RC_SEND_MIDDLE"},
		{RCSendLast, "RC_SEND_LAST"},
		{RCSendLastImm, "RC_SEND_LAST_WITH_IMMEDIATE"},
		{RCSendOnly, "RC_SEND_ONLY"},
		{RCSendOnlyImm, "RC_SEND_ONLY_WITH_IMMEDIATE"},
		{RCWriteFirst, "RC_RDMA_WRITE_FIRST"},
		{RCWriteMiddle, "RC_RDMA_WRITE_MIDDLE"},
		{RCWriteLast, "RC_RDMA_WRITE_LAST"},
		{RCWriteLastImm, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE"},
		{RCWriteOnly, "RC_RDMA_WRITE_ONLY"},
		{RCWriteOnlyImm, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE"},
		{RCReadRequest, "RC_RDMA_READ_REQUEST"},
		{RCReadResponseFirst, "RC_RDMA_READ_RESPONSE_FIRST"},
		{RCReadResponseMiddle, "RC_RDMA_READ_RESPONSE_MIDDLE"},
		{RCReadResponseLast, "RC_RDMA_READ_RESPONSE_LAST"},
		{RCReadResponseOnly, "RC_RDMA_READ_RESPONSE_ONLY"},
		{RCAck, "RC_ACKNOWLEDGE"},
		{RCAtomicAck, "RC_ATOMIC_ACKNOWLEDGE"},
		{RCCompareSwap, "RC_COMPARE_SWAP"},
		{RCFetchAdd, "RC_FETCH_ADD"},
		{RCSendLastInv, "RC_SEND_LAST_WITH_INVALIDATE"},
		{RCSendOnlyInv, "RC_SEND_ONLY_WITH_INVALIDATE"},
		{RCFlush, "RC_FLUSH"},
		{RCAtomicWrite, "RC_ATOMIC_WRITE"},
		{UCSendFirst, "UC_SEND_FIRST"},
		{UCSendMiddle, "UC_SEND_MIDDLE"},
		{UCSendLast, "UC_SEND_LAST"},
		{UCSendLastImm, "UC_SEND_LAST_WITH_IMMEDIATE"},
		{UCSendOnly, "UC_SEND_ONLY"},
		{UCSendOnlyImm, "UC_SEND_ONLY_WITH_IMMEDIATE"},
		{UCWriteFirst, "UC_RDMA_WRITE_FIRST"},
		{UCWriteMiddle, "UC_RDMA_WRITE_MIDDLE"},
		{UCWriteLast, "UC_RDMA_WRITE_LAST"},
		{UCWriteLastImm, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE"},
		{UCWriteOnly, "UC_RDMA_WRITE_ONLY"},
		{UCWriteOnlyImm, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE"},
		{UDSendOnly, "UD_SEND_ONLY"},
		{UDSendOnlyImm, "UD_SEND_ONLY_WITH_IMMEDIATE"},
		{CNP, "CNP"},
		{0x15, "OPCODE_0x15"},
		{0x1f, "OPCODE_0x1f"},
		{0xff, "OPCODE_0xff"},
	}
	valid := 0
	for _, tt := range tests {
		if got := tt.op.String(); got != tt.name {
			t.Errorf("Opcode(%#x).String() = %q, want %q", uint8(tt.op), got, tt.name)
		}
		if tt.op.Valid() {
			valid++
		}
	}
	n := 0
	for i := 0; i < 256; i++ {
		if Opcode(i).Valid() {
			n++
		}
	}
	if n != valid {
		t.Errorf("table has %d valid opcodes, this test names %d", n, valid)
	}
}

func TestOpcodeTableProperties(t *testing.T) {
	for i := 0; i < 256; i++ {
		o := Opcode(i)
		in := o.Info()
		if !in.Valid {
			if in != (Info{}) {
				t.Errorf("%v: invalid opcode has non-zero Info %+v", o, in)
			}
			if _, ok := ParseOpcode(o.String()); ok {
				t.Errorf("%v: ParseOpcode accepted an undefined opcode's name", o)
			}
			continue
		}
		if got, ok := ParseOpcode(o.String()); !ok || got != o {
			t.Errorf("%v: ParseOpcode(String()) = %v, %v", o, got, ok)
		}
		if in.HeaderLen != in.Headers.Size() {
			t.Errorf("%v: HeaderLen %d != Headers.Size() %d", o, in.HeaderLen, in.Headers.Size())
		}
		sum := 0
		for h := Header(1); h <= HdrCNPPad; h <<= 1 {
			if in.Headers&h != 0 {
				sum += h.Size()
			}
		}
		if sum != in.HeaderLen {
			t.Errorf("%v: sum of header sizes %d != HeaderLen %d", o, sum, in.HeaderLen)
		}
		if in.Transport != o.Transport() {
			t.Errorf("%v: Transport %v != opcode bits %v", o, in.Transport, o.Transport())
		}
		if in.Kind == KindInvalid {
			t.Errorf("%v: valid opcode with KindInvalid", o)
		}
		if in.Imm != in.Headers.Has(HdrImmDt) {
			t.Errorf("%v: Imm %v but headers %v", o, in.Imm, in.Headers)
		}
		if in.Inv != in.Headers.Has(HdrIETH) {
			t.Errorf("%v: Inv %v but headers %v", o, in.Inv, in.Headers)
		}
		if in.Transport == TransportUD && !in.Headers.Has(HdrDETH) {
			t.Errorf("%v: UD opcode without DETH", o)
		}
		wantPayload := in.Kind == KindSend || in.Kind == KindWrite || in.Kind == KindReadResponse || in.Kind == KindAtomicWrite
		if in.Payload != wantPayload {
			t.Errorf("%v: Payload = %v, want %v", o, in.Payload, wantPayload)
		}
		wantReq := in.Kind == KindSend || in.Kind == KindWrite || in.Kind == KindReadRequest ||
			in.Kind == KindCompareSwap || in.Kind == KindFetchAdd || in.Kind == KindFlush || in.Kind == KindAtomicWrite
		if in.Request != wantReq {
			t.Errorf("%v: Request = %v, want %v", o, in.Request, wantReq)
		}
	}
}

func TestOpcodeHeaders(t *testing.T) {
	tests := []struct {
		op  Opcode
		h   Header
		len int
		pos Position
	}{
		{RCSendFirst, 0, 0, PosFirst},
		{RCSendMiddle, 0, 0, PosMiddle},
		{RCSendLastImm, HdrImmDt, 4, PosLast},
		{RCSendOnlyImm, HdrImmDt, 4, PosOnly},
		{RCWriteFirst, HdrRETH, 16, PosFirst},
		{RCFlush, HdrFETH | HdrRETH, 20, PosOnly},
		{RCAtomicWrite, HdrRETH, 16, PosOnly},
		{RCWriteMiddle, 0, 0, PosMiddle},
		{RCWriteLast, 0, 0, PosLast},
		{RCWriteLastImm, HdrImmDt, 4, PosLast},
		{RCWriteOnly, HdrRETH, 16, PosOnly},
		{RCWriteOnlyImm, HdrRETH | HdrImmDt, 20, PosOnly},
		{RCReadRequest, HdrRETH, 16, PosOnly},
		{RCReadResponseFirst, HdrAETH, 4, PosFirst},
		{RCReadResponseMiddle, 0, 0, PosMiddle},
		{RCReadResponseLast, HdrAETH, 4, PosLast},
		{RCReadResponseOnly, HdrAETH, 4, PosOnly},
		{RCAck, HdrAETH, 4, PosOnly},
		{RCAtomicAck, HdrAETH | HdrAtomicAckETH, 12, PosOnly},
		{RCCompareSwap, HdrAtomicETH, 28, PosOnly},
		{RCFetchAdd, HdrAtomicETH, 28, PosOnly},
		{RCSendLastInv, HdrIETH, 4, PosLast},
		{RCSendOnlyInv, HdrIETH, 4, PosOnly},
		{UCWriteOnlyImm, HdrRETH | HdrImmDt, 20, PosOnly},
		{UDSendOnly, HdrDETH, 8, PosOnly},
		{UDSendOnlyImm, HdrDETH | HdrImmDt, 12, PosOnly},
		{CNP, HdrCNPPad, 16, PosOnly},
	}
	for _, tt := range tests {
		in := tt.op.Info()
		if in.Headers != tt.h || in.HeaderLen != tt.len || in.Pos != tt.pos {
			t.Errorf("%v: headers %v len %d pos %v, want %v %d %v", tt.op, in.Headers, in.HeaderLen, in.Pos, tt.h, tt.len, tt.pos)
		}
	}
}

func TestHeaderSizeAndString(t *testing.T) {
	sizes := map[Header]int{HdrRDETH: 4, HdrDETH: 8, HdrRETH: 16, HdrAtomicETH: 28, HdrAETH: 4,
		HdrAtomicAckETH: 8, HdrImmDt: 4, HdrIETH: 4, HdrCNPPad: 16, 0: 0}
	for h, want := range sizes {
		if got := h.Size(); got != want {
			t.Errorf("%v.Size() = %d, want %d", h, got, want)
		}
	}
	if got := (HdrImmDt | HdrRETH).String(); got != "RETH+ImmDt" {
		t.Errorf("String = %q", got)
	}
	if got := (HdrAETH | HdrAtomicAckETH).String(); got != "AETH+AtomicAckETH" {
		t.Errorf("String = %q", got)
	}
	if got := Header(0).String(); got != "none" {
		t.Errorf("String = %q", got)
	}
}

func TestEnumStrings(t *testing.T) {
	if TransportUD.String() != "UD" || Transport(0xe0).String() != "TRANSPORT_0xe0" {
		t.Error("Transport.String")
	}
	if KindReadResponse.String() != "RDMA_READ_RESPONSE" || PosMiddle.String() != "MIDDLE" {
		t.Error("Kind/Position.String")
	}
}
