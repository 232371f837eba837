"""The analysis figures: their list, shared data and helpers, variance and sparsity plots. Imports nothing:
import the module you need.
"""
