"""Supervised fine-tuning (``scripts/sft.py``): the config, the batches, the trainer and ``main``."""
