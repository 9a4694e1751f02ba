// Package agentproto is the wire format of the interop lab's command channel:
// the test driver on the host connects to the in-VM agent over TCP (inside
// the lab's network namespace), writes one Request as a JSON line and reads
// one Response as a JSON line. Closing the connection early kills the
// command (its whole process group).
//
// It imports nothing of this module; test/interop and its vmagent share it.
package agentproto

// Port is the agent's TCP port in the VM.
const Port = 7777

// Request asks the agent to run a shell command or to wait for a listener.
type Request struct {
	// Cmd is run with /bin/sh -c, stdin /dev/null, stdout and stderr merged.
	Cmd string `json:"cmd,omitempty"`
	// WaitListen, when non-zero, makes the agent wait (up to TimeoutSec)
	// until a TCP socket listens on this port in the VM, instead of running Cmd.
	WaitListen int `json:"wait_listen,omitempty"`
	// TimeoutSec bounds the command; 0 means 300 s. On timeout the process
	// group is killed and Response.TimedOut is set.
	TimeoutSec float64 `json:"timeout_sec,omitempty"`
}

// Response is the result of a Request.
type Response struct {
	// Output is the command's stdout and stderr (truncated at MaxOutput).
	Output string `json:"output"`
	// Exit is the exit status; -1 when the command could not run or was killed.
	Exit int `json:"exit"`
	// TimedOut reports that TimeoutSec expired.
	TimedOut bool `json:"timed_out,omitempty"`
	// Err describes an agent-side failure (cannot start, bad request).
	Err string `json:"err,omitempty"`
	// Seconds is the command's wall time in the VM.
	Seconds float64 `json:"seconds"`
}

// MaxOutput is the most output a Response carries.
const MaxOutput = 4 << 20

// ReadyPrefix starts the line the agent prints on the serial console once
// rxe0 has its RoCEv2 IPv4 GID and the command channel listens.
const ReadyPrefix = "ROCEV2-LAB-READY"
