package cmtools

import (
	"context"
	"io"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
)

// The names this package's files call package cli by: the librdmacm tools
// moved here from cmd/rocev2d unchanged but for their package line, so
// that changes made to them meanwhile merge cleanly. (A sed to cli.X can
// replace this file later.)

type (
	endpoint       = cli.Endpoint
	endpointConfig = cli.EndpointConfig
	socketFlags    = cli.SocketFlags
	ccFlags        = cli.CCFlags
	usr1Watch      = cli.USR1Watch
	pairOptions    = cli.PairOptions
)

const (
	exitOK          = cli.ExitOK
	exitFail        = cli.ExitFail
	exitUsage       = cli.ExitUsage
	socketUsage     = cli.SocketUsage
	ccUsage         = cli.CCUsage
	defaultBusyPoll = cli.DefaultBusyPoll
)

var (
	errUsage         = cli.ErrUsage
	flagsResult      = cli.FlagsResult
	newFlagSet       = cli.NewFlagSet
	demoName         = cli.OpName
	intFlags         = cli.IntFlags
	boolFlags        = cli.BoolFlags
	stringFlags      = cli.StringFlags
	parseWithServer  = cli.ParseWithServer
	parseBind        = cli.ParseBind
	parsePairFlags   = cli.ParsePairFlags
	errMTUFlag       = cli.ErrMTUFlag
	parseMTUFlag     = cli.ParseMTUFlag
	acceptOne        = cli.AcceptOne
	peerFromGID      = cli.PeerFromGID
	localAddr        = cli.LocalAddr
	wcError          = cli.WCError
	addSocketFlags   = cli.AddSocketFlags
	addCCFlags       = cli.AddCCFlags
	setDCQCNParams   = cli.SetDCQCNParams
	parseBitRate     = cli.ParseBitRate
	parseMicros      = cli.ParseMicros
	watchSIGUSR1     = cli.WatchSIGUSR1
	printCounters    = cli.PrintCounters
	newEndpoint      = cli.NewEndpoint
	listenSocket     = cli.ListenSocket
	listenSocketPair = cli.ListenSocketPair
	pairQueues       = cli.PairQueues
	newEndpointPair  = cli.NewEndpointPair
	createCapture    = cli.CreateCapture
	mapMemory        = cli.MapMemory
	oobLocalTCPAddr  = cli.OOBLocalTCPAddr
	oobDialPermanent = cli.OOBDialPermanent
)

// commands are the librdmacm tools, registered by their files' init.
var commands []cli.Command

// register adds a command to commands.
func register(name, summary, usage string, run func(ctx context.Context, args []string, stdout, stderr io.Writer) int) {
	commands = append(commands, cli.Command{Name: name, Summary: summary, Usage: usage, Run: run})
}

// Commands are rping, rdma-server, rdma-client and udaddy, for rocev2d's
// dispatch.
func Commands() []cli.Command { return commands }
