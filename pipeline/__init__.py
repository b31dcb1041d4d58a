"""Corpus preparation: Ray Data jobs from raw corpora to a published, content-hashed dataset."""
