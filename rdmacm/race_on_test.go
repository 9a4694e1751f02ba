//go:build race

package rdmacm

// raceEnabled: the race detector slows everything several times over;
// the rates of the hostile tests scale down with it.
const raceEnabled = true
