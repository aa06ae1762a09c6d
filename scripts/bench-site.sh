#!/usr/bin/env bash
# The site-level measurements of BENCHMARKS.md (release build, loopback):
#  1. write unavailability and read throughput when a node dies, killing the
#     hot key's head (inside the first k of its chain) and then its tail
#     (beyond k), during a 50/50 read/update run on that key;
#  2. causal vs linearizable vs eventual on workloads A, B, C;
#  3. time to add a node to a site holding N keys, with a workload running.
# Usage: scripts/bench-site.sh [seconds per run] [clients] [keys for the join]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-8}
clients=${2:-16}
keys=${3:-100000}
command -v redis-cli >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-tools; }
cargo build --release -q -p causeway
B=./target/release/causeway
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; pkill -f "causeway node --id . --listen 127.0.0.1:79" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT
node_pid() { pgrep -f "causeway node --id $1 --listen 127.0.0.1:$2" | head -1; }

echo "== 1. a node dies during writes to one hot key (4 nodes, R=3, k=2), causal and linearizable"
for run in head:causal tail:causal head:linearizable tail:linearizable; do
  victim=${run%%:*}; level=${run##*:}
  $B dev --port 7900 --nodes 4 >/dev/null 2>&1 & pids+=($!)
  sleep 2
  ids=($(redis-cli -p 7900 --no-raw cw.chain causeway-bench-hot-key | grep -oE '\(integer\) [0-9]+' | awk '{print $2}' | tail -n +2))
  if [ "$victim" = head ]; then id=${ids[0]}; else id=${ids[-1]}; fi
  port=$((7900 + id))
  (sleep 4; kill -9 "$(node_pid "$id" "$port")"; echo "killed node $id, the hot key's $victim ($level)") &
  # Clients connect through a node that survives.
  via=$(( (id + 1) % 4 ))
  $B bench --target causeway --addr 127.0.0.1:$((7900 + via)) --hot-key --workload a --clients $clients --duration $((secs + 6)) \
    --consistency "$level" --label "kill-$victim-$level" --json "target/bench-kill-$victim-$level.json"
  kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; pids=()
  sleep 1
done

echo "== 2. consistency levels (3 nodes, R=3, k=2, native client)"
$B dev --port 7920 >/dev/null 2>&1 & pids+=($!)
sleep 2
$B bench --target causeway --addr 127.0.0.1:7920 --workload a --clients 4 --duration 2 --label warmup >/dev/null
for w in a b c; do
  for level in causal linearizable eventual; do
    $B bench --target causeway --addr 127.0.0.1:7920 --workload $w --no-load --clients $clients --duration $secs \
      --consistency $level --label "$level" --json target/bench-level-$w-$level.json | head -n 8
  done
done
kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; pids=()
sleep 1

echo "== 3. adding a node to a site holding $keys keys of 1 KiB, under a workload"
$B dev --port 7940 >/dev/null 2>&1 & pids+=($!)
sleep 2
$B bench --target resp --addr 127.0.0.1:7940 --workload c --records $keys --clients 16 --duration 1 --label load >/dev/null
$B node --id 3 --listen 127.0.0.1:7943 --join --nodes 0=127.0.0.1:7940,1=127.0.0.1:7941,2=127.0.0.1:7942,3=127.0.0.1:7943 \
  --replicas 3 --k 2 >/dev/null 2>&1 & pids+=($!)
sleep 1
$B bench --target resp --addr 127.0.0.1:7940 --workload a --no-load --records $keys --clients 8 --duration 20 --label during-join \
  > target/bench-join-workload.txt &
bench=$!
start=$(date +%s%N)
$B cluster --addr 127.0.0.1:7940 add 3 127.0.0.1:7943
until redis-cli -p 7943 cw.cluster status | grep -q 'node3:.*tail=[1-9]' && \
      redis-cli -p 7943 cw.cluster status | grep -q 'joining_replicas_here:0' && \
      redis-cli -p 7943 cw.cluster status | grep -q 'short_chains:0'; do sleep 0.05; done
end=$(date +%s%N)
ms=$(( (end - start) / 1000000 ))
parts=$(redis-cli -p 7943 cw.cluster status | grep -oE 'node3:[^ ]*' | tr -d '\r')
echo "join finished in $ms ms ($parts of 64 partitions); about $((keys * 1024 / 1048576)) MiB in the site"
wait $bench
cat target/bench-join-workload.txt
