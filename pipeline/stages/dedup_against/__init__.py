"""The dedup_against stage: stage.py (orchestration), config.py (its job section), tasks.py (what its tasks run)."""
