"""``slurm_dispatch.integrations.saves`` is :mod:`slurm_dispatch.execution.saves`:
the framework-neutral save rules the callbacks share.

They moved to the in-job side, where ``dispatch watch`` and ``dispatch fetch`` use them too; the
integrations' paths are public, so this name stays: imported by it, it is that same module
(one module object, so a patch through either name patches both).
"""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("slurm_dispatch.execution.saves")
