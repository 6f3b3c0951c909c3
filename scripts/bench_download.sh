#!/usr/bin/env bash
# Benchmark: `k3prep download` of a synth checkpoint from the local Hub simulator versus plain
# curl fetching the same files from the same servers in the same run (DESIGN.md §9).
#
# Usage: scripts/bench_download.sh [BUILD_DIR (default build)] [PRESET (default small)]
# Prints both wall times, the throughput ratio (k3prep / curl; aim >= 0.9) and the bytes the
# downloader read from files while downloading (/proc/PID/io rchar and read_bytes, sampled every
# 20 ms until exit): hashing is overlapped with the transfer, so this should
# be ~0 beyond resume prefixes (none here). Everything runs on 127.0.0.1 only.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
PRESET="${2:-small}"
K3PREP="$BUILD/k3prep/k3prep"
[ -x "$K3PREP" ] || { echo "no $K3PREP: build the k3prep target first" >&2; exit 2; }
WORK="$(mktemp -d /tmp/k3-bench-download.XXXXXX)"
SIM_PID=""
cleanup() { [ -n "$SIM_PID" ] && kill "$SIM_PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

echo "synth --preset $PRESET ..."
"$K3PREP" synth --preset "$PRESET" --out "$WORK/src" --quiet
COMMIT=$(printf 'b%.0s' $(seq 40))
/usr/bin/python3 "$ROOT/tests/hubsim/hubsim.py" --root "$WORK/src" --repo org/bench \
  --commit "$COMMIT" --port-file "$WORK/port" --cdn-log /dev/null --parent-pid $$ &
SIM_PID=$!
for _ in $(seq 200); do [ -s "$WORK/port" ] && break; sleep 0.05; done
read -r HUB_PORT _ < "$WORK/port"
EP="http://127.0.0.1:$HUB_PORT"
BYTES=$(du -sb "$WORK/src" | cut -f1)
FILES=$(cd "$WORK/src" && ls)

# Alternate the two REPS times (default 3) and keep each one's best time: on a small shared
# machine the loopback server competes with the client for cores, so single runs are noisy.
REPS="${REPS:-3}"
ARGS=()
for f in $FILES; do ARGS+=(-o "$WORK/curl/$f" "$EP/org/bench/resolve/$COMMIT/$f"); done
CURL_S=999999; K3_S=999999
for rep in $(seq "$REPS"); do
  # Plain curl, 4 files in parallel (k3prep's default --jobs), following the CDN redirect.
  rm -rf "$WORK/curl"; mkdir -p "$WORK/curl"; sync
  T0=$(date +%s.%N)
  curl -sS -L -Z --parallel-max 4 "${ARGS[@]}" 2>/dev/null
  T1=$(date +%s.%N)
  CURL_S=$(echo "t=$T1 - $T0; if (t < $CURL_S) t else $CURL_S" | bc -l)

  # k3prep download, its file reads sampled from /proc/PID/io until it exits.
  rm -rf "$WORK/k3"; sync
  /usr/bin/python3 - "$K3PREP" "$EP" "$WORK/k3" > "$WORK/io.txt" <<'PY'
import os, subprocess, sys, time
k3prep, ep, dest = sys.argv[1:4]
env = dict(os.environ, HF_ENDPOINT=ep)
env.pop("HF_TOKEN", None)
t0 = time.monotonic()
p = subprocess.Popen([k3prep, "download", "org/bench", "--dest", dest, "--progress", "none"],
                     env=env, stderr=subprocess.DEVNULL)
last = {}
while p.poll() is None:
    try:
        with open("/proc/%d/io" % p.pid) as f:
            last = dict(l.split(": ") for l in f.read().split("\n") if l)
    except OSError:
        pass
    time.sleep(0.02)
print(p.returncode, last.get("rchar", "?").strip(), last.get("read_bytes", "?").strip(),
      "%.4f" % (time.monotonic() - t0))
PY
  # Timed inside the wrapper (Popen to exit, polling every 20 ms), so python's start-up is out.
  read -r RC RCHAR READ_BYTES T < "$WORK/io.txt"
  K3_S=$(echo "t=$T; if (t < $K3_S) t else $K3_S" | bc -l)
  [ "$RC" = "0" ] || { echo "k3prep download failed (exit $RC)" >&2; exit 1; }
  for f in $FILES; do cmp -s "$WORK/src/$f" "$WORK/k3/$f" || { echo "MISMATCH $f" >&2; exit 1; }; done
done

printf 'files: %s, %.1f MB (preset %s), loopback, %s cores\n' "$(echo $FILES | wc -w)" \
  "$(echo "$BYTES / 1000000" | bc -l)" "$PRESET" "$(nproc)"
printf 'curl -Z (4 parallel), best of %s: %6.2f s  %7.1f MB/s\n' "$REPS" "$CURL_S" "$(echo "$BYTES / $CURL_S / 1000000" | bc -l)"
printf 'k3prep download, best of %s:     %6.2f s  %7.1f MB/s (incl. resolve, listing, SHA-256, fsync)\n' \
  "$REPS" "$K3_S" "$(echo "$BYTES / $K3_S / 1000000" | bc -l)"
printf 'throughput ratio k3prep/curl: %.2f\n' "$(echo "$CURL_S / $K3_S" | bc -l)"
printf 'k3prep file reads while downloading: rchar %s bytes (includes its own /proc, config and ELF loads), read_bytes %s\n' \
  "$RCHAR" "$READ_BYTES"
