"""Evaluation: the paper's Table 1 metrics and the quality checks of a system (docs/evaluation.md)."""
