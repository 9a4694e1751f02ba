package cli

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"

	"github.com/gorocev2/rocev2/transport"
)

// USR1Watch prints the counters of its devices whenever the process
// receives SIGUSR1 (so that a long run can be inspected), from the moment
// it is created — before any device exists it says so, instead of letting
// SIGUSR1 terminate the process.
type USR1Watch struct {
	w        io.Writer
	mu       sync.Mutex
	names    []string
	devs     []*transport.Device
	sig      chan os.Signal
	done     chan struct{}
	finished chan struct{}
}

// WatchSIGUSR1 starts printing counters to w on SIGUSR1.
func WatchSIGUSR1(w io.Writer) *USR1Watch {
	u := &USR1Watch{w: w, sig: make(chan os.Signal, 1), done: make(chan struct{}), finished: make(chan struct{})}
	if len(usr1Signals) > 0 { // Notify with no signals would relay every signal
		signal.Notify(u.sig, usr1Signals...)
	}
	go func() {
		defer close(u.finished)
		for {
			select {
			case <-u.sig:
				u.mu.Lock()
				if len(u.devs) == 0 {
					fmt.Fprintln(u.w, "counters: no device yet (waiting for the peer)")
				}
				for i, d := range u.devs {
					PrintCounters(u.w, u.names[i], d)
				}
				u.mu.Unlock()
			case <-u.done:
				return
			}
		}
	}()
	return u
}

// Add includes a device in the SIGUSR1 output.
func (u *USR1Watch) Add(name string, d *transport.Device) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.names = append(u.names, name)
	u.devs = append(u.devs, d)
}

// Stop stops watching (SIGUSR1 gets its default action again).
func (u *USR1Watch) Stop() {
	signal.Stop(u.sig)
	close(u.done)
	<-u.finished
}

// alwaysPrinted are the counters PrintCounters shows even when zero: the
// packet totals and the congestion control counters (ECN marks seen, CNPs
// sent, handled and ignored), whose zeros say something too.
var alwaysPrinted = map[string]bool{"sent_pkts": true, "rcvd_pkts": true,
	"np_ecn_marked_roce_packets": true, "np_cnp_sent": true, "rp_cnp_handled": true, "rp_cnp_ignored": true}

// PrintCounters prints a device's rxe-style counters and its link's
// statistics, one "name value" per line, skipping zeros except those of
// alwaysPrinted.
func PrintCounters(w io.Writer, label string, dev *transport.Device) {
	c := dev.Counters()
	fmt.Fprintf(w, "counters %s:\n", label)
	for _, kv := range c.List() {
		if kv.Value == 0 && !alwaysPrinted[kv.Name] {
			continue
		}
		fmt.Fprintf(w, "  %-26s %d\n", kv.Name, kv.Value)
	}
	s := dev.Link().Stats()
	// link_drop_kernel is printed even when 0: with ack_timeout_late and
	// local_ack_timeout_err it tells why a QP retried (docs/LIVENESS.md).
	// On a link without a kernel socket (--mem's memnet link) it stays 0.
	fmt.Fprintf(w, "  %-26s %d\n  %-26s %d\n  %-26s %d\n", "link_sent_pkts", s.SentPkts, "link_rcvd_pkts", s.RcvdPkts,
		"link_drop_kernel", s.DropKernel)
	for _, kv := range []struct {
		n string
		v uint64
	}{{"link_drop_bad_icrc", s.DropBadICRC}, {"link_drop_no_df", s.DropNoDF}, {"link_drop_malformed", s.DropMalformed}, {"link_drop_other", s.DropOther},
		{"link_icmp_errors", s.ICMPErrors}} {
		if kv.v != 0 {
			fmt.Fprintf(w, "  %-26s %d\n", kv.n, kv.v)
		}
	}
	printShareCounters(w, dev.Link())
}
