"""Preference optimisation (``scripts/dpo.py``, ``kto.py``, ``orpo.py``): DPO with every TRL
loss (APO included), KTO and ORPO; pair data, held-out preference accuracy, rounds.
"""
