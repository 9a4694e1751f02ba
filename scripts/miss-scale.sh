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
# valgrind with GOMAXPROCS=1 for 2 and 4 iterations; the differences of the
# whole process's counts over the 8,000 WRITEs between them are printed
# (Ir instructions, D1mr/D1mw first-level data read/write misses, DLmr/DLmw
# last-level). Not 1 and 3: the testing package runs a benchmark once with
# b.N = 1 before -benchtime Nx asks for N > 1, so 1x is one setup and 3
# rounds (two warm-up rounds and one), 3x two setups and 8 rounds: their
# difference held a whole setup of 4,000 pairs and 20,000 WRITEs, not
# 8,000. 2x and 4x both set up twice and run 7 and 9 rounds. GOGC=off:
# the setups' garbage set off collections at different points of the two
# runs (50-90 misses per WRITE of collector work in either direction).
# The binary keeps its DWARF uncompressed, which valgrind reads, so that
# the misses can be had per source line ($OUT/lines.txt). Keeps the files
# in $OUT (default a temporary directory). Needs valgrind.
set -eu
rev=${1:-HEAD}
top=$(git rev-parse --show-toplevel)
out=${OUT:-$(mktemp -d)}
src=$out/src
mkdir -p "$src"
git -C "$top" archive "$rev" | tar -x -C "$src"
cp "$top/transport/scalemiss_bench_test.go" "$src/transport/"
(cd "$src" && go test -c -ldflags=-compressdwarf=false -o "$out/t.test" ./transport/)
for n in 2 4; do
	GOGC=off GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1 valgrind --tool=cachegrind --cache-sim=yes \
		--cachegrind-out-file="$out/cg.$n" "$out/t.test" -test.run '^$' \
		-test.bench 'ScaleActiveMem$' -test.benchtime ${n}x >"$out/log.$n" 2>&1
done
grep -h 'resent' "$out/log.2" "$out/log.4"
awk -v rev="$rev" '
	/^events:/ { for (i = 2; i <= NF; i++) name[i] = $i; nf = NF }
	/^summary:/ { for (i = 2; i <= NF; i++) v[FILENAME, i] = $i }
	END {
		printf "%s: per WRITE", rev
		for (i = 2; i <= nf; i++) printf " %s=%.1f", name[i], (v[ARGV[2], i] - v[ARGV[1], i]) / 8000
		printf "\n"
	}' "$out/cg.2" "$out/cg.4"
# Per source line (cg_diff keeps only the functions' sums): D1mr and D1mw
# per WRITE of the 60 lines with the most, in $out/lines.txt.
awk '
	/^fl=/ { fl = substr($0, 4) }
	/^[0-9]/ { k = fl ":" $1; r[k] += (FILENAME == ARGV[2] ? 1 : -1) * $6; w[k] += (FILENAME == ARGV[2] ? 1 : -1) * $9 }
	END { for (k in r) if (r[k] + w[k] >= 2400) printf "%6.2f %6.2f %s\n", r[k] / 8000, w[k] / 8000, k }' \
	"$out/cg.2" "$out/cg.4" | sort -k1,1nr | head -60 >"$out/lines.txt"
echo "per line: $out/lines.txt; per function: cg_diff $out/cg.2 $out/cg.4 > d; cg_annotate --sort=D1mr d"
