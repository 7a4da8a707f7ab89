"""Evaluation: the paper's Table 1 metrics and the benchmark runner (paper §4.2; docs/evaluation.md).

- ``metrics``: CLIP-I, CLIP-T, CLIP-T^E, ACC-F / MAE-F (data pipeline's motion estimator), ACC-S / MAE-S,
  optional DreamSim; ``evaluate_turns`` computes every column from generated turns.
- ``benchmark_file``: the benchmark JSON format (games of rounds, ground-truth states, reference images).
- ``embedders`` / ``clip_backend``: CLIP from a local Hugging Face folder through ``models.clip.convert``, or a
  labelled stand-in.
- ``benchmark``: ``run_benchmark`` plays every game (the ``generate`` batch path) and writes
  ``report.md`` + ``report.json``; CLI ``python -m animegamer_jax.eval``.
"""
