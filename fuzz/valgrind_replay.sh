#!/bin/sh
# ctest's fuzz_replay_mha_valgrind: replays saved inputs under valgrind (an error is exit 9). Skipped (exit 77) where
# valgrind cannot run the target at all: valgrind 3.19 does not decode RDTSCP on some CPUs (seen on AMD EPYC family
# 26), which Highway reads while the library loads, so every program linking it stops with SIGILL before main.
# Usage: valgrind_replay.sh VALGRIND TARGET INPUT...
valgrind=$1 target=$2
shift 2
if ! probe=$("$valgrind" "$target" 2>&1); then
  if printf '%s\n' "$probe" | grep -q "unhandled instruction bytes"; then
    printf '%s\n' "$probe" | grep "unhandled instruction bytes" | head -n 1
    echo "valgrind cannot run $target on this CPU (an instruction it does not decode): skipped"
    exit 77
  fi
  printf '%s\n' "$probe"
  echo "valgrind: $target with no input failed"
  exit 1
fi
exec "$valgrind" -q --error-exitcode=9 "$target" "$@"
