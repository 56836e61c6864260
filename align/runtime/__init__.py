"""How a stage runs on the machine at hand: processes and ranks, checkpoints and resume, the
non-finite guard, memory and device setup, and the preflight checks.
"""
