#!/usr/bin/env bash
# The disk tier's figures (BENCHMARKS.md, "Bigger than memory"): YCSB B
# and C, zipfian and uniform, on one node (R=1) with a data set several
# times its memory budget, for each cache policy; the same fully in
# memory; and redis-server with the same maxmemory and allkeys-lru, which
# drops what it evicts (its reads of those answer nil: counted as reads
# answered without a value). Each run loads the records afresh.
# With `memory` first: memory per key whose value is on disk instead.
# Usage: scripts/bench-tier.sh [records] [value bytes] [budget] [seconds]
#        scripts/bench-tier.sh memory [records] [value bytes]
#        scripts/bench-tier.sh join [records] [budget]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = memory ]; then
  # Load without a budget, then set one of 1mb: every value moves out and
  # what stays per key is the key, its version and the table's slot.
  n=${2:-200000}; size=${3:-1000}
  cargo build --release -q -p causeway
  dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
  ./target/release/causeway node --listen 127.0.0.1:7752 --disk-tier "$dir/tier" >/dev/null 2>&1 & p=$!; sleep 1
  field() { redis-cli -p 7752 info "$1" | grep "^$2:" | cut -d: -f2 | tr -d '\r'; }
  rss() { grep VmRSS "/proc/$p/status" | awk '{print $2 * 1024}'; }
  r0=$(rss); u0=$(field memory used_memory); d0=$(field memory used_memory_dataset)
  ./target/release/causeway bench --target resp --addr 127.0.0.1:7752 --records "$n" --value-size "$size" --clients 16 --duration 1 --read-percent 100 >/dev/null
  redis-cli -p 7752 config set maxmemory 1mb >/dev/null
  sleep 10
  echo "$n keys of $size B, $(field tier tier_keys_on_disk) with their value on disk: per key, stores +$(( ($(field memory used_memory_dataset) - d0) / n )) B," \
    "allocated +$(( ($(field memory used_memory) - u0) / n )) B, RSS +$(( ($(rss) - r0) / n )) B; disk file $(( $(field tier tier_disk_file_bytes) / n )) B per key"
  kill $p; wait $p 2>/dev/null || true
  exit 0
fi
if [ "${1:-}" = join ]; then
  # A node joins a 3-node site (R=3) whose nodes hold most values on disk
  # (budget 30mb each by default; keys stay in memory, so give 1M keys
  # some 150mb): how long until it serves its share, and what a workload
  # on another node sees meanwhile.
  n=${2:-100000}; budget=${3:-30mb}
  cargo build --release -q -p causeway
  B=./target/release/causeway
  dir=$(mktemp -d); pids=()
  trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
  all=0=127.0.0.1:7960,1=127.0.0.1:7961,2=127.0.0.1:7962
  for i in 0 1 2; do
    $B node --id $i --listen 127.0.0.1:796$i --nodes $all --replicas 3 --k 2 --cluster-secret bench \
      --maxmemory "$budget" --disk-tier "$dir/tier$i" >/dev/null 2>&1 & pids+=($!)
  done
  sleep 2
  $B bench --target resp --addr 127.0.0.1:7960 --workload c --records "$n" --value-size 1000 --clients 16 --duration 1 >/dev/null
  sleep 5
  for i in 0 1 2; do echo "node $i: $(redis-cli -p 796$i info tier | grep -E 'tier_keys_on_disk|tier_value_bytes_on_disk' | tr -d '\r' | tr '\n' ' ')"; done
  $B node --id 3 --listen 127.0.0.1:7963 --join --nodes $all,3=127.0.0.1:7963 --replicas 3 --k 2 --cluster-secret bench \
    --maxmemory "$budget" --disk-tier "$dir/tier3" >/dev/null 2>&1 & pids+=($!)
  sleep 1
  $B bench --target resp --addr 127.0.0.1:7961 --workload c --no-load --records "$n" --clients 8 --duration 15 --label during-join \
    > "$dir/during.txt" &
  bench=$!
  sleep 2
  start=$(date +%s%N)
  $B cluster --addr 127.0.0.1:7960 add 3 127.0.0.1:7963 >/dev/null
  until redis-cli -p 7963 cw.cluster status | grep -q 'node3:.*tail=[1-9]' && \
        redis-cli -p 7963 cw.cluster status | grep -q 'joining_replicas_here:0' && \
        redis-cli -p 7963 cw.cluster status | grep -q 'short_chains:0'; do sleep 0.05; done
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  echo "join finished in $ms ms: $(redis-cli -p 7963 cw.cluster status | grep -oE 'node3:[^ ]*' | tr -d '\r'); state transfers: $(redis-cli -p 7963 info replication | grep state_transfers_whole | tr -d '\r')"
  sleep 3
  echo "node 3: $(redis-cli -p 7963 info tier | grep -E 'tier_keys_on_disk|tier_keys_in_memory' | tr -d '\r' | tr '\n' ' ')"
  wait $bench
  grep -E "^(read|total)|per second" "$dir/during.txt"
  exit 0
fi
records=${1:-100000}
size=${2:-1000}
budget=${3:-25mb}
secs=${4:-10}
command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server; }
cargo build --release -q -p causeway
B=./target/release/causeway
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
bench() { # label port workload distribution
  $B bench --target resp --addr "127.0.0.1:$2" --workload "$3" --distribution "$4" --records "$records" \
    --value-size "$size" --duration "$secs" --clients 32 --label "$1" 2>&1 | grep -E "^(read|update|total)|note: (reads answered|memory hit|keyspace hit)"
}
for w in b c; do
  for d in zipfian uniform; do
    echo "== YCSB $w ($d), $records records of $size B, budget $budget"
    for policy in fifo lru lfu; do
      rm -rf "$dir/tier"
      $B node --listen 127.0.0.1:7750 --maxmemory "$budget" --disk-tier "$dir/tier" --cache-policy "$policy" >/dev/null 2>&1 & p=$!; sleep 1
      echo "-- causeway, disk tier, $policy"; bench "tier-$policy" 7750 $w $d
      echo "   $(redis-cli -p 7750 info tier | grep -E 'tier_disk_read_p99_usec|tier_disk_written_bytes|tier_disk_file_bytes' | tr -d '\r' | tr '\n' ' ')"
      kill $p; wait $p 2>/dev/null || true
    done
    $B node --listen 127.0.0.1:7750 >/dev/null 2>&1 & p=$!; sleep 1
    echo "-- causeway, all in memory"; bench memory 7750 $w $d
    kill $p; wait $p 2>/dev/null || true
    redis-server --port 7751 --save '' --appendonly no --maxmemory "$budget" --maxmemory-policy allkeys-lru >/dev/null 2>&1 & p=$!; sleep 1
    echo "-- redis-server, maxmemory $budget allkeys-lru"; bench redis 7751 $w $d
    kill $p; wait $p 2>/dev/null || true
  done
done
