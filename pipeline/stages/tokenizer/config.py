"""This stage's section: ``TokenizerConfig`` lives at the pipeline level (tokenizer_config.py): tokenize and pack read it too."""
from ...tokenizer_config import TokenizerConfig  # noqa: F401
