"""Chains of stages (``scripts/pipeline.py``): the plan, the run, the report, ablations and
model merging.
"""
