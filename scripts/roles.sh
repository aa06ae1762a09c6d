#!/usr/bin/env bash
# How fast roles balance after a heal, on real processes: a 4-node
# `causeway dev` site (64 partitions) under a light load (a SET and an MGET
# every ~20 ms through a node that is never paused); one node is paused 3 s
# (SIGSTOP), then, 2 s after it resumed, the coordinator leader's node 3 s.
# Once a second it prints the epoch and every member's heads and tails
# (CW.CLUSTER STATUS of the reachable node with the newest configuration),
# for 30 s after the leader resumed. Fair share: 16 of 64; 1.25x: 20.
# Usage: scripts/roles.sh [binary] [first port]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-./target/release/causeway}
port=${2:-7800}
command -v redis-cli >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-tools; }
[ -x "$bin" ] || cargo build --release -q -p causeway
for i in 0 1 2 3; do
  if (exec 3<>/dev/tcp/127.0.0.1/$((port + i))) 2>/dev/null; then echo "port $((port + i)) is in use: stop what listens there first" >&2; exit 1; fi
done
out=target/roles
mkdir -p $out
setsid "$bin" dev --nodes 4 --port "$port" >"$out/dev.log" 2>&1 &
dev=$!
load=
stop() {
  [ -n "$load" ] && kill "$load" 2>/dev/null || true
  kill -CONT -- -"$dev" 2>/dev/null || true
  kill -- -"$dev" 2>/dev/null || true
}
trap stop EXIT
sleep 6

# The status of the reachable node with the newest configuration.
status() {
  local best="" newest=-1 s e
  for i in 0 1 2 3; do
    s=$(timeout 0.5 redis-cli -p $((port + i)) cw.cluster status 2>/dev/null | tr -d '\r') || continue
    e=$(sed -n 's/^epoch://p' <<<"$s")
    if [ -n "$e" ] && [ "$e" -gt "$newest" ]; then newest=$e; best=$s; fi
  done
  echo "$best"
}
# The pid of node i: the process listening on its port.
pid_of() { ss -ltnp | grep ":$((port + $1)) " | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -1; }
line() {
  local s nodes
  s=$(status)
  nodes=$(grep '^node[0-9]*:addr' <<<"$s" || true)
  printf '%-12s epoch=%-3s max_head=%-3s max_tail=%-3s | %s\n' "$1" "$(sed -n 's/^epoch://p' <<<"$s")" \
    "$(sed 's/.*head=\([0-9]*\).*/\1/' <<<"$nodes" | sort -n | tail -1)" \
    "$(sed 's/.*tail=\([0-9]*\).*/\1/' <<<"$nodes" | sort -n | tail -1)" \
    "$(sed 's/^node\([0-9]*\):addr=[^,]*,head=\([0-9]*\),middle=[0-9]*,tail=\([0-9]*\).*/n\1 h\2 t\3/' <<<"$nodes" | paste -sd' ')"
}

leader=$(status | sed -n 's/^coordinator_leader://p')
first=$(((leader + 1) % 4))
other=$(((leader + 2) % 4))
( i=0; while true; do
    i=$((i + 1))
    timeout 1 redis-cli -p $((port + other)) set "key$((i % 500))" "v$i" >/dev/null 2>&1 || true
    timeout 1 redis-cli -p $((port + other)) mget "key$((i % 37))" "key$((i % 91))" >/dev/null 2>&1 || true
    sleep 0.02
  done ) &
load=$!
echo "coordinator leader: node $leader; paused first: node $first; load through node $other"
line start
kill -STOP "$(pid_of $first)"
for i in 1 2 3; do sleep 1; line "pause1+${i}s"; done
kill -CONT "$(pid_of $first)"
for i in 1 2; do sleep 1; line "after1+${i}s"; done
lpid=$(pid_of "$leader")
kill -STOP "$lpid"
for i in 1 2 3; do sleep 1; line "pause2+${i}s"; done
kill -CONT "$lpid"
healed=$(date +%s.%N)
for _ in $(seq 0 30); do
  line "heal+$(printf %.1f "$(echo "$(date +%s.%N) - $healed" | bc)")s"
  sleep 1
done
echo "the coordinator's changes:"
grep -h "coordinator: epoch" "$out/dev.log" | sed 's/.*coordinator: /  /'
