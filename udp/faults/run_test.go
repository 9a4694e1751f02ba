//go:build linux

package faults

import "github.com/cilium/ebpf"

func ebpfRun(data, out []byte, ctx *skbCtx) *ebpf.RunOptions {
	o := &ebpf.RunOptions{Data: data, DataOut: out}
	if ctx != nil {
		o.Context = ctx
	}
	return o
}
