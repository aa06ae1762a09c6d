#!/usr/bin/env bash
# Instructions per request of one real node (R=1) under callgrind:
# redis-benchmark sends 50 000 SETs and then 50 000 GETs at -P 16 from 5
# clients; the counters are zeroed after a warm-up and dumped after each.
# Prints the totals; the dumps stay in $out.* for callgrind_annotate.
# Usage: scripts/callgrind-node.sh [out prefix]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/callgrind-node}
port=7750
command -v valgrind >/dev/null || { apt-get update -qq && apt-get install -y -qq valgrind; }
command -v redis-benchmark >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-tools; }
if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then echo "port $port is in use" >&2; exit 1; fi
cargo build --release -q -p causeway
rm -f "$out".*
valgrind --tool=callgrind --callgrind-out-file="$out.out" ./target/release/causeway node --listen 127.0.0.1:$port >/dev/null 2>&1 &
vg=$!
trap 'kill $vg 2>/dev/null || true' EXIT
sleep 8
bench() { redis-benchmark -p $port -t "$1" -n "$2" -r 100000 -d 100 -c 5 -P 16 -q >/dev/null 2>&1; }
bench set 2000
callgrind_control --zero $vg >/dev/null 2>&1
bench set 50000
callgrind_control --dump=set $vg >/dev/null 2>&1
bench get 50000
callgrind_control --dump=get $vg >/dev/null 2>&1
kill $vg; wait $vg 2>/dev/null || true
for f in "$out".out.1 "$out".out.2; do
  total=$(grep -m1 '^summary' "$f" | awk '{print $2}')
  echo "$(grep -m1 '^desc: Trigger' "$f" | sed 's/.*dump //'): $total instructions, $((total / 50000)) per request ($f)"
done
