//go:build !unix

package clitest

// lockLoopback does nothing where the command tests do not open sockets.
func lockLoopback() (release func(), err error) { return func() {}, nil }
