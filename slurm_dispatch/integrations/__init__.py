"""Framework integrations: the code that imports a training library lives here, and only here.

``slurm_dispatch.integrations.transformers`` (Hugging Face ``Trainer``) and
``slurm_dispatch.integrations.lightning`` (Lightning ``Trainer``) each give a ``DispatchCallback``
and a ``resume_from_checkpoint()`` helper; what both share, and ``dispatch watch`` and ``dispatch
fetch`` too, is the in-job side's (:mod:`slurm_dispatch.execution.saves`, ``.s3saves``), which
imports no training library (``integrations.saves`` and ``.s3saves`` name those same modules, as
the paths under ``integrations`` are public).  Invariant: importing ``slurm_dispatch`` or running
a ``dispatch`` command never imports torch, transformers or lightning; only importing one of
these submodules does.
"""
