#!/usr/bin/env bash
# What a --pcap capture costs write-bw (docs/CAPTURE.md, "What it costs"): `write-bw -s 65536`
# over the loopback of a network namespace of its own, the client uncaptured, with --pcap (whole
# packets) and with --pcap --snaplen 128 (headers only), the server uncaptured. The variants are
# interleaved: each round runs every variant REPS times, in turn, the order rotating from round to
# round, so that the machine's other load falls on all of them alike; a round's ratio is the
# median goodput of a captured variant over the median uncaptured one. With several binaries
# (say main's and a branch's) each round runs every variant of every binary, one after the other.
# Needs root (ip netns). Prints one line per round and the medians at the end.
#
#   sudo ./scripts/capture-cost.sh                       rocev2d built from this checkout
#   sudo ROUNDS=10 REPS=3 N=20000 ./scripts/capture-cost.sh /tmp/rocev2d-main /tmp/rocev2d-new
#
# PCAP_DIR (default /var/tmp) holds the capture file: a disk file system, as a user's capture.
set -euo pipefail
ROUNDS=${ROUNDS:-8}
REPS=${REPS:-3}
N=${N:-20000}
PCAP_DIR=${PCAP_DIR:-/var/tmp}
cd "$(dirname "$0")/.."
work=$(mktemp -d)
ns=capcost$$
cleanup() {
	ip netns del "$ns" 2>/dev/null || true
	rm -rf "$work"
	rm -f "$PCAP_DIR/capture-cost.$$.pcap"
}
trap cleanup EXIT
bins=("$@")
if [ ${#bins[@]} -eq 0 ]; then
	go build -o "$work/rocev2d" ./cmd/rocev2d
	bins=("$work/rocev2d")
fi
ip netns add "$ns"
ip -n "$ns" link set lo up
ip -n "$ns" addr add 127.0.0.2/8 dev lo
pcap="$PCAP_DIR/capture-cost.$$.pcap"
port=20000

# run BIN ARGS...: one write-bw run; prints the client's goodput (MB/s, perftest's BW average).
run() {
	local bin=$1 out=$work/out
	shift
	port=$((port + 1))
	ip netns exec "$ns" timeout 120 "$bin" write-bw --bind 127.0.0.2 -p "$port" -s 65536 -n "$N" >/dev/null 2>&1 &
	local srv=$!
	sleep 0.3
	ip netns exec "$ns" timeout 120 "$bin" write-bw --bind 127.0.0.1 -p "$port" -s 65536 -n "$N" "$@" 127.0.0.2 >"$out" 2>&1 || true
	wait "$srv" || true
	rm -f "$pcap"
	awk '$1 == 65536 && NF >= 4 {bw = $4} END {print bw + 0}' "$out"
}

median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

variants=(none whole snap128)
declare -A all
for r in $(seq 1 "$ROUNDS"); do
	declare -A got=()
	for rep in $(seq 1 "$REPS"); do
		for k in 0 1 2; do
			v=${variants[$(((k + r + rep) % 3))]}
			for b in "${!bins[@]}"; do
				case $v in
				none) bw=$(run "${bins[$b]}") ;;
				whole) bw=$(run "${bins[$b]}" --pcap "$pcap") ;;
				snap128) bw=$(run "${bins[$b]}" --pcap "$pcap" --snaplen 128) ;;
				esac
				got[$b.$v]="${got[$b.$v]:-} $bw"
			done
		done
	done
	line="round $r (load $(cut -d' ' -f1 /proc/loadavg)):"
	for b in "${!bins[@]}"; do
		none=$(echo "${got[$b.none]}" | median)
		whole=$(echo "${got[$b.whole]}" | median)
		snap=$(echo "${got[$b.snap128]}" | median)
		rw=$(awk -v a="$whole" -v b="$none" 'BEGIN {printf "%.2f", b ? a / b : 0}')
		rs=$(awk -v a="$snap" -v b="$none" 'BEGIN {printf "%.2f", b ? a / b : 0}')
		all[$b.whole]="${all[$b.whole]:-} $rw"
		all[$b.snap]="${all[$b.snap]:-} $rs"
		line+="  $(basename "${bins[$b]}"): uncaptured $none MB/s, whole $whole ($rw), snaplen 128 $snap ($rs)"
	done
	echo "$line"
done
for b in "${!bins[@]}"; do
	w=$(echo "${all[$b.whole]}" | median)
	s=$(echo "${all[$b.snap]}" | median)
	wmin=$(echo "${all[$b.whole]}" | tr ' ' '\n' | grep . | sort -g | head -1)
	smin=$(echo "${all[$b.snap]}" | tr ' ' '\n' | grep . | sort -g | head -1)
	echo "$(basename "${bins[$b]}"): whole median $w (lowest round $wmin), snaplen 128 median $s (lowest round $smin)"
done
