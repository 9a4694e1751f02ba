package udp

import "sync"

var (
	defaultOptsMu sync.Mutex
	defaultOpts   SocketOptions
)

// DefaultSocketOptions returns the options ListenSocket uses when it is
// given nil options: the zero SocketOptions unless SetDefaultSocketOptions
// changed them.
func DefaultSocketOptions() SocketOptions {
	defaultOptsMu.Lock()
	defer defaultOptsMu.Unlock()
	return defaultOpts
}

// SetDefaultSocketOptions sets the options ListenSocket uses when it is
// given nil options, for the whole process — so a program can switch, for
// example, UDP GSO on (a command-line flag) for every link its code opens
// with nil options. It returns a function that restores the previous
// defaults.
func SetDefaultSocketOptions(o SocketOptions) (restore func()) {
	defaultOptsMu.Lock()
	defer defaultOptsMu.Unlock()
	prev := defaultOpts
	defaultOpts = o
	return func() {
		defaultOptsMu.Lock()
		defaultOpts = prev
		defaultOptsMu.Unlock()
	}
}
