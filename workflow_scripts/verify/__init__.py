"""Deciding whether a completion is right: verifier kinds, their rules, isolated workers, the sandboxed
code verdict, and the TRL reward adapter. Imports nothing: import the module you need.
"""
