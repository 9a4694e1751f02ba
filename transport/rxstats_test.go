package transport

// Test binaries count the receive driver's events (rxDriver.stats);
// production devices carry a nil pointer.
func init() { rxStatsOn = true }
