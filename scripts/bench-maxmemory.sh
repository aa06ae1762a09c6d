#!/usr/bin/env bash
# SET -P 16 with and without a memory budget (allkeys-random), one node
# (R=1) beside redis-server: throughput, server CPU per SET (utime+stime
# from /proc over the run), keys kept and evicted.
# Usage: scripts/bench-maxmemory.sh [requests] [budget]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1000000}
budget=${2:-40mb}
command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server; }
cargo build --release -q -p causeway
B=./target/release/causeway
run() { # label port pid
  local a b line
  a=$(awk '{print $14+$15}' "/proc/$3/stat")
  line=$(redis-benchmark -p "$2" -t set -n "$n" -r 1000000 -d 100 -c 50 -P 16 --csv 2>/dev/null | tail -1)
  b=$(awk '{print $14+$15}' "/proc/$3/stat")
  echo "$1: $(echo "$line" | cut -d, -f2 | tr -d '"') SET/s, $(echo "($b-$a)*10000/$n" | bc -l | cut -c1-5) us CPU per SET," \
    "$(redis-cli -p "$2" dbsize) keys kept, $(redis-cli -p "$2" info stats | grep evicted_keys | cut -d: -f2 | tr -d '\r') evicted"
}
for max in 0 "$budget"; do
  $B node --listen 127.0.0.1:7740 --maxmemory "$max" --maxmemory-policy allkeys-random >/dev/null 2>&1 & p=$!; sleep 1.5
  run "causeway, maxmemory $max" 7740 $p; kill $p; wait $p 2>/dev/null || true
  redis-server --port 7741 --save '' --appendonly no --maxmemory "$max" --maxmemory-policy allkeys-random >/dev/null 2>&1 & p=$!; sleep 1
  run "redis-server, maxmemory $max" 7741 $p; kill $p; wait $p 2>/dev/null || true
done
