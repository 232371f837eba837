"""Evaluation and training tasks as data: the unified row schema, synthetic families, real datasets.
Imports nothing: import the module you need.
"""
