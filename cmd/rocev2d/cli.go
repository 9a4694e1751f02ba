package main

import "github.com/gorocev2/rocev2/cmd/internal/cli"

// What the commands share lives in package cli (cmd/internal/cli): flag
// parsing and exit statuses, the socket and congestion control options,
// endpoints (device, PD, CQs, QP, memory), the counters and SIGUSR1. These
// are the names the commands still in this package call it by; the
// command families in their own packages (cmd/internal/...) use cli
// directly.

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
