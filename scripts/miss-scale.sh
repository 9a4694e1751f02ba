#!/bin/sh
# miss-scale.sh [REV] — cache misses per WRITE of BenchmarkScaleActiveMem
# (issue 30 item 4: 4,000 active RC QP pairs, each with its own regions,
# one 4 KiB WRITE per QP per iteration, served by the send scheduler),
# counted by cachegrind's cache simulation: deterministic where the
# timings of a shared machine are not.
#
# The revision REV (default HEAD) of this repository is exported to a
# temporary directory (the benchmark file of this checkout is copied in, so
# that an older REV is measured the same way) and the benchmark runs under
# valgrind with GOMAXPROCS=1 for 1 and 3 iterations; the differences of the
# whole process's counts over the 8,000 WRITEs between them are printed
# (Ir instructions, D1mr/D1mw first-level data read/write misses, DLmr/DLmw
# last-level). Keeps the files in $OUT (default a temporary directory) for
# cg_diff and cg_annotate. Needs valgrind.
set -eu
rev=${1:-HEAD}
top=$(git rev-parse --show-toplevel)
out=${OUT:-$(mktemp -d)}
src=$out/src
mkdir -p "$src"
git -C "$top" archive "$rev" | tar -x -C "$src"
cp "$top/transport/scalemiss_bench_test.go" "$src/transport/"
(cd "$src" && go test -c -o "$out/t.test" ./transport/)
for n in 1 3; do
	GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1 valgrind --tool=cachegrind --cache-sim=yes \
		--cachegrind-out-file="$out/cg.$n" "$out/t.test" -test.run '^$' \
		-test.bench 'ScaleActiveMem$' -test.benchtime ${n}x >"$out/log.$n" 2>&1
done
grep -h 'resent' "$out/log.1" "$out/log.3"
awk -v rev="$rev" '
	/^events:/ { for (i = 2; i <= NF; i++) name[i] = $i; nf = NF }
	/^summary:/ { for (i = 2; i <= NF; i++) v[FILENAME, i] = $i }
	END {
		printf "%s: per WRITE", rev
		for (i = 2; i <= nf; i++) printf " %s=%.1f", name[i], (v[ARGV[2], i] - v[ARGV[1], i]) / 8000
		printf "\n"
	}' "$out/cg.1" "$out/cg.3"
echo "cg_diff $out/cg.1 $out/cg.3 > d; cg_annotate --sort=D1mr d   # per function"
