"""The launcher's permanent name: ``python -m slurm_dispatch.launch`` is written into every batch
script in users' records and run again on every requeue, so this path stays for ever.

The launcher itself is :mod:`slurm_dispatch.execution.launch`; run as ``-m`` this runs it, and
imported by this name it is that same module (one module object, so a patch through either
name patches both).
"""

import sys

if __name__ == "__main__":
    from slurm_dispatch.execution.launch import main

    main()
else:
    import importlib

    sys.modules[__name__] = importlib.import_module("slurm_dispatch.execution.launch")
