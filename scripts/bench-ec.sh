#!/usr/bin/env bash
# Erasure coding against replication, on one 5-node site: memory per key at
# rest (the RSS growth of all five nodes over N keys of SIZE bytes), then
# YCSB B (95:5) and A (50:50) throughput and server CPU per operation
# (utime+stime of the five nodes over the run), for ec:3+2 and R=3 k=2.
# Usage: scripts/bench-ec.sh [keys] [value size] [seconds per run]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200000}
size=${2:-1024}
secs=${3:-10}
cargo build --release -q -p causeway
B=./target/release/causeway
port=7600
addrs=$(seq -s, -f "127.0.0.1:%g" $port $((port + 4)))
pids() { for i in 0 1 2 3 4; do pgrep -f "causeway node --id $i --listen 127.0.0.1:$((port + i))" | head -1; done; }
rss() { local t=0; for p in $(pids); do t=$((t + $(grep VmRSS "/proc/$p/status" | awk '{print $2}'))); done; echo "$t"; }
ticks() { local t=0; for p in $(pids); do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
hz=$(getconf CLK_TCK)
run() { # name, dev flags...
  local name=$1; shift
  $B dev --nodes 5 --port $port "$@" >/dev/null 2>&1 & local d=$!
  sleep 5
  local before; before=$(rss)
  $B bench --target causeway --addr "$addrs" --records "$n" --value-size "$size" --clients 16 --duration 1 --read-percent 100 >/dev/null
  sleep 5
  local after; after=$(rss)
  echo "$name: memory $(( (after - before) * 1024 / n )) B/key over the 5 nodes (RSS $((before / 1024)) -> $((after / 1024)) MB, $n keys of $size B)"
  for w in b a; do
    local t0; t0=$(ticks)
    local out; out=$($B bench --target causeway --addr "$addrs" --records "$n" --value-size "$size" --clients 32 --duration "$secs" --workload $w --no-load)
    local t1; t1=$(ticks)
    local ops; ops=$(echo "$out" | awk '/^total/ {print $3}')
    local cpu_us; cpu_us=$(awk -v t=$((t1 - t0)) -v hz="$hz" -v ops="$ops" -v s="$secs" 'BEGIN { printf "%.0f", t / hz * 1e6 / (ops * s) }')
    echo "$name: YCSB $w: $ops ops/s, server CPU $cpu_us us/op"
  done
  kill $d; wait $d 2>/dev/null || true; sleep 2
}
run "ec:3+2" --redundancy ec:3+2
run "R=3 k=2" --replicas 3 --k 2
