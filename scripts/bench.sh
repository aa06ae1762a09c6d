#!/usr/bin/env bash
# Runs the BENCHMARKS.md comparison in one go: redis-server, a single
# Causeway node (R=1) and the 3-node dev site (R=3, k=2), workloads A, B, C,
# same client (`causeway bench`, RESP target, one connection per client),
# then the hot-key read distribution through the native client.
# Usage: scripts/bench.sh [seconds per run] [clients]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
clients=${2:-16}
command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server; }
cargo build --release -q -p causeway
B=./target/release/causeway
out=target/bench
mkdir -p $out
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT
redis-server --port 7500 --save '' --appendonly no >/dev/null & pids+=($!)
$B node --listen 127.0.0.1:7510 >/dev/null 2>&1 & pids+=($!)
$B dev --port 7520 >/dev/null 2>&1 & pids+=($!)
sleep 2
for w in a b c; do
  for t in redis:7500 causeway-r1:7510 causeway-r3:7520; do
    name=${t%%:*}; port=${t##*:}
    # Each target gets a fresh load of the same records.
    $B bench --target resp --addr 127.0.0.1:$port --workload $w --clients $clients --duration $secs \
      --label "$name" --json $out/$w-$name.json | tail -n +1
  done
done
for level in causal linearizable; do
  $B bench --target causeway --addr 127.0.0.1:7520 --hot-key --workload c --clients $clients --duration $secs \
    --consistency $level --label "causeway-r3-hotkey-$level" --json $out/hotkey-$level.json
done
