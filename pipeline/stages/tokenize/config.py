"""This stage's section: ``SplitConfig`` lives at the pipeline level (split_config.py): decontamination reads it too."""
from ...split_config import SplitConfig  # noqa: F401
