"""Experiments, not product: the probes behind the kernels' design decisions (lab/README.md).

Run from the repository root as ``python -m lab.<probe> --help``.
"""
