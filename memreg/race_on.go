//go:build race

package memreg

// raceBuild: the race detector runs sync/atomic's operations in its own C
// code, where a fault cannot become a recoverable panic (populate).
const raceBuild = true
