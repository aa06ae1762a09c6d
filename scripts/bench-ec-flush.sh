#!/usr/bin/env bash
# Deleted space on an erasure-coded site: loads N keys of SIZE bytes on a
# 5-node ec:3+2 site, runs FLUSHALL, then prints the five nodes' used_memory
# (what the allocator holds), RSS and coded pages (INFO ec_data_bytes +
# ec_parity_bytes) once a second, and whether any node was removed.
# Usage: scripts/bench-ec-flush.sh [keys] [value size]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-500000}
size=${2:-1024}
command -v redis-cli >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-tools; }
cargo build --release -q -p causeway
B=./target/release/causeway
port=7650
log=$(mktemp)
setsid $B dev --nodes 5 --redundancy ec:3+2 --port $port >"$log" 2>&1 & d=$!
trap 'kill -- -$d 2>/dev/null || true; rm -f "$log"' EXIT
sleep 5
sum() { for i in 0 1 2 3 4; do redis-cli -p $((port + i)) info "$1" | tr -d '\r' | grep -E "^($2):" | cut -d: -f2; done | paste -sd+ | bc; }
rss() { for i in 0 1 2 3 4; do grep VmRSS "/proc/$(pgrep -f "node --id $i --listen 127.0.0.1:$((port + i))" | head -1)/status" | awk '{print $2}'; done | paste -sd+ | bc; }
show() { echo "$1: used_memory $(( $(sum memory used_memory) / 1048576 )) MB, RSS $(( $(rss) / 1024 )) MB, coded pages $(( $(sum ec 'ec_data_bytes|ec_parity_bytes') / 1048576 )) MB, keys $(redis-cli -p $port dbsize)"; }
show empty
$B bench --addr 127.0.0.1:$port --records "$n" --value-size "$size" --clients 16 --duration 1 --read-percent 100 >/dev/null
sleep 2
show "$n keys of $size B"
t0=$(date +%s%N)
answer=$(redis-cli -p $port flushall)
echo "FLUSHALL: $answer after $(( ($(date +%s%N) - t0) / 1000000 )) ms"
for s in 1 2 3 5; do sleep 1; show "+${s} s"; done
echo "nodes removed meanwhile: $(grep -c 'removed from its chains' "$log" || true)"
