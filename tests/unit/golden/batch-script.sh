#!/bin/bash
# a comment
#SBATCH --job-name="my job" -N 2
#SBATCH --time=10  # a trailing comment
#DISPATCH --checkpoint /ck --resubmit 2

#SBATCH --parsable
# slurm-dispatch: give this execution its identity, then run the script.
exec /opt/venv/bin/python3 -m slurm_dispatch.launch --job '/home/u/.local/state/slurm-dispatch/jobs/dabc'"'"'x y' --submission 3 -- "$@"
