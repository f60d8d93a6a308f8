"""The bottom layer: errors, configuration, progress, atomic file io and output-directory locks.

Everything here is stage-agnostic; every other layer may import it and it imports none of them.
"""
