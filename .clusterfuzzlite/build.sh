#!/bin/bash -eu
# ClusterFuzzLite / OSS-Fuzz build: every fuzz target under the engine and sanitizer the service chose
# ($CXX, $CXXFLAGS, $LIB_FUZZING_ENGINE), copied to $OUT with its seed corpus (<target>_seed_corpus.zip) and, for
# npy, its dictionary (<target>.dict). Runs unchanged outside docker with those variables set (fuzz/README.md).
SRC_DIR=${SRC_DIR:-$SRC/attn}
BUILD=${WORK:-/tmp}/attn-build
cmake -S "$SRC_DIR" -B "$BUILD" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER="$CXX" \
  -DCMAKE_CXX_FLAGS="$CXXFLAGS" \
  -DATTN_LIBFUZZER=ON \
  -DATTN_FUZZ_ENGINE="$LIB_FUZZING_ENGINE" \
  -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_BENCH=OFF -DATTN_BUILD_REPORTS=OFF -DATTN_BUILD_TOOLS=OFF \
  -DATTN_BUILD_SUITE=ON
targets=$(cat "$BUILD/fuzz/targets.txt")
cmake --build "$BUILD" -j"$(nproc)" --target $(for t in $targets; do printf 'fuzz_%s ' "$t"; done)
for t in $targets; do
  cp "$BUILD/fuzz/fuzz_$t" "$OUT/"
  if [ -d "$SRC_DIR/fuzz/corpus/$t" ]; then
    (cd "$SRC_DIR/fuzz/corpus/$t" && zip -q -r "$OUT/fuzz_${t}_seed_corpus.zip" .)
  fi
  if [ -f "$SRC_DIR/fuzz/dict/$t.dict" ]; then
    cp "$SRC_DIR/fuzz/dict/$t.dict" "$OUT/fuzz_$t.dict"
  fi
done
