#!/bin/bash
# A toy trainer that leaves publishing to `dispatch watch` (for one process writing its saves):
#   - the job runs the trainer under `dispatch watch`, which publishes each complete save of
#     $DISPATCH_EXEC_DIR once, in step order, forwards Slurm's signals to the trainer and scans a
#     last time when it exits; it exits with the trainer's status, or non-zero when it could not
#     publish, so either way a failure is the job's failure and dispatch's recovery rules apply;
#   - the trainer resumes from the latest published save: `dispatch fetch` prints it as a local
#     folder (on a folder root $DISPATCH_RESUME_FROM itself; on an s3:// root a checked copy
#     fetched into the staging folder), or nothing for a fresh start;
#   - it writes each save under $DISPATCH_LOCAL_DIR, a local folder of the execution's own (on a
#     folder root its $DISPATCH_EXEC_DIR; on an s3:// root the staging folder, whose saves watch
#     uploads under $DISPATCH_EXEC_DIR, the execution's prefix, before publishing them), as
#     Hugging Face Trainer does (checkpoint-<step>/, weights first, trainer_state.json last),
#     and never deletes one (no rotation: a replacement may be resuming from it).
# The same script runs on either kind of root.
# Knobs (environment): TOY_STEPS (default 30), TOY_SAVE_EVERY (5), TOY_INTERVAL seconds (0.2),
# TOY_WATCH_INTERVAL seconds between watch's scans (1).
#SBATCH --job-name=watch-trainer
#SBATCH --ntasks=1
#SBATCH --time=00:30:00
set -euo pipefail

if [ "${1:-}" != "--train" ]; then
    exec dispatch watch --interval "${TOY_WATCH_INTERVAL:-1}" -- "$0" --train "$@"
fi
shift

steps=${TOY_STEPS:-30}
save_every=${TOY_SAVE_EVERY:-5}
interval=${TOY_INTERVAL:-0.2}

resume=$(dispatch fetch)
step=0
if [ -n "$resume" ]; then
    step=$(cat "$resume/weights")
    echo "[$DISPATCH_ATTEMPT] resuming at step $step from $resume"
else
    echo "[$DISPATCH_ATTEMPT] starting from scratch"
fi

while [ "$step" -lt "$steps" ]; do
    step=$((step + 1))
    sleep "$interval"                                   # "training"
    if [ $((step % save_every)) -eq 0 ]; then
        save="$DISPATCH_LOCAL_DIR/checkpoint-$step"
        mkdir "$save"
        echo "$step" > "$save/weights"
        echo "{\"global_step\": $step}" > "$save/trainer_state.json"   # written last
        echo "[$DISPATCH_ATTEMPT] epoch $DISPATCH_EPOCH saved step $step"
    fi
done
echo "[$DISPATCH_ATTEMPT] done at step $step"
