#!/usr/bin/env bash
# Throughput and server CPU time per request, redis-server beside Causeway,
# in one run: redis-benchmark SET and GET, unpipelined and at -P 16, against
# redis-server, one Causeway node (R=1) and a 3-node dev site (R=3, k=2);
# then the unloaded SET p50 (one client), then YCSB workload A (50:50
# read:update, zipfian, `causeway bench --target resp`, 32 clients, 8 s).
# CPU per request is utime+stime of
# the server processes (/proc/PID/stat, all threads) over the fixed request
# count, which moves far less than throughput on a shared machine.
# Usage: scripts/bench-cpu.sh [requests] [clients]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200000}
clients=${2:-50}
command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server redis-tools; }
command -v redis-benchmark >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-tools; }
cargo build --release -q -p causeway
B=./target/release/causeway
for port in 7700 7710 7720 7721 7722; do
  if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then echo "port $port is in use: stop what listens there first" >&2; exit 1; fi
done
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT
redis-server --port 7700 --save '' --appendonly no >/dev/null & pids+=($!)
$B node --listen 127.0.0.1:7710 >/dev/null 2>&1 & pids+=($!)
$B dev --port 7720 >/dev/null 2>&1 & pids+=($!)
sleep 3
server_pids() {
  case $1 in
    7700) echo "${pids[0]}" ;;
    7710) echo "${pids[1]}" ;;
    7720) pgrep -f "causeway node --id . --listen 127.0.0.1:772" | tr '\n' ' ' ;;
  esac
}
ticks() { local t=0; for p in $1; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $t; }
hz=$(getconf CLK_TCK)
printf '%-12s %-10s %12s %14s %10s\n' target test "requests/s" "server us/req" "p50 ms"
for port in 7700 7710 7720; do
  name=$(case $port in 7700) echo redis ;; 7710) echo r1 ;; 7720) echo r3-site ;; esac)
  sp=$(server_pids $port)
  for pipe in 1 16; do
    for t in set get; do
      before=$(ticks "$sp")
      line=$(redis-benchmark -p $port -t $t -n "$n" -r 100000 -d 100 -c "$clients" -P $pipe --csv 2>/dev/null | tail -1)
      after=$(ticks "$sp")
      rps=$(echo "$line" | cut -d, -f2 | tr -d '"')
      p50=$(echo "$line" | cut -d, -f5 | tr -d '"')
      us=$(awk -v d=$((after - before)) -v hz="$hz" -v n="$n" 'BEGIN { printf "%.1f", d * 1e6 / hz / n }')
      label=$t; [ "$pipe" -gt 1 ] && label="$t -P$pipe"
      printf '%-12s %-10s %12s %14s %10s\n' "$name" "$label" "$rps" "$us" "$p50"
    done
  done
  line=$(redis-benchmark -p $port -t set -n 20000 -r 100000 -d 100 -c 1 --csv 2>/dev/null | tail -1)
  printf '%-12s %-10s %12s %14s %10s\n' "$name" "set -c 1" "$(echo "$line" | cut -d, -f2 | tr -d '"')" "" "$(echo "$line" | cut -d, -f5 | tr -d '"')"
done
for port in 7700 7710 7720; do
  name=$(case $port in 7700) echo redis ;; 7710) echo r1 ;; 7720) echo r3-site ;; esac)
  sp=$(server_pids $port)
  before=$(ticks "$sp")
  $B bench --target resp --addr 127.0.0.1:$port --workload a --clients 32 --records 100000 --value-size 100 --duration 8 --json /tmp/bench-cpu-ycsb.json >/dev/null 2>&1
  after=$(ticks "$sp")
  ops=$(python3 -c "import json; print(json.load(open('/tmp/bench-cpu-ycsb.json'))['total_ops'])")
  us=$(awk -v d=$((after - before)) -v hz="$hz" -v n="$ops" 'BEGIN { printf "%.1f", d * 1e6 / hz / n }')
  printf '%-12s %-10s %12s %14s %10s\n' "$name" "ycsb-a" "$((ops / 8))" "$us" ""
done
