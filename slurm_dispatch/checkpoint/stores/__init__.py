"""Publication stores behind one interface (:mod:`.base`): a folder (:mod:`.posix`) or an
``s3://bucket/prefix`` (:mod:`.s3`, boto3 imported only then); :mod:`.open` turns a root into
one; :mod:`.transfer` moves saves between local disk and S3.  Imports nothing here.
"""
