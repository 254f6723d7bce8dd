#!/bin/bash
# A Hugging Face Trainer job under slurm-dispatch.  Submit it from the folder holding train.py:
#
#   dispatch-sbatch --checkpoint /scratch/$USER/hf-run --resubmit 3 job.sh
#
# Every execution (a requeue, a resubmission) gets its own folder ($DISPATCH_EXEC_DIR) and
# resumes from the latest published save; DispatchCallback in train.py does the rest.
#SBATCH --job-name=hf-dispatch
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --time=60
set -euo pipefail
export HF_HUB_OFFLINE=1   # the model is built from a config: nothing to download
srun python3 "${TRAIN_SCRIPT:-train.py}"
