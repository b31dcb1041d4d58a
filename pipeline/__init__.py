"""Corpus preparation: raw corpora to a published, content-hashed token dataset, as resumable
tasks over a work dir (plain Ray tasks on a laptop or a cluster). ``executor.prepare(job)`` runs
it; ``stages/`` holds one module per stage; ``workdir`` owns the run dir's layout."""
