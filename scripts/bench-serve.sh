#!/usr/bin/env bash
# The server under concurrent clients (DESIGN.md §11.5, docs/PERFORMANCE.md "More tokens per
# pass"): starts `k3run PREPARED --serve` with the memory flags given, then for 1, 4 and 8
# concurrent streaming clients (each a different prompt of --prompt pseudo-random ids, greedy,
# --gen tokens) measures time to first token, aggregate generated tok/s, and the weight bytes
# read per generated token and the engine's idle time between passes (from /metrics; a fresh
# server per client count, so the quantiles cover that run only). Then a chat of --turns turns
# re-sending the whole conversation each turn, with and without the prompt cache: seconds per
# turn.
# The load generator is Python's standard library (threads blocked on sockets): it takes no
# measurable CPU from the server.
#
# usage: scripts/bench-serve.sh --prepared DIR [--build DIR] [--clients 1,4,8] [--gen N]
#                               [--prompt N] [--turns N (0: no chat)] [--threads N]
#                               [--ctx N (positions per sequence, 2048)] -- [k3run memory flags]
set -euo pipefail

build=./build
prepared=""
clients="1,4,8"
gen=16
prompt=16
turns=10
threads=2
ctx=2048
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --prepared) prepared=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --turns) turns=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --ctx) ctx=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "bench-serve: unknown argument $1" >&2; exit 2 ;;
  esac
done
extra=("$@")
k3run=$build/k3run/k3run
[[ -x $k3run ]] || { echo "bench-serve: $k3run not found: build first" >&2; exit 2; }
[[ -n $prepared ]] || { echo "bench-serve: --prepared DIR is required" >&2; exit 2; }

max=$(tr , '\n' <<< "$clients" | sort -n | tail -1)
server=""
port=""
run_server() {  # $1: log name, $2: prompt cache GB; sets $server (pid) and $port
  local log=$1.log
  "$k3run" "$prepared" --serve --port 0 --max-seqs "$max" --queue "$max" --ctx "$ctx" \
    --threads "$threads" --prompt-cache-gb "$2" "${extra[@]}" 2> "$log" &
  server=$!
  for _ in $(seq 600); do
    if grep -q 'ready: serving' "$log" 2>/dev/null; then break; fi
    kill -0 "$server" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.5
  done
  port=$(grep -o 'listening on http://[^ ]*' "$log" | head -1 | sed 's/.*://')
}
work=$(mktemp -d)
trap '[[ -n $server ]] && kill $server 2>/dev/null; rm -rf "$work"' EXIT

clients_run() {  # $1: concurrent clients; one table row
  python3 - "$port" "$1" "$gen" "$prompt" <<'PY'
import http.client, json, sys, threading, time
port, n, gen, plen = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def model():
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("GET", "/v1/models")
    return json.loads(c.getresponse().read())["data"][0]["id"]

MODEL = model()

def metrics():
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("GET", "/metrics")
    m = {}
    for line in c.getresponse().read().decode().splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            m[k] = float(v)
    return m

def client(i, out):
    ids, x = [], 1000 + i
    for _ in range(plen):
        x = (x * 1103515245 + 12345) % 2**32
        ids.append((x >> 8) % 1000)
    body = json.dumps({"model": MODEL, "prompt": ids, "max_tokens": gen, "temperature": 0,
                       "stream": True, "ignore_eos": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.monotonic()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    first, tokens = None, 0
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if first is None and chunk.get("choices") and chunk["choices"][0].get("text") is not None:
            first = time.monotonic() - t0
        if chunk.get("k3"):
            tokens = len(chunk["k3"]["generated_ids"])
    out[i] = (first or 0.0, time.monotonic() - t0, tokens)

before = metrics()
out = [None] * n
threads = [threading.Thread(target=client, args=(i, out)) for i in range(n)]
t0 = time.monotonic()
for t in threads: t.start()
for t in threads: t.join()
wall = time.monotonic() - t0
after = metrics()
toks = sum(o[2] for o in out)
ttft = sorted(o[0] for o in out)
mb = (after["k3_weight_bytes_read_total"] - before["k3_weight_bytes_read_total"]) / max(toks, 1) / 1e6
gaps = after["k3_engine_idle_seconds_count"] - before["k3_engine_idle_seconds_count"]
idle = after["k3_engine_idle_seconds_sum"] - before["k3_engine_idle_seconds_sum"]
passes = after["k3_passes_total"] - before["k3_passes_total"]
ms = lambda q: after['k3_engine_idle_seconds{quantile="%s"}' % q] * 1e3
print(f"| {n} | {toks} | {wall:.2f} | {toks / wall:.2f} | {ttft[len(ttft) // 2]:.2f}, {ttft[-1]:.2f} "
      f"| {mb:.1f} | {int(passes)} | {ms('0.5'):.3f}, {ms('0.99'):.3f}, {ms('1'):.3f} "
      f"| {idle * 1e3 / max(gaps, 1):.3f} |")
PY
}
echo "| clients | generated tokens | wall s | aggregate tok/s | time to first token s (median, max) | MB read per generated token | passes | engine idle between passes ms (median, p99, max) | idle mean ms |"
echo "|---|---|---|---|---|---|---|---|---|"
for n in $(tr , ' ' <<< "$clients"); do
  run_server "$work/clients$n" 0
  clients_run "$n"
  kill "$server"; wait "$server" 2>/dev/null || true
done

chat() {  # $1: label; a conversation re-sent whole each turn
  python3 - "$1" "$2" "$turns" "$gen" <<'PY'
import http.client, json, sys, time
label, port, turns, gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
c.request("GET", "/v1/models")
model = json.loads(c.getresponse().read())["data"][0]["id"]
messages, times = [], []
for t in range(turns):
    messages.append({"role": "user", "content": f"turn {t}: tell me more about item {t * 7}"})
    body = json.dumps({"model": model, "messages": messages, "max_tokens": gen, "temperature": 0,
                       "reasoning_effort": "none"})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = json.loads(c.getresponse().read())
    if "choices" not in r:
        sys.exit(f"bench-serve: turn {t + 1}: {json.dumps(r)}")
    times.append(time.monotonic() - t0)
    messages.append({"role": "assistant", "content": r["choices"][0]["message"]["content"]})
    cached = r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
print(f"| {label} | " + " ".join(f"{s:.2f}" for s in times) +
      f" | {sum(times) / len(times):.2f} | {cached} of {r['usage']['prompt_tokens']} |")
PY
}
if (( turns > 0 )); then
  echo
  echo "| chat of $turns turns | seconds per turn | mean | last turn's prompt tokens served by the cache |"
  echo "|---|---|---|---|"
  run_server "$work/nocache" 0
  chat "no prompt cache" "$port"
  kill "$server"; wait "$server" 2>/dev/null || true
  run_server "$work/cache" 2
  chat "--prompt-cache-gb 2" "$port"
fi
