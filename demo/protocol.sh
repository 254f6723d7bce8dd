#!/bin/bash
# The checkpoint protocol on this machine, without Slurm: two overlapping executions of one job.
# An old execution (epoch R=0) keeps saving at ever higher steps after its replacement (R=1)
# started; `dispatch latest` still picks the replacement's lineage.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
root=$(mktemp -d /tmp/dispatch-demo.XXXXXX)
export DISPATCH_CHECKPOINT=$root DISPATCH_GENERATION=0 DISPATCH_SUBMISSION=1

# $1 = restart count R, $2 = steps to train past the save it resumes from (however far the
# other execution got before this one started: on a loaded machine, a fixed last step could lie
# behind it, leaving nothing to do), rest = environment for the trainer
run_execution() {
    local r=$1 steps=$2; shift 2
    local attempt epoch resume start=0
    attempt=$(python3 -c 'from slurm_dispatch.checkpoint.model import new_attempt; print(new_attempt())')
    epoch=$(SLURM_RESTART_COUNT=$r dispatch epoch)
    resume=$(dispatch latest)
    [ -z "$resume" ] || start=$(cat "$resume/step")
    mkdir -p "$root/exec/$attempt"
    env "$@" TOY_STEPS=$((start + steps)) DISPATCH_ATTEMPT="$attempt" DISPATCH_EPOCH="$epoch" \
        DISPATCH_EXEC_DIR="$root/exec/$attempt" DISPATCH_RESUME_FROM="$resume" \
        "$here/examples/toy-trainer.sh"
}

echo "== checkpoint root: $root"
echo "== execution 1 (R=0) starts; Slurm will 'lose' it after a few saves, but it keeps running"
run_execution 0 60 TOY_INTERVAL=0.05 &
old=$!
published_twice() { [ "$(dispatch list -H | wc -l)" -ge 2 ]; }
until published_twice; do  # a condition polled, and the end of the one that would meet it
    kill -0 "$old" 2>/dev/null || published_twice ||
        { echo "demo: the first execution ended before it published twice" >&2; exit 1; }
    sleep 0.1
done
echo "== execution 2 (R=1) replaces it and resumes from the latest publication"
run_execution 1 10 TOY_INTERVAL=0.1
wait "$old"
echo
echo "== every publication (oldest first); the old run saved up to step 60 at the lower epoch:"
dispatch list
echo
echo "== dispatch latest picks the replacement's lineage, whatever step the old run reached:"
dispatch latest --json
latest_epoch=$(dispatch latest --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["epoch"])')
[ "$latest_epoch" = "$(SLURM_RESTART_COUNT=1 dispatch epoch)" ] || { echo "demo: wrong lineage" >&2; exit 1; }
echo "== ok: the overlap was harmless"
