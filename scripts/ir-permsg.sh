#!/bin/sh
# ir-permsg.sh [REV] — instructions per round trip of BenchmarkProtocolOnly8B
# (issue 30 item 3's per-message work), counted by callgrind: deterministic
# where the timings of a shared machine are not.
#
# The revision REV (default HEAD) of this repository is exported to a
# temporary directory; there the receive lease (rxLeaseMin) is made an hour,
# so that the device's receive goroutine never takes the link from the
# benchmark's polling loop, and the benchmark runs under valgrind with
# GOMAXPROCS=1 for 10000 and 30000 round trips; the difference of the whole
# process's instruction counts over 20000 is printed (it repeats to about
# ±30; a run in which the device's timer goroutine meets a held QP lock adds
# up to a few hundred, so take the lowest of a few runs). Needs valgrind
# (apt-get install valgrind). Keeps the callgrind files in $OUT (default a
# temporary directory) for callgrind_annotate.
set -eu
rev=${1:-HEAD}
top=$(git rev-parse --show-toplevel)
out=${OUT:-$(mktemp -d)}
src=$out/src
mkdir -p "$src"
git -C "$top" archive "$rev" | tar -x -C "$src"
sed -i 's/^const rxLeaseMin = 200 \* time.Microsecond/const rxLeaseMin = time.Hour/' "$src/transport/rxpoll.go"
grep -q 'rxLeaseMin = time.Hour' "$src/transport/rxpoll.go"
(cd "$src" && go test -c -o "$out/t.test" ./transport/)
for n in 10000 30000; do
	GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind --callgrind-out-file="$out/cg.$n" \
		"$out/t.test" -test.run '^$' -test.bench 'ProtocolOnly8B$' -test.benchtime ${n}x >"$out/log.$n" 2>&1
done
a=$(awk '/Collected/ {print $NF}' "$out/log.10000")
b=$(awk '/Collected/ {print $NF}' "$out/log.30000")
echo "$rev: $(( (b - a) / 20000 )) instructions per round trip (callgrind files: $out/cg.10000, $out/cg.30000)"
