"""``python -m gristmill.trainer JOB.yaml`` / ``torchrun --nproc_per_node N -m gristmill.trainer JOB.yaml``."""
import sys

from .train import main

sys.exit(main())
