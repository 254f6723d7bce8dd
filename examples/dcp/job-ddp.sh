#!/bin/bash
# train.py, a torchtitan-style loop that saves with torch.distributed.checkpoint and knows
# nothing of dispatch, on two nodes, one rank per node (gloo on CPUs), published by
# `dispatch watch`.  Submit it from the folder holding train.py, on a file system every node
# sees:
#
#   dispatch-sbatch --checkpoint /scratch/$USER/dcp --resubmit 3 job-ddp.sh
#
# Watch runs on the first node and publishes each step-<N> folder once its .metadata is in
# place and names only shards that are there: DCP's coordinator writes .metadata last, after
# every rank (on either node) has written its shard.  Each execution resumes from the latest
# publication ($DISPATCH_RESUME_FROM), and picks its own port, so it never meets a rank left
# over on a node cut off from the controller.
#SBATCH --job-name=dcp-dispatch-ddp
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=60
set -euo pipefail
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(scontrol show node "$first" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
MASTER_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
export MASTER_ADDR MASTER_PORT
# Each rank's gloo listens on the interface holding its node's NodeAddr (gloo otherwise takes
# the address its host name resolves to, which may be a loopback only that node reaches).
exec dispatch watch --interval "${DCP_WATCH_INTERVAL:-1}" -- srun bash -c '
  addr=$(scontrol show node "$SLURMD_NODENAME" | grep -o "NodeAddr=[^ ]*" | cut -d= -f2)
  dev=$(ip -o -4 addr show 2>/dev/null | awk -v a="$addr/" "index(\$4, a) == 1 {print \$2; exit}")
  if [ -n "$dev" ]; then export GLOO_SOCKET_IFNAME=$dev; fi
  RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS exec python3 train.py'
