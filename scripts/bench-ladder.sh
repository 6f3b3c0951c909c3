#!/usr/bin/env bash
# Streaming benchmark (DESIGN.md §9): a ladder of memory budgets on one
# prepared directory, from the plan's minimum to everything resident. Per rung: decode s/token
# (median of RUNS runs), bytes read per token by kind, expert hit rate, I/O share, peak RSS
# against the plan, time ÷ floor (the floor measured in the same run by k3run's probes), time ÷
# the floor at the engine's own read rate (no probe: needed bytes ÷ bytes read per busy second),
# the share of guesses read ahead that were used, and the
# generated ids, which must be identical on every rung (exit 1 otherwise). Peak RSS above the plan
# by more than the stated overhead also fails the rung.
#
# usage: scripts/bench-ladder.sh [--build DIR] [--prepared DIR] [--work DIR] [--runs N]
#                                [--gen N] [--threads N] [--rungs LIST] [--keep]
#   --build     build directory with k3prep/k3prep and k3run/k3run (default ./build)
#   --prepared  a prepared directory to use; default: synth the bench preset (18.8 GB) into
#               --work and pack it (copy mode: aligned expert records), if free disk allows
#   --work      scratch directory (default /tmp/k3-bench-ladder), removed unless --keep
#   --runs      runs per rung (default 3); --gen tokens per run (default 16; the first step,
#               the prompt's prefill, is excluded from s/token); --threads (default 2)
#   --rungs     comma-separated rungs: min, T+C (trunk GB + cache GB, the original engine's
#               style), a total in GB, or "resident" (a budget holding everything, --preload)
#               default: min,0.2+0.2,0.6+0.5,1.5,4,resident
# Caches are dropped before every run when we are root (cold disk, as a first token would see).
# Output: a table for docs/PERFORMANCE.md, and ladder.json in --work.
set -euo pipefail

build=./build
prepared=""
work=/tmp/k3-bench-ladder
runs=3
gen=16
threads=2
rungs="min,0.2+0.2,0.6+0.5,1.5,4,resident"
keep=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --prepared) prepared=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rungs) rungs=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "bench-ladder: unknown argument $1" >&2; exit 2 ;;
  esac
done
k3prep=$build/k3prep/k3prep
k3run=$build/k3run/k3run
for b in "$k3prep" "$k3run"; do
  [[ -x $b ]] || { echo "bench-ladder: $b not found: build first (cmake --build $build)" >&2; exit 2; }
done
mkdir -p "$work"
cleanup() { if [[ $keep == 0 ]]; then rm -rf "$work"; fi; }
trap cleanup EXIT

if [[ -z $prepared ]]; then
  free_gb=$(df -BG --output=avail "$work" | tail -1 | tr -dc 0-9)
  if (( free_gb < 45 )); then
    echo "bench-ladder: the bench preset needs ~40 GB in $work (checkpoint + copy-mode pack); $free_gb GB free. Give --prepared DIR or --work on a larger disk." >&2
    exit 2
  fi
  echo "== synth --preset bench, pack --experts copy (once) =="
  "$k3prep" synth --preset bench --out "$work/bench" --progress plain
  "$k3prep" pack "$work/bench" --out "$work/bench.prep" --experts copy --progress plain
  rm -rf "$work/bench"
  prepared=$work/bench.prep
fi

drop_caches() {
  sync
  if [[ -w /proc/sys/vm/drop_caches ]]; then echo 3 > /proc/sys/vm/drop_caches; fi
}

prompt_ids="1,2,3,4,5,6,7,8"
# The minimum total budget for this very run (the budget is TOTAL: it also pays for the latent
# caches of prompt + gen positions, the KDA states and scratch), from the plan's own refusal
# ("give --budget-gb X or more").
min_gb=$( ("$k3run" "$prepared" --ids "$prompt_ids" --gen "$gen" --threads "$threads" \
           --budget-gb 0.000001 --no-floor --quiet 2>&1 || true) \
         | grep -o 'give --budget-gb [0-9.]*' | head -1 | awk '{print $3}')
[[ -n $min_gb ]] || { echo "bench-ladder: could not read the minimum budget from k3run" >&2; exit 1; }
echo "minimum total budget: $min_gb GB"

IFS=, read -ra rung_list <<< "$rungs"
for rung in "${rung_list[@]}"; do
  case "$rung" in
    min) flags=(--budget-gb "$min_gb") ;;
    resident) flags=(--preset max --preload) ;;
    *+*) flags=(--trunk-gb "${rung%+*}" --cache-gb "${rung#*+}") ;;
    *) flags=(--budget-gb "$rung") ;;
  esac
  for r in $(seq "$runs"); do
    drop_caches
    out="$work/rung-${rung}-run$r.json"
    echo "== rung $rung run $r: k3run ${flags[*]} --gen $gen --ignore-eos --threads $threads"
    /usr/bin/time -f "%e s wall, %M KiB maxrss" \
      "$k3run" "$prepared" --ids "$prompt_ids" --gen "$gen" --ignore-eos --threads "$threads" \
      "${flags[@]}" --probe-seconds 0.5 --out "$out" --quiet
  done
done

python3 - "$work" "$rungs" "$runs" <<'PY'
import json, statistics, sys
work, rungs, runs = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
# What a run may hold beyond its plan: the binary and its libraries, the tokenizer, the parsed
# manifest and expert index, thread stacks and allocator slack.
OVERHEAD = 64 << 20
GiB = 1 << 30
rows, ids0, ok = [], None, True
for rung in rungs:
    reps = [json.load(open(f"{work}/rung-{rung}-run{r}.json")) for r in range(1, runs + 1)]
    spt = statistics.median(r["totals"]["decode_seconds_per_token"] for r in reps)
    floors = [r["floor"]["time_over_floor"] for r in reps if r.get("floor")]
    bounds = [r["floor"]["bound"] for r in reps if r.get("floor")]
    floor_s = statistics.median(r["floor"]["floor_s"] for r in reps if r.get("floor")) if floors else None
    r0 = reps[0]
    bpt = r0["totals"]["bytes_per_token"]
    rss = max(r["peak_rss_bytes"] for r in reps)
    plan = r0["memory_plan"]["total_bytes"]
    rss_ok = rss <= plan + OVERHEAD
    for r in reps:
        if ids0 is None:
            ids0 = r["generated_ids"]
        elif r["generated_ids"] != ids0:
            ok = False
            print(f"IDS DIFFER on rung {rung}: {r['generated_ids']} vs {ids0}")
    if not rss_ok:
        ok = False
        print(f"PEAK RSS {rss/GiB:.2f} GiB exceeds plan {plan/GiB:.2f} GiB + 64 MiB on rung {rung}")
    hit = r0["totals"]["expert_hit_rate"]
    guessed = r0["totals"].get("expert_guess_precision")
    # Time ÷ the floor at the engine's OWN read rate (k3run's report, own_rate_floor: the bytes
    # a token had to read ÷ all bytes read per busy second). It needs no probe, so it does not
    # move with the host cache's state the way the probe's floor does. Null when resident.
    own = [r["own_rate_floor"]["time_over_floor"] for r in reps if r.get("own_rate_floor")]
    rows.append((rung, spt, bpt, hit, r0["totals"]["io_share"], rss, plan, floor_s,
                 statistics.median(floors) if floors else None, bounds[0] if bounds else "-",
                 [r["totals"]["decode_seconds_per_token"] for r in reps], guessed,
                 statistics.median(own) if own else None))
print()
print("| rung | s/token (median) | runs | read/token: trunk + lm_head + experts (MB) | expert hits | guesses used | I/O share | peak RSS / plan (GiB) | floor (s) | time ÷ floor | bound | time ÷ own-rate floor |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for (rung, spt, bpt, hit, io, rss, plan, floor_s, tof, bound, all_s, guessed, own) in rows:
    mb = lambda b: b / 1e6
    print(f"| {rung} | {spt:.3f} | {', '.join(f'{s:.3f}' for s in all_s)} | "
          f"{mb(bpt['trunk']):.0f} + {mb(bpt['lm_head']):.0f} + {mb(bpt['experts']):.0f} | "
          f"{'-' if hit is None else f'{100*hit:.1f} %'} | "
          f"{'-' if guessed is None else f'{100*guessed:.0f} %'} | {'-' if io is None else f'{100*io:.0f} %'} | "
          f"{rss/GiB:.2f} / {plan/GiB:.2f} | {'-' if floor_s is None else f'{floor_s:.3f}'} | "
          f"{'-' if tof is None else f'{tof:.2f}'} | {bound} | {'-' if own is None else f'{own:.2f}'} |")
print()
print("generated ids identical on every rung:", "yes" if ok else "NO")
json.dump({"rows": [dict(rung=r[0], seconds_per_token=r[1], time_over_floor=r[8], peak_rss=r[5],
                         plan=r[6]) for r in rows], "ids": ids0, "ok": ok},
          open(f"{work}/ladder.json", "w"), indent=1)
sys.exit(0 if ok else 1)
PY
