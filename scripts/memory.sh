#!/usr/bin/env bash
# Memory per key at rest (RSS growth over N keys of SIZE bytes, one node per
# site, R=1): redis-server, one Causeway site, and three sites (keys written
# at site 2; site 0 holds them as remote writes).
# Usage: scripts/memory.sh [keys] [value size]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200000}
size=${2:-100}
command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server; }
cargo build --release -q -p causeway
B=./target/release/causeway
rss() { grep VmRSS "/proc/$1/status" | awk '{print $2}'; }
node() { pgrep -f "causeway node --id 0 --listen 127.0.0.1:$1" | head -1; }
load() { $B bench --target "$1" --addr "$2" --records "$n" --value-size "$size" --clients 16 --duration 1 --read-percent 100 >/dev/null; }
per_key() { echo $(( ($2 - $1) * 1024 / n )); }
redis-server --port 7500 --save '' --appendonly no >/dev/null & r=$!; sleep 1
b=$(rss $r); load resp 127.0.0.1:7500; echo "redis-server: $(per_key "$b" "$(rss $r)") B/key"; kill $r; wait $r 2>/dev/null || true
$B dev --nodes 1 --replicas 1 --k 1 --port 7380 >/dev/null 2>&1 & d=$!; sleep 3
p=$(node 7380); b=$(rss "$p"); load causeway 127.0.0.1:7380; sleep 15
echo "causeway, one site: $(per_key "$b" "$(rss "$p")") B/key"; kill $d; wait $d 2>/dev/null || true; sleep 1
$B dev --nodes 1 --replicas 1 --k 1 --sites 3 --port 7380 >/dev/null 2>&1 & d=$!; sleep 4
p0=$(node 7380); p2=$(node 7400); b0=$(rss "$p0"); b2=$(rss "$p2"); load causeway 127.0.0.1:7400; sleep 15
echo "causeway, three sites: $(per_key "$b2" "$(rss "$p2")") B/key where written, $(per_key "$b0" "$(rss "$p0")") B/key at another site"
kill $d; wait $d 2>/dev/null || true
