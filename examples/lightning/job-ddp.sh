#!/bin/bash
# The Lightning job of job.sh on two nodes, one process per node (DDP: gloo on CPUs, nccl on
# GPUs).  Submit it from the folder holding train.py, on a file system every node sees:
#
#   dispatch-sbatch --checkpoint /scratch/$USER/pl-ddp job-ddp.sh
#
# Lightning takes each rank from srun (SLURM_PROCID, SLURM_NTASKS); train.py asks for as many
# nodes as the job has.  Each save is published once, by rank 0, after every rank is past it.
# A requeued execution picks its own address and port, so it never meets a rank left over on
# a node cut off from the controller.
#SBATCH --job-name=pl-dispatch-ddp
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=60
#SBATCH --signal=USR1@90
set -euo pipefail
# Rank 0 listens on the first node of the allocation, where this script runs: at the address
# Slurm itself reaches that node by, on a port free there now.
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(scontrol show node "$first" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
MASTER_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
export MASTER_ADDR MASTER_PORT
srun python3 "${TRAIN_SCRIPT:-train.py}"
