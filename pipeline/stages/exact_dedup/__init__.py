"""The exact_dedup stage: stage.py (orchestration), config.py (its job section), tasks.py (what its tasks run)."""
