#!/usr/bin/env bash
# Identifier-first disaster recovery against its baselines, as its paper
# measures it (§4), on this machine: two sites of a `causeway dev` pair, 5 ms
# apart (one way). Each mode gets a fresh pair:
#   identifier-first: --dr 0=1, a SET is acknowledged once site 1 has
#                     noted its key (protection time = the SET);
#   synchronous:      no --dr, SET + CW.WAIT SITE 1 (until site 1 has
#                     applied the value);
#   asynchronous:     no --dr, the SET alone (protects nothing).
# Then the consistency table (the paper's Figure 4): writers at site 0 at
# full speed, the link cut, a failover at site 1 with --dr, and the
# acknowledged keys read at site 1: complete, refused (-LOST) or lost.
# Usage: scripts/bench-dr.sh [samples per size] [disaster value size] [writers]
set -euo pipefail
cd "$(dirname "$0")/.."
samples=${1:-50}
size=${2:-102400}
writers=${3:-16}
cargo build --release -q -p causeway
B=./target/release/causeway
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; }
trap cleanup EXIT
pair() {
  $B dev --port 7380 --nodes 3 --partitions 16 --sites 2 --wan 0,1=5 --wan-jitter-ms 0 "$@" > target/bench-dr-dev.log 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    grep -q "Ctrl-C" target/bench-dr-dev.log && return
    sleep 0.2
  done
  echo "the pair did not start:"; cat target/bench-dr-dev.log; exit 1
}
stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=; }

if [ "${DISASTER_ONLY:-}" = "" ]; then
echo "== identifier-first (--dr 0=1)"
pair --dr 0=1
$B bench --protection --addr 127.0.0.1:7380 --samples "$samples"
stop
echo "== synchronous (SET + CW.WAIT SITE 1) and asynchronous (SET)"
pair
$B bench --protection --addr 127.0.0.1:7380 --samples "$samples" --wait-site 1
$B bench --protection --addr 127.0.0.1:7380 --samples "$samples"
stop
fi
echo "== consistency after the link is cut"
for mode in dr async; do
  if [ $mode = dr ]; then pair --dr 0=1; else pair; fi
  echo "-- $mode"
  $B bench --disaster 127.0.0.1:7390 --addr 127.0.0.1:7380 --clients "$writers" --duration 5 --value-size "$size"
  stop
done
