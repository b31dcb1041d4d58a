"""The audit: from a checkpoint alone plus the manifest it names, what a model was trained on.

The loader's order is a pure function of (manifest, seed, order, global index) and the
checkpoint records all of them, so the answer is exact: the same function the loader ran.
"""
from gristmill.trainer.errors import CheckpointError

from .checkpoint import AuditError, Checkpoint, open_manifest, read_checkpoint
from .consumed import Consumed, consumed, parse_steps
from .doc import audit_doc
from .leak import LeakReport, audit_leak
from .seen import SeenReport, audit_seen

__all__ = ["AuditError", "Checkpoint", "CheckpointError", "Consumed", "LeakReport", "SeenReport", "audit_doc",
           "audit_leak", "audit_seen", "consumed", "open_manifest", "parse_steps", "read_checkpoint"]
