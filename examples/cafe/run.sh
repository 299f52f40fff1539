#!/usr/bin/env bash
# Runs the cafe example with no cluster: four `gatehouse echo` backends on 127.0.0.1:9001-9004
# and `gatehouse run -f examples/cafe` serving cafe.example.com on :8080.
#
#   cargo build --release && examples/cafe/run.sh
#   GATEHOUSE=target/debug/gatehouse examples/cafe/run.sh
#
# Ctrl-C (or SIGTERM to this script) stops the gateway and the backends.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
gatehouse="${GATEHOUSE:-$root/target/release/gatehouse}"
if [[ ! -x "$gatehouse" ]]; then
    echo "run.sh: $gatehouse not found: run 'cargo build --release' or set GATEHOUSE" >&2
    exit 1
fi

pids=()
cleanup() {
    trap - EXIT INT TERM
    if ((${#pids[@]})); then
        kill "${pids[@]}" 2>/dev/null || true
        wait "${pids[@]}" 2>/dev/null || true
    fi
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM

port=9001
for svc in coffee-v1 coffee-v2 tea tea-post; do
    "$gatehouse" echo --listen "127.0.0.1:$port" --name "$svc" &
    pids+=("$!")
    port=$((port + 1))
done

# Not `exec`: the shell stays to stop the backends when the gateway exits. It waits in
# the background-job `wait` so that signals reach the trap at once.
"$gatehouse" run -f "$here" &
gateway=$!
pids+=("$gateway")
status=0
wait "$gateway" || status=$?
exit "$status"
