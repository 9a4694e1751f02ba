//go:build !race

package rdmacm

const raceEnabled = false
