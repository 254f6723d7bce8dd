#!/bin/bash
# A toy trainer that follows the slurm-dispatch contract:
#   - it resumes from the latest *published* save ($DISPATCH_RESUME_FROM, or `dispatch latest`),
#   - it writes every save under its own $DISPATCH_EXEC_DIR,
#   - it makes each save visible with `dispatch publish` only once the save is complete.
# Knobs (environment): TOY_STEPS (default 30), TOY_SAVE_EVERY (5), TOY_INTERVAL seconds (0.2).
#SBATCH --job-name=toy-trainer
#SBATCH --ntasks=1
#SBATCH --time=00:30:00
set -euo pipefail

steps=${TOY_STEPS:-30}
save_every=${TOY_SAVE_EVERY:-5}
interval=${TOY_INTERVAL:-0.2}

resume=${DISPATCH_RESUME_FROM:-$(dispatch latest)}
step=0
if [ -n "$resume" ]; then
    step=$(cat "$resume/step")
    echo "[$DISPATCH_ATTEMPT] resuming at step $step from $resume"
else
    echo "[$DISPATCH_ATTEMPT] starting from scratch"
fi

while [ "$step" -lt "$steps" ]; do
    step=$((step + 1))
    sleep "$interval"                       # "training"
    if [ $((step % save_every)) -eq 0 ]; then
        save="$DISPATCH_EXEC_DIR/checkpoint-$step"
        mkdir -p "$save.partial"
        echo "$step" > "$save.partial/step"
        mv "$save.partial" "$save"          # complete before it is published
        dispatch publish --step "$step" "$save" >/dev/null
        echo "[$DISPATCH_ATTEMPT] epoch $DISPATCH_EPOCH saved and published step $step"
    fi
done
echo "[$DISPATCH_ATTEMPT] done at step $step"
