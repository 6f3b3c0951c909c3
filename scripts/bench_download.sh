#!/usr/bin/env bash
# Benchmark: `k3prep download` of a synth checkpoint from the local Hub simulator versus plain
# curl fetching the same files from the same servers in the same run (DESIGN.md §9).
#
# Usage: scripts/bench_download.sh [BUILD_DIR (default build)] [PRESET (default small)]
# Environment: REPS (runs of each tool, alternating; default 3).
# Prints the best and median wall times of curl, curl + sync (curl does no fsync; k3prep fsyncs
# every file before its rename) and k3prep, the throughput ratios k3prep / curl and
# k3prep / (curl + sync) (aim >= 0.9), and the bytes the downloader read from files while
# downloading (/proc/PID/io rchar and read_bytes at exit): the hash is computed from the stream,
# so this should be ~0 beyond resume prefixes (none here). Everything runs on 127.0.0.1 only.
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

# Alternate the tools REPS times (default 3) and report each one's best and median: on a small
# shared machine the loopback server competes with the clients (and other builds) for cores, so
# single runs are noisy.
REPS="${REPS:-3}"
ARGS=()
for f in $FILES; do ARGS+=(-o "$WORK/curl/$f" "$EP/org/bench/resolve/$COMMIT/$f"); done
CURL_T=(); SYNC_T=(); K3_T=()
now() { date +%s.%N; }
for rep in $(seq "$REPS"); do
  # Plain curl, 4 files in parallel (k3prep's default --jobs), following the CDN redirect. curl
  # does no fsync: its bytes are still only in the page cache when it exits. "curl + sync" then
  # fsyncs each file and the directory (what k3prep does per file before its rename), timed
  # separately; `sync FILE...` rather than a global sync, which would also flush whatever other
  # processes left dirty on the disk.
  rm -rf "$WORK/curl"; mkdir -p "$WORK/curl"; sync
  T0=$(now)
  curl -sS -L -Z --parallel-max 4 "${ARGS[@]}" 2>/dev/null
  T1=$(now)
  sync "$WORK/curl"/* "$WORK/curl"
  T2=$(now)
  CURL_T+=("$(echo "$T1 - $T0" | bc -l)")
  SYNC_T+=("$(echo "$T2 - $T0" | bc -l)")

  # k3prep download, its file reads sampled from /proc/PID/io; timed from Popen to exit.
  rm -rf "$WORK/k3"; sync
  /usr/bin/python3 - "$K3PREP" "$EP" "$WORK/k3" > "$WORK/io.txt" <<'PY'
import os, subprocess, sys, threading, time
k3prep, ep, dest = sys.argv[1:4]
env = dict(os.environ, HF_ENDPOINT=ep)
env.pop("HF_TOKEN", None)
t0 = time.monotonic()
p = subprocess.Popen([k3prep, "download", "org/bench", "--dest", dest, "--progress", "none"],
                     env=env, stderr=subprocess.DEVNULL)
# Wait for the exit without reaping (WNOWAIT), so the timing has no polling delay and the
# zombie's /proc/PID/io still holds the final totals.
os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
t = time.monotonic() - t0
with open("/proc/%d/io" % p.pid) as f:
    io = dict(l.split(": ") for l in f.read().split("\n") if l)
print(p.wait(), io.get("rchar", "?").strip(), io.get("read_bytes", "?").strip(), "%.4f" % t)
PY
  read -r RC RCHAR READ_BYTES T < "$WORK/io.txt"
  K3_T+=("$T")
  [ "$RC" = "0" ] || { echo "k3prep download failed (exit $RC)" >&2; exit 1; }
  for f in $FILES; do cmp -s "$WORK/src/$f" "$WORK/k3/$f" || { echo "MISMATCH $f" >&2; exit 1; }; done
done

best() { printf '%s\n' "$@" | sort -g | head -1; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
list() { printf ' %.2f' "$@"; }
row() {  # label, times...
  local label="$1"; shift
  local b m; b=$(best "$@"); m=$(median "$@")
  printf '%-26s best %5.2f s (%6.1f MB/s)  median %5.2f s (%6.1f MB/s)  runs:%s\n' "$label" \
    "$b" "$(echo "$BYTES / $b / 1000000" | bc -l)" "$m" "$(echo "$BYTES / $m / 1000000" | bc -l)" \
    "$(list "$@")"
}
ratio() {  # label, reference times as "a b c", k3 times...
  local label="$1" ref="$2"; shift 2
  printf 'ratio k3prep / %-12s best %.2f  median %.2f  (aim >= 0.9)\n' "$label" \
    "$(echo "$(best $ref) / $(best "$@")" | bc -l)" "$(echo "$(median $ref) / $(median "$@")" | bc -l)"
}
printf 'files: %s, %.1f MB (preset %s), loopback, %s cores, load %s, %s runs each, alternating\n' \
  "$(echo $FILES | wc -w)" "$(echo "$BYTES / 1000000" | bc -l)" "$PRESET" "$(nproc)" \
  "$(cut -d' ' -f1 /proc/loadavg)" "$REPS"
row "curl -Z (4 parallel)" "${CURL_T[@]}"
row "curl -Z + sync" "${SYNC_T[@]}"
row "k3prep download" "${K3_T[@]}"
echo "  (k3prep includes resolve, listing, SHA-256 of every byte while streaming, fsync + rename per file)"
ratio "curl" "${CURL_T[*]}" "${K3_T[@]}"
ratio "curl + sync" "${SYNC_T[*]}" "${K3_T[@]}"
printf 'k3prep file reads while downloading (last run): rchar %s bytes (includes its own /proc, config and ELF loads), read_bytes %s\n' \
  "$RCHAR" "$READ_BYTES"
