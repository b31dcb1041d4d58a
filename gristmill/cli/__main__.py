"""``python -m gristmill.cli COMMAND ...`` (what torchrun launches: ``torchrun ... -m gristmill.cli train JOB.yaml``)."""
import sys

from . import main

sys.exit(main())
