#!/bin/sh
# ir-permsg.sh [REV] — instructions per op of BenchmarkProtocolOnly8B (one
# 8-byte SEND round trip: issue 30 item 3's per-message work), or of the
# benchmark BENCH names (BENCH=Write64BStream: one 64-byte WRITE of a
# stream with rocev2d bench's window), counted by callgrind: deterministic
# where the timings of a shared machine are not.
#
# The revision REV (default HEAD) of this repository is exported to a
# temporary directory; there the receive lease (rxLeaseMin) is made an hour,
# so that the device's receive goroutine never takes the link from the
# benchmark's polling loop, and the benchmark runs under valgrind with
# GOMAXPROCS=1 for N and 3N ops (N: 10000, or 30000 for Write64BStream);
# the difference of the whole process's instruction counts over 2N is
# printed (it repeats to about ±30; a run in which the device's timer
# goroutine meets a held QP lock adds up to a few hundred, so take the
# lowest of a few runs). A REV older than the benchmark gets the
# benchmark's file from the working tree. Needs valgrind (apt-get install
# valgrind). Keeps the callgrind files in $OUT (default a temporary
# directory) for callgrind_annotate.
set -eu
rev=${1:-HEAD}
bench=${BENCH:-ProtocolOnly8B}
case $bench in
Write64BStream) n1=${N:-30000} ;;
*) n1=${N:-10000} ;;
esac
n2=$((3 * n1))
top=$(git rev-parse --show-toplevel)
out=${OUT:-$(mktemp -d)}
src=$out/src
mkdir -p "$src"
git -C "$top" archive "$rev" | tar -x -C "$src"
if ! grep -q "^func Benchmark$bench(" "$src"/transport/*_test.go; then
	f=$(grep -l "^func Benchmark$bench(" "$top"/transport/*_test.go)
	cp "$f" "$src/transport/"
	echo "($rev has no Benchmark$bench: $(basename "$f") from the working tree)"
fi
sed -i 's/^const rxLeaseMin = 200 \* time.Microsecond/const rxLeaseMin = time.Hour/' "$src/transport/rxpoll.go"
grep -q 'rxLeaseMin = time.Hour' "$src/transport/rxpoll.go"
(cd "$src" && go test -c -o "$out/t.test" ./transport/)
for n in $n1 $n2; do
	GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind --callgrind-out-file="$out/cg.$n" \
		"$out/t.test" -test.run '^$' -test.bench "$bench\$" -test.benchtime ${n}x >"$out/log.$n" 2>&1
done
a=$(awk '/Collected/ {print $NF}' "$out/log.$n1")
b=$(awk '/Collected/ {print $NF}' "$out/log.$n2")
echo "$rev: $(( (b - a) / (n2 - n1) )) instructions per op of $bench (callgrind files: $out/cg.$n1, $out/cg.$n2)"
