#!/usr/bin/env bash
# The disk tier's figures (BENCHMARKS.md, "Bigger than memory"): YCSB B
# and C, zipfian and uniform, on one node (R=1) with a data set several
# times its memory budget, for each cache policy; the same fully in
# memory; and redis-server with the same maxmemory and allkeys-lru, which
# drops what it evicts (its reads of those answer nil: counted as reads
# answered without a value). Each run loads the records afresh.
# Usage: scripts/bench-tier.sh [records] [value bytes] [budget] [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
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
