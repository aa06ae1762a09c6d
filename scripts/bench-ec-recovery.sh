#!/usr/bin/env bash
# Online recovery of an erasure-coded site (ec:3+2, 5 nodes): load N keys
# of SIZE bytes, run YCSB B for 10 s as a baseline, then again for 20 s
# with node 4 killed (-9) 5 s in. Reports when the coordinator removed it,
# when every page of its data slots was decoded by the parity members that
# took them over (INFO ec: ec_missing_pages back to 0), the pages and MB/s
# repaired, and both runs' latencies. Then YCSB B for 30 s again with node 4
# restarted (empty) 5 s in: when it was rebuilt (its parity from the data
# slots' state, its data slots taken back and decoded: INFO ec_whole 1 on
# every node), the MB it holds again, and the latencies.
# Usage: scripts/bench-ec-recovery.sh [keys] [value size]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1000000}
size=${2:-1024}
cargo build --release -q -p causeway
B=./target/release/causeway
port=7700
addrs=$(seq -s, -f "127.0.0.1:%g" $port $((port + 3)))
field() { redis-cli -p "$1" info ec | tr -d '\r' | awk -F: -v k="$2" '$1 == k { print $2 }'; }
now_ms() { date +%s%3N; }
$B dev --nodes 5 --port $port --redundancy ec:3+2 >/dev/null 2>&1 & d=$!
trap 'kill $d 2>/dev/null || true' EXIT
sleep 5
$B bench --target causeway --addr "$addrs" --records "$n" --value-size "$size" --clients 16 --duration 1 --read-percent 100 >/dev/null
echo "loaded $n keys of $size B; node 4 holds $(( $(field $((port + 4)) ec_data_bytes) / 1048576 )) MB of data pages, $(( $(field $((port + 4)) ec_parity_bytes) / 1048576 )) MB of parity"
echo "--- baseline, YCSB B, 10 s"
$B bench --target causeway --addr "$addrs" --records "$n" --value-size "$size" --clients 16 --duration 10 --workload b --no-load | grep -E "^(read|update|total)|stretch"
echo "--- YCSB B, 20 s, node 4 killed 5 s in"
$B bench --target causeway --addr "$addrs" --records "$n" --value-size "$size" --clients 16 --duration 20 --workload b --no-load > /tmp/bench-ec-recovery.out &
b=$!
sleep 5
victim=$(pgrep -f "causeway node --id 4 --listen 127.0.0.1:$((port + 4))" | head -1)
cmdline=$(tr '\0' '\n' < /proc/"$victim"/cmdline)
kill -9 "$victim"
killed=$(now_ms)
removed=""
while true; do
  lost=1 missing=0 repaired=0
  for i in 0 1 2 3; do
    [ "$(field $((port + i)) ec_lost_nodes)" = "4" ] || lost=0
    missing=$((missing + $(field $((port + i)) ec_missing_pages)))
    repaired=$((repaired + $(field $((port + i)) ec_repaired_pages)))
  done
  if [ $lost = 1 ] && [ -z "$removed" ]; then removed=$(now_ms); fi
  if [ -n "$removed" ] && [ $missing = 0 ]; then break; fi
  sleep 0.1
done
done_at=$(now_ms)
secs=$(awk -v a="$removed" -v b="$done_at" 'BEGIN { printf "%.2f", (b - a) / 1000 }')
echo "removed $((removed - killed)) ms after the kill; $repaired pages ($((repaired * 4096 / 1048576)) MB) decoded in $secs s ($(awk -v p="$repaired" -v s="$secs" 'BEGIN { printf "%.0f", p * 4096 / 1048576 / (s > 0 ? s : 1) }') MB/s)"
wait $b
grep -E "^(read|update|total)|stretch" /tmp/bench-ec-recovery.out
echo "--- YCSB B, 30 s, node 4 restarted empty 5 s in"
$B bench --target causeway --addr "$addrs" --records "$n" --value-size "$size" --clients 16 --duration 30 --workload b --no-load > /tmp/bench-ec-recovery.out &
b=$!
sleep 5
mapfile -t argv <<< "$cmdline"
"${argv[@]}" >/dev/null 2>&1 &
r=$!
trap 'kill $d $r 2>/dev/null || true' EXIT
restarted=$(now_ms)
while true; do
  whole=1
  for i in 0 1 2 3 4; do
    [ "$(field $((port + i)) ec_whole 2>/dev/null)" = "1" ] && [ -z "$(field $((port + i)) ec_joining_nodes 2>/dev/null)" ] || whole=0
  done
  [ $whole = 1 ] && break
  sleep 0.1
done
done_at=$(now_ms)
secs=$(awk -v a="$restarted" -v b="$done_at" 'BEGIN { printf "%.2f", (b - a) / 1000 }')
held=$(( ($(field $((port + 4)) ec_data_bytes) + $(field $((port + 4)) ec_parity_bytes)) / 1048576 ))
echo "node 4 rebuilt $secs s after its restart: it holds $held MB again ($(field $((port + 4)) ec_data_bytes) B data pages, $(field $((port + 4)) ec_parity_bytes) B parity; $(awk -v m="$held" -v s="$secs" 'BEGIN { printf "%.0f", m / (s > 0 ? s : 1) }') MB/s)"
wait $b
grep -E "^(read|update|total)|stretch" /tmp/bench-ec-recovery.out
