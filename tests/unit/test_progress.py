"""checkpoint/progress: a resumed execution whose steps went backwards, and save indices."""

from __future__ import annotations

from slurm_dispatch.checkpoint import progress


def test_torchtitans_model_only_resume_is_named_with_its_option() -> None:
    said = progress.went_backwards(
        "/ck/exec/a/checkpoint/step-8",
        8,
        [("/ck/exec/b/checkpoint/step-2", 2), ("/ck/exec/b/checkpoint/step-4", 4)],
    )
    assert said is not None
    assert said.startswith("step 2 (/ck/exec/b/checkpoint/step-2) is at or below step 8")
    assert "--checkpoint.no-initial-load-model-only" in said


def test_steps_that_went_on_or_save_indices_are_not_compared() -> None:
    assert progress.went_backwards("/ck/a/step-8", 8, [("/ck/b/step-9", 9)]) is None
    assert progress.went_backwards("/ck/a/step-8", None, [("/ck/b/step-1", 1)]) is None
    assert (
        progress.went_backwards(
            "/ck/a/checkpoints/checkpoint_3", 3, [("/ck/b/checkpoints/checkpoint_0", 0)]
        )
        is None
    )
    assert (
        progress.went_backwards("/ck/a/step-8", 8, [("/ck/b/checkpoints/checkpoint_0", 0)]) is None
    )
    assert not progress.step_known("s3://b/p/exec/x/checkpoints/checkpoint_2/")
    assert progress.step_known("/ck/b/checkpoint-2")
    assert progress.index_note("/ck/b/checkpoint-2") is None
