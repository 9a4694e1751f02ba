#!/usr/bin/env bash
# The whole rocev2 test suite. Installs what the tests need first (Debian packages when run as
# root, Go modules), then: gofmt, go vet (also for darwin/arm64 and windows/amd64), the full
# test suite, the CRC packages' tests with -tags purego (without the amd64 assembly), the suite
# again under the race detector (-short: soak-sized cases shrink), the rxe interop matrix in
# qemu (as root), and a short run of every fuzz target.
#
#   ./scripts/test.sh              everything
#   FUZZTIME=30s ./scripts/test.sh longer fuzzing per target (default 6s each)
#   SKIP_FUZZ=1 ./scripts/test.sh  no fuzzing
#   SKIP_INTEROP=1 ./scripts/test.sh  no rxe interop stage (it needs root and qemu; ~11 min)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:$(go env GOPATH 2>/dev/null)/bin"
# The rocev2d processes the tests start keep no connection journal in the
# machine's /run (rdmacm.JournalEnv): a killed test process's records would
# be replayed at another test's peer. Tests of the journal name a directory
# of their own (TestRpingKillRestart, the interop lab).
export ROCEV2_CM_JOURNAL="${ROCEV2_CM_JOURNAL:-off}"

step() { printf '\n== %s ==\n' "$*"; }
failed=()
# Each stage's output is also kept in logdir, so that the end of the run can
# repeat what failed: a CI log is often shown only by its head and its tail.
logdir=$(mktemp -d /tmp/rocev2-test-logs.XXXXXX)
trap 'rm -rf "$logdir"' EXIT
nlog=0
# run NAME CMD...: runs one stage; a failing stage is recorded and the next
# stages still run, so one CI run shows every failure.
run() {
	local name=$1 t0=$SECONDS rc
	shift
	nlog=$((nlog + 1))
	local log="$logdir/$(printf '%03d' $nlog) ${name//\//_}.log"
	set +e
	"$@" 2>&1 | tee "$log"
	rc=${PIPESTATUS[0]}
	set -e
	if [ "$rc" != 0 ]; then
		echo "FAILED: $name ($((SECONDS - t0)) s)"
		failed+=("$name")
	else
		echo "stage $name: $((SECONDS - t0)) s"
		rm -f "$log"
	fi
}

# digest: for every failed stage, what failed, bounded: each failed test's
# own messages (a -v log interleaves them with the passing tests'; here the
# first and last 25 message lines of each failed leaf test), panics, races,
# build errors.
digest() {
	local f
	for f in "$logdir"/*.log; do
		[ -e "$f" ] || continue
		printf '\n-- what failed in stage %s:\n' "$(basename "$f" .log | cut -d' ' -f2-)"
		awk '
			FNR == NR {
				if (/^=== RUN /) verbose = 1
				if (match($0, /--- FAIL: [^ ]+/)) {
					name = substr($0, RSTART + 10, RLENGTH - 10)
					failed[name] = 1
					# a parent fails with its child: only leaves are shown
					p = name; sub(/\/[^\/]*$/, "", p); if (p != name) parent[p] = 1
				}
				next
			}
			function flush(   i, s) {
				if (cur != "" && (cur in failed) && !(cur in parent)) {
					print "---- " cur ":"
					for (i = 0; i < n && i < 25; i++) print first[i]
					if (n > 50) print "        [... " n - 50 " lines ...]"
					s = n > 50 ? n - 25 : 25
					for (i = s; i < n; i++) print buf[i % 25]
					shown++
				}
				n = 0
			}
			/^=== RUN / { flush(); cur = $3; next }
			/^(--- |ok  |PASS$|FAIL)/ { flush(); cur = ""; if ($0 ~ /^--- FAIL|^FAIL/) print; next }
			/^panic:|DATA RACE|^[^ ]+\.go:[0-9]+:[0-9]+:/ { print }
			cur != "" { if (n < 25) first[n] = $0; buf[n % 25] = $0; n++ }
			END { flush() }
		' "$f" "$f" | head -300 || true
	done
}

step "dependencies"
need=()
for pkg in tshark:tshark tcpdump:tcpdump ip:iproute2; do
	command -v "${pkg%%:*}" >/dev/null 2>&1 || need+=("${pkg#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ]; then
		export DEBIAN_FRONTEND=noninteractive
		echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections 2>/dev/null || true
		apt-get update -q
		apt-get install -y -q --no-install-recommends "${need[@]}"
	else
		echo "WARNING: missing ${need[*]} and not root: tests that need them will skip loudly (they fail under CI=true)"
	fi
fi
go mod download
go version

step "gofmt"
bad=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$bad" ]; then echo "gofmt needed:"; echo "$bad"; failed+=(gofmt); else echo ok; fi

step "go vet"
run "go vet" go vet ./...

# Only what talks to the kernel is Linux-only (the socket and raw backends,
# udp/faults, internal/netns, test/veth, test/interop); everything else —
# the wire packages, memreg, transport, udp, its in-memory network udp/memnet, the
# command — must build and vet elsewhere. `go vet ./...` skips the packages
# that build tags exclude; portable_pkgs must never be among them.
portable_pkgs="./bth ./reth ./aeth ./atomiceth ./deth ./immdt ./icrc ./packet ./rocelayer ./memreg ./transport ./udp ./udp/memnet"
cross_vet() {
	local goos=$1 goarch=$2
	GOOS=$goos GOARCH=$goarch go list $portable_pkgs >/dev/null &&
		GOOS=$goos GOARCH=$goarch go vet ./...
}
for target in darwin/arm64 windows/amd64; do
	step "go vet for $target"
	run "go vet $target" cross_vet "${target%/*}" "${target#*/}"
done

step "go test ./..."
run "go test" go test -count=1 -timeout 20m ./...

step "go test -tags purego (the portable CRC path, without icrc's amd64 kernels)"
run "go test purego" go test -tags purego -count=1 ./icrc/ ./packet/ ./test/golden/

step "go test -race -short ./..."
run "go test -race" go test -race -short -count=1 -timeout 25m ./...

if [ "$(id -u)" = 0 ] && [ "${SKIP_INTEROP:-}" != 1 ]; then
	step "interop against Linux rdma_rxe in qemu (test/interop)"
	run "interop" env ROCEV2_INTEROP=1 go test -v -count=1 -timeout 25m -run TestInterop ./test/interop/
elif [ "${CI:-}" = true ]; then
	echo "FAILED: interop stage not run under CI=true (needs root and no SKIP_INTEROP; uid $(id -u), SKIP_INTEROP=${SKIP_INTEROP:-})"
	failed+=("interop (not run)")
else
	echo "WARNING: interop stage skipped (needs root; SKIP_INTEROP=${SKIP_INTEROP:-})"
fi

# fuzz PKG TARGET: fuzzes one target for FUZZTIME. Go's fuzzing coordinator
# can fail a run with a bare "context deadline exceeded" when -fuzztime
# expires while a starved worker is mid-call (golang/go#75804, #51484; seen
# here in CI on FuzzParse, 673k execs, no input written). Such a run — that
# message, no "Failing input" and no panic — is retried once, loudly; any
# other failure, or the same thing twice, fails the stage.
fuzz() {
	local pkg=$1 target=$2 out
	for attempt in 1 2; do
		out=$(go test -run '^$' -fuzz "^${target}\$" -fuzztime "${FUZZTIME:-6s}" "$pkg" 2>&1)
		local rc=$?
		printf '%s\n' "$out" | grep -v 'execs:.*new interesting' | tail -20
		[ $rc = 0 ] && return 0
		if [ $attempt = 1 ] && printf '%s' "$out" | grep -q 'context deadline exceeded' &&
			! printf '%s' "$out" | grep -qiE 'failing input|panic:|\.go:[0-9]+:'; then
			echo "WARNING: $target: fuzzing coordinator deadline race (no failing input); retrying once"
			continue
		fi
		return 1
	done
}

if [ "${SKIP_FUZZ:-}" != 1 ]; then
	step "fuzz (${FUZZTIME:-6s} per target)"
	for pkg in $(go list ./...); do
		for target in $(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
			echo "-- $pkg $target"
			run "fuzz $target" fuzz "$pkg" "$target"
		done
	done
fi

step "done ($SECONDS s in all)"
if [ ${#failed[@]} -gt 0 ]; then
	digest
	printf '\nFAILED stages: %s\n' "${failed[*]}"
	exit 1
fi
echo "all checks passed"
