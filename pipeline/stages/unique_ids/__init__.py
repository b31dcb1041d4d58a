"""The unique_ids stage: stage.py and tasks.py (no section of its own: on when an input has an id_field)."""
