#!/bin/bash
# A Hugging Face Trainer job under slurm-dispatch.  Submit it from the folder holding train.py:
#
#   dispatch-sbatch --checkpoint /scratch/$USER/hf-run --resubmit 3 job.sh
#
# Every execution (a requeue, a resubmission) gets its own folder ($DISPATCH_EXEC_DIR) and
# resumes from the latest published save; DispatchCallback in train.py does the rest.
#
# Save before the limit: `dispatch-sbatch --warn-before 5:00 ...` has Slurm signal this script
# (USR1) five minutes before the time limit; `exec srun` makes srun the script, and srun hands
# the signal to the trainer.  DispatchCallback then saves at the end of the current step,
# publishes the save and requeues the job; the requeued execution resumes from that save.
#SBATCH --job-name=hf-dispatch
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --time=60
set -euo pipefail
export HF_HUB_OFFLINE=1   # the model is built from a config: nothing to download
exec srun python3 "${TRAIN_SCRIPT:-train.py}"
