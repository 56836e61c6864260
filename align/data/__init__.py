"""Datasets for every stage: loading (local files, hub ids, `builtin:NAME` sources, mixtures),
hub-shaped repositories, the builtin sources, and chat templates with assistant masks.
"""
