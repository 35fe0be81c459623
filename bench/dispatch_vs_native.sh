#!/usr/bin/env bash
# The portable (runtime-dispatching) build against a -march=native build of the same commit, on this machine:
# tiled float self-attention, T=4096, D=64, 1 thread, the two programs run alternately ROUNDS times (so a slow
# spell of the machine hits both), plus the dispatching build forced to each lower SIMD target, for scale.
#   bench/dispatch_vs_native.sh [ROUNDS]      (default 5; builds build/release-native's benchmark if needed)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rounds=${1:-5}
cd "$root"
cmake --preset release >/dev/null && cmake --build --preset release -j "$(nproc)" --target attn_attention_bench attn_cli >/dev/null
cmake --preset release-native >/dev/null && cmake --build --preset release-native -j "$(nproc)" --target attn_attention_bench >/dev/null
filter='^sdpa\(B=1,H=8,Tq=4096,Tk=4096,Dk=64,Dv=64,mask=none,dtype=float,threads=1,impl=tiled\)/'
median_ms() {  # program [env...]: the median of 3 repetitions, in ms
  env "${@:2}" "$1" --benchmark_filter="$filter" --reps 3 2>/dev/null |
    awk '/real_time_median/ { for (i = 2; i <= NF; ++i) if ($(i + 1) == "ms") { print $i; exit } }'
}
dispatch=build/release/bench/attn_attention_bench
native=build/release-native/bench/attn_attention_bench
echo "dispatching build: $(build/release/tools/attn info --json | awk -F'"' '/"id"/ { print $4 }')"
echo "native build:      -march=native, SIMD target baked in at compile time"
d_all=(); n_all=()
for r in $(seq 1 "$rounds"); do
  d=$(median_ms "$dispatch"); n=$(median_ms "$native")
  d_all+=("$d"); n_all+=("$n")
  printf "round %d: dispatch %s ms, native %s ms\n" "$r" "$d" "$n"
done
median() { printf "%s\n" "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
dm=$(median "${d_all[@]}"); nm=$(median "${n_all[@]}")
printf "\nmedian over rounds: dispatch %s ms, native %s ms, dispatch / native = %.3f (goal <= 1.03)\n" "$dm" "$nm" \
  "$(awk -v a="$dm" -v b="$nm" 'BEGIN { print a / b }')"
echo
echo "dispatching build forced to each SIMD target (ATTN_SIMD_TARGET), one round:"
for t in $(build/release/tools/attn info --json | awk -F'"' '/"simd_supported"/ { print $4 }'); do
  printf "  %-8s %s ms\n" "$t" "$(median_ms "$dispatch" ATTN_SIMD_TARGET="$t")"
done
