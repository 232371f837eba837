"""The statistics of the verdicts: the seed-variance model, classical tests, power, decision rules,
simulated tables with known truth, the noise floor, and report.md's tables. Imports nothing: import the
module you need.
"""
