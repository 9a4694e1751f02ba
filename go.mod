module github.com/gorocev2/rocev2

go 1.26.0

require (
	github.com/cilium/ebpf v0.22.0 // indirect
	github.com/google/gopacket v1.1.19 // indirect
	golang.org/x/net v0.48.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
