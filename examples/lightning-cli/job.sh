#!/bin/bash
# Lightning's LightningCLI example (main.py) under slurm-dispatch, with nothing changed in it:
#
#   dispatch-sbatch --checkpoint /scratch/$USER/cli-run --resubmit 3 job.sh
#
# dispatch watch publishes Lightning's saves where it writes them by default
# ($DISPATCH_EXEC_DIR/lightning_logs/version_0/checkpoints/epoch=E-step=S.ckpt): keep every
# save (save_top_k -1: Lightning's default keeps one and deletes the rest, which a replacement
# may be loading), and save every SAVE_EVERY steps, not only at an epoch's end.
# ${DISPATCH_RESUME_FROM:-null}: a fresh start has no save to resume from, and LightningCLI
# takes null for none (an empty --ckpt_path fails).
#SBATCH --job-name=pl-cli-dispatch
#SBATCH --time=60
set -euo pipefail
exec dispatch watch -- python3 "${MAIN_SCRIPT:-main.py}" fit \
    --trainer.default_root_dir "$DISPATCH_EXEC_DIR" \
    --trainer.max_steps "${TRAIN_STEPS:-2000}" \
    --trainer.callbacks+=ModelCheckpoint \
    --trainer.callbacks.every_n_train_steps "${SAVE_EVERY:-100}" \
    --trainer.callbacks.save_top_k -1 \
    --ckpt_path "${DISPATCH_RESUME_FROM:-null}"
