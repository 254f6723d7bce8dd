"""The checkpoint protocol and its stores: what a save, a publication and an epoch are, and
the one place anything is removed.

Pure where it can be (:mod:`.model`: epochs, attempt tokens, publication names, parsed here and
only here); :mod:`.execdir` names what an execution folder holds; :mod:`.publish` is
``publish``/``latest``/``list`` for every caller; :mod:`.gc` is cleanup; :mod:`.stores` is a
folder or an ``s3://`` prefix behind one interface.  Runs wherever a root is read or written:
inside the job, on the login node, never as root.  Imports nothing here.
"""
