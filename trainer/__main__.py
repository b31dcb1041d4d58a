"""``python -m gristmill.trainer JOB.yaml`` / ``torchrun --nproc_per_node N -m gristmill.trainer JOB.yaml``:
a launcher for the ``gristmill train`` command (Python's ``-m`` needs it inside the package). It is
the part's only file that reaches the application layer, and it is never imported."""
import sys

from gristmill.cli.train import main

sys.exit(main())
