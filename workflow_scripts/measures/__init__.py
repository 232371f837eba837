"""What a run is measured by: pass@k, KL to the base, representable updates, the sparsity kernel,
checkpoint reading, and the readers of the upstream outputs that aggregate joins. Imports nothing:
import the module you need.
"""
