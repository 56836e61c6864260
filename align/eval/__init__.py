"""Evaluation: the suite (``scripts/evaluate.py``), what counts as correct, the statistics every
verdict uses (Wilson intervals, the paired McNemar test), generation for scoring, multiple
choice, paired comparison of two evaluations and the lighteval hand-off.
"""
