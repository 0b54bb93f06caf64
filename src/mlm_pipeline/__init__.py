"""mlm-pipeline: raw text to masked-LM pretraining shards."""

__version__ = "0.1.0"
