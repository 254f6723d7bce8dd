#!/bin/bash
# The seed's scenario on a real Slurm cluster (the sandbox: slurmctld and three slurmd on this
# machine).  A toy trainer is submitted with dispatch-sbatch; its node is cut off mid-run; Slurm
# requeues the job onto another node while the cut-off execution keeps saving; the replacement
# resumes from the latest publication of its own lineage and its saves outrank the old run's.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "starting the sandbox cluster (installs Debian's slurm-wlm and munge if missing)"
"$here/bin/dispatch-sandbox" up
eval "$("$here/bin/dispatch-sandbox" env)"
user=$DISPATCH_SANDBOX_USER
sinfo -N

work=$(runuser -u "$user" -- mktemp -d "/home/$user/demo.XXXXXX")
cp "$here/examples/toy-trainer.sh" "$work/trainer.sh"
chown "$user" "$work/trainer.sh"
as_user() { runuser -u "$user" -- env -C "$work" SLURM_CONF="$SLURM_CONF" PATH="$PATH" "$@"; }
json_field() { python3 -c "import json,sys; d=json.load(sys.stdin); print(eval(sys.argv[1]))" "$1"; }
status_json() { as_user dispatch status --json "$job"; }
wait_until() {  # wait_until SECONDS DESCRIPTION COMMAND...: poll a condition, never guess
    local deadline=$((SECONDS + $1)) what=$2; shift 2
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || { echo "demo: timed out waiting for $what" >&2; exit 1; }
        sleep 1
    done
}
executions_at_least() { [ "$(status_json | json_field 'len(d["executions"])')" -ge "$1" ]; }
saves_in() { ls "$1" 2>/dev/null | grep -c '^checkpoint-[0-9]*$'; }
has_saves() { [ "$(saves_in "$1")" -ge "$2" ]; }

say "submitting the trainer as $user:  dispatch-sbatch --checkpoint ck trainer.sh"
out=$(as_user env TOY_STEPS=100000 TOY_INTERVAL=0.2 TOY_SAVE_EVERY=5 \
      dispatch-sbatch --checkpoint ck -o 'trainer-%j.out' trainer.sh)
echo "$out"
job=$(echo "$out" | sed -n 's/^Dispatch job \([a-z0-9]*\).*/\1/p')
slurm_id=$(echo "$out" | sed -n 's/^Submitted batch job \([0-9]*\)/\1/p')

wait_until 60 "the first execution to start" executions_at_least 1
old_dir=$(status_json | json_field 'd["executions"][0]["exec_dir"]')
node=$(status_json | json_field 'd["executions"][0]["node"]')
wait_until 60 "the first saves" has_saves "$old_dir" 2
echo "execution 1 runs on $node and writes only into $old_dir"

say "cutting $node off the network (nothing it sends gets through; the job keeps running there)"
"$here/bin/dispatch-sandbox" partition "$node"
trap '"$here/bin/dispatch-sandbox" heal "$node" >/dev/null 2>&1 || true; scancel "$slurm_id" 2>/dev/null || true' EXIT
echo "waiting for Slurm to declare $node down and requeue the job (about 25 s)..."
wait_until 180 "the requeued execution" executions_at_least 2
new_dir=$(status_json | json_field 'd["executions"][1]["exec_dir"]')
new_node=$(status_json | json_field 'd["executions"][1]["node"]')
echo "execution 2 (restart count 1) started on $new_node, resuming from:"
status_json | json_field 'd["executions"][1]["resume_from"] or "(nothing yet)"'

old_count=$(saves_in "$old_dir")
wait_until 60 "the replacement's saves" has_saves "$new_dir" 2
wait_until 60 "the cut-off execution to save again" has_saves "$old_dir" $((old_count + 1))
say "both executions are writing, each into its own folder"
echo "old ($node, epoch 1000000): $(ls "$old_dir" | grep -c '^checkpoint-[0-9]*$') saves, last $(ls -v "$old_dir" | tail -1)"
echo "new ($new_node, epoch 1000001): $(ls "$new_dir" | grep -c '^checkpoint-[0-9]*$') saves, last $(ls -v "$new_dir" | tail -1)"

say "dispatch list (oldest first): the old run's late saves carry the lower epoch"
as_user dispatch list --root ck | tail -n 8
say "dispatch latest picks the replacement's lineage, whatever step the old run reached"
latest=$(as_user dispatch latest --root ck)
echo "$latest"
case "$latest" in "$new_dir"/*) ;; *) echo "demo: latest is not the replacement's" >&2; exit 1;; esac

say "dispatch status $job"
as_user dispatch status "$job"

say "dispatch-cease $slurm_id --restart 0: are the cut-off execution's processes gone?"
as_user dispatch-cease "$slurm_id" --restart 0 || echo "(exit $?: not proven, the node is still cut off)"

say "healing $node: slurmd rejoins, kills the orphaned execution and runs its Epilog"
"$here/bin/dispatch-sandbox" heal "$node"
ceased() { as_user dispatch-cease "$slurm_id" --restart 0 >/dev/null; }
wait_until 60 "the node's post-kill record" ceased
as_user dispatch-cease "$slurm_id" --restart 0
scancel "$slurm_id"
trap - EXIT
job_ended() { case "$(squeue -h -j "$slurm_id" -o %T 2>/dev/null)" in ""|CANCELLED) return 0;; esac; return 1; }
wait_until 30 "the job's end" job_ended
say "dispatch status $job, with each execution's end and cessation evidence"
as_user dispatch status "$job"
say "done: the overlap was harmless (files in $work)"
