#!/bin/bash
# The Hugging Face Trainer job of job.sh on two nodes, one process per node (DDP: gloo on CPUs,
# nccl on GPUs).  Submit it from the folder holding train.py, on a file system every node sees:
#
#   dispatch-sbatch --checkpoint /scratch/$USER/hf-ddp --resubmit 3 job-ddp.sh
#
# Each save is published once, by rank 0, after every rank has written its part of it (each
# rank's rng_state_<rank>.pth); DispatchCallback in train.py does that.  A requeued or
# resubmitted execution picks its own address and port, so it never meets a rank left over on
# a node cut off from the controller.
#SBATCH --job-name=hf-dispatch-ddp
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=60
set -euo pipefail
export HF_HUB_OFFLINE=1   # the model is built from a config: nothing to download
# Rank 0 listens on the first node of the allocation, where this script runs: at the address
# Slurm itself reaches that node by, on a port free there now.
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(scontrol show node "$first" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
MASTER_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
export MASTER_ADDR MASTER_PORT
# One rank per task; torch.distributed reads the rank and world size from the environment.
srun bash -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS \
  exec python3 "${TRAIN_SCRIPT:-train.py}"'
