//go:build !race

package memreg

// raceBuild is false: see race_on.go.
const raceBuild = false
