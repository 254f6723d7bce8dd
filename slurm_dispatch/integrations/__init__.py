"""Framework integrations: the code that imports a training library lives here, and only here.

``slurm_dispatch.integrations.transformers`` (Hugging Face ``Trainer``) and
``slurm_dispatch.integrations.lightning`` (Lightning ``Trainer``) each give a ``DispatchCallback``
and a ``resume_from_checkpoint()`` helper; ``saves`` is what both share and imports no training
library.  Invariant: importing ``slurm_dispatch`` or running a ``dispatch`` command never
imports torch, transformers or lightning; only importing one of these submodules does.
"""
