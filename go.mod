module github.com/gorocev2/rocev2

go 1.26.0

require (
	github.com/cilium/ebpf v0.22.0
	github.com/google/gopacket v1.1.19
	golang.org/x/net v0.48.0
	golang.org/x/sys v0.50.0
)
