"""gristmill: the data path from raw corpora to GPU trainers, and back to "what did this model see?"."""
__version__ = "0.1.0"
