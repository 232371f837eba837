"""How a stage runs inside the workflow: the rule calling convention, config checks, paths, code hashes,
resources, GPU slots, threads, start-up, atomic writes, numerics provenance. Imports nothing: import the
module you need.
"""
