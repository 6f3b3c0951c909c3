#!/usr/bin/env bash
# The README's test command: install what is missing, build (optimised, assertions on,
# warnings as errors), run every test under CTest, then give each fuzz target 30 s of real
# libFuzzer time when clang is available.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${K3_BUILD_DIR:-$root/build}"
jobs="$(nproc)"

bash "$root/scripts/setup.sh"

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -g0" \
  -DK3_WERROR=ON >/dev/null
cmake --build "$build" -j "$jobs"
ctest --test-dir "$build" --output-on-failure -j "$jobs"

if command -v clang++ >/dev/null 2>&1 && [ "${K3_SKIP_LIBFUZZER:-0}" != 1 ]; then
  fuzz_build="$build-fuzz"
  CC=clang CXX=clang++ cmake -S "$root" -B "$fuzz_build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DK3_FUZZ=ON -DK3_BUILD_TESTS=ON >/dev/null
  targets=$(cd "$root/tests/fuzz/corpus" && ls)
  cmake --build "$fuzz_build" -j "$jobs" --target $targets
  for t in $targets; do
    work="$(mktemp -d)"
    cp "$root/tests/fuzz/corpus/$t"/* "$work/"
    echo "libFuzzer: $t for 30 s"
    "$fuzz_build/tests/fuzz/$t" -max_total_time=30 -print_final_stats=0 "$work" 2>"$work.log" \
      || { tail -50 "$work.log"; exit 1; }
    rm -rf "$work" "$work.log"
  done
else
  echo "libFuzzer: SKIPPED (clang++ not installed, or K3_SKIP_LIBFUZZER=1)"
fi
