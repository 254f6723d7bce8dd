#!/bin/bash
# A Lightning job under slurm-dispatch.  Submit it from the folder holding train.py:
#
#   dispatch-sbatch --checkpoint /scratch/$USER/pl-run job.sh
#
# 90 s before the time limit Slurm sends SIGUSR1 to the training step; DispatchCallback saves at
# the end of the next batch, publishes the save and requeues the job, and the requeued execution
# resumes from that save.  (A --shared-checkpoint job, or one Slurm will not requeue, saves and
# publishes, then ends FAILED, so dispatch's rule for a failure applies: --resubmit, or a hold.)
#SBATCH --job-name=pl-dispatch
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --time=60
#SBATCH --signal=USR1@90
set -euo pipefail
srun python3 "${TRAIN_SCRIPT:-train.py}"
