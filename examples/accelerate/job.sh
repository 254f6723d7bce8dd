#!/bin/bash
# A custom accelerate loop (train.py, which knows nothing of dispatch) under slurm-dispatch.
# Submit it from the folder holding train.py:
#
#   dispatch-sbatch --checkpoint /scratch/$USER/acc-run --resubmit 3 job.sh
#
# accelerate's automatic naming saves into <project_dir>/checkpoints/checkpoint_<i>/, where
# dispatch watch finds it with no option and publishes each save once its RNG states are
# written and nothing in it changes.  Leave total_limit unset (accelerate's rotation deletes
# saves a replacement may be loading; dispatch watch --keep K instead).  The save index i
# counts from 0 again in every execution: train.py keeps its step in the save itself.
# accelerate writes the objects registered for checkpointing (custom_checkpoint_<k>.pkl)
# after the RNG states: watch waits for as many as the saves before it hold; for the job's
# very first save, name the last one: dispatch watch --ready custom_checkpoint_1.pkl.
#SBATCH --job-name=accelerate-dispatch
#SBATCH --time=60
set -euo pipefail
exec dispatch watch -- python3 train.py --project_dir "$DISPATCH_EXEC_DIR" \
    ${DISPATCH_RESUME_FROM:+--resume_from_checkpoint "$DISPATCH_RESUME_FROM"}
