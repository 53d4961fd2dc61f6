"""The tools that check the README's and docs' performance and quality claims (benchmarks/README.md).

Run from the repository root as ``python -m benchmarks.<tool> --help``; shared helpers are in
:mod:`benchmarks.common`.
"""
