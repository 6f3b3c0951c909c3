#!/usr/bin/env bash
# Scale-out benchmark (docs/SCALE-OUT.md, docs/PERFORMANCE.md "Scale-out"): one prompt decoded by
# N = 1, 2, 4 ranks of `mpirun --oversubscribe` on this machine, one run per N, all in one run of
# this script. Per N:
#   - decode s/token (median step after the first);
#   - bytes sent to and received from each other rank per generated token, measured (the
#     report's scale_out), against the model: rows × latent × 4 B each way, where rows are the
#     (row, expert) pairs that rank computed;
#   - rank 0's time split over the whole run: handing rows over (send), waiting for other ranks'
#     outputs (wait), waiting for its own disk reads (io_wait) and the rest (compute);
#   - each other rank's compute and idle seconds (its stderr line).
# Every N must give the ids of N = 1 (checked; a mismatch fails the script).
#
# usage: scripts/bench-mpi.sh --prepared DIR [--build DIR] [--gen N] [--ranks "1 2 4"]
#                             [--work DIR] -- [k3run memory flags, applied on every rank]
set -euo pipefail

build=./build
prepared=""
gen=16
ranks="1 2 4"
work=/tmp/k3-bench-mpi
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --prepared) prepared=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "bench-mpi: unknown argument $1" >&2; exit 2 ;;
  esac
done
extra=("$@")
k3run=$build/k3run/k3run
[[ -x $k3run ]] || { echo "bench-mpi: $k3run not found: build first" >&2; exit 2; }
[[ -n $prepared ]] || { echo "bench-mpi: --prepared DIR is required" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "bench-mpi: mpirun not found (scripts/setup.sh)" >&2; exit 2; }
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
for n in $ranks; do
  echo "== $n rank(s) ${extra[*]}" >&2
  mpirun --oversubscribe --bind-to none -np "$n" "$k3run" "$prepared" --mpi \
    --prompt "The history of the printing press begins" --gen "$gen" --ignore-eos --no-floor \
    --out "$work/report-$n.json" "${extra[@]}" > "$work/out-$n.txt" 2> "$work/err-$n.txt"
done

python3 - "$work" "$prepared" $ranks <<'PY'
import json, re, statistics, sys
work, prepared, ranks = sys.argv[1], sys.argv[2], [int(n) for n in sys.argv[3:]]
cfg = json.load(open(f"{prepared}/k3.json"))["config"]
latent = cfg["routed_expert_hidden_size"]
base = None
print(f"latent {latent} floats; model bytes = rows × {latent} × 4 B each way\n")
print("| ranks | decode s/token | rank | pairs/token | sent/token (B) | model (B) | sent ÷ model "
      "| received/token (B) | rank 0: send / wait / io_wait / compute (s) | other rank: compute / idle (s) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for n in ranks:
    r = json.load(open(f"{work}/report-{n}.json"))
    ids = r["generated_ids"]
    if base is None:
        base = ids
    elif ids != base:
        sys.exit(f"bench-mpi: {n} ranks gave other ids than {ranks[0]}: {ids} vs {base}")
    steps = r["steps"]
    decode = statistics.median(s["seconds"] for s in steps[1:]) if len(steps) > 1 else float("nan")
    total = sum(s["seconds"] for s in steps)
    io_wait = sum(s["io_wait_s"] for s in steps)
    so = r["scale_out"]
    send, wait = so["send_s"], so["wait_s"]
    split = f"{send:.3f} / {wait:.3f} / {io_wait:.3f} / {total - send - wait - io_wait:.3f}"
    err = open(f"{work}/err-{n}.txt").read()
    workers = {int(m.group(1)): (m.group(2), m.group(3)) for m in re.finditer(
        r"k3run rank (\d+) of \d+: \d+ requests, \d+ expert rows; computing ([0-9.]+) s, "
        r"waiting for rank 0 ([0-9.]+) s", err)}
    tokens = max(len(ids), 1)
    if not so["per_rank"]:
        print(f"| {n} | {decode:.4f} | – | – | 0 | 0 | – | 0 | {split} | – |")
    for p in so["per_rank"]:
        model = p["rows"] * latent * 4 / tokens
        c, i = workers.get(p["rank"], ("?", "?"))
        print(f"| {n} | {decode:.4f} | {p['rank']} | {p['rows'] / tokens:.1f} "
              f"| {p['bytes_sent_per_token']:.0f} | {model:.0f} "
              f"| {p['bytes_sent_per_token'] / model if model else 0:.4f} "
              f"| {p['bytes_received_per_token']:.0f} | {split} | {c} / {i} |")
print(f"\nids equal at every rank count: {base[:8]}…")
PY
