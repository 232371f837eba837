"""Models and sampling: construction and loading, batched generation, the vLLM backend, dtype tables.
Imports nothing: import the module you need.
"""
