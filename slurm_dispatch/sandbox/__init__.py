"""The sandbox: a real multi-node Slurm cluster on one machine, for the demo and the real
tests (:mod:`.cluster`), and another Slurm release in a debootstrapped root (:mod:`.root`).
Never imported by the installed tool's other sides.  Imports nothing here.
"""
