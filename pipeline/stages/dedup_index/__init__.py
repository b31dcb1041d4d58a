"""The dedup_index stage: stage.py (no section of its own; its tasks are pipeline.dedup_index, the index format dedup_against reads too)."""
