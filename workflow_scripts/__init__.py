"""rlvr-precision: the stage modules behind the Snakemake workflow.

Each stage module exposes plain, tested functions and a thin ``main(argv)`` CLI, so a stage runs
the same from a Snakemake rule, from the command line and from a unit test.
"""
