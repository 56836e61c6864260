"""Models: loading (hub id, local directory, `builtin:NAME`), the LM head on the tokens a loss
needs, and the attention kernels (per document in packed rows; fp32 inside CPU autocast).
"""
