"""GRPO with verifiable rewards (``scripts/grpo.py``): the config, the trainer, the loss, and the
pieces it is built from. Start at ``trainer.py`` (how a step runs) and ``loss.py`` (what is
optimised).
"""
