"""Evaluation: the paper's Table 1 metrics and the quality evaluations of a system (paper §4.2;
docs/evaluation.md). Speed benchmarks are elsewhere (``benchmarks/``).

- ``metrics``: CLIP-I, CLIP-T, CLIP-T^E, ACC-F / MAE-F (data pipeline's motion estimator), ACC-S / MAE-S,
  optional DreamSim; ``evaluate_turns`` computes every column from generated turns.
- ``table1_games``: the benchmark JSON format (games of rounds, ground-truth states, reference images).
- ``clip_backend`` / ``embedders``: CLIP from a local Hugging Face folder through ``models.clip.convert``, or a
  labelled stand-in.
- ``table1``: ``run_benchmark`` plays every game on a given engine (the ``generate`` batch path) and writes
  ``report.md`` + ``report.json``.
- ``vae``, ``decoder``, ``representation``, ``identity``: reconstruction PSNR of the VAE, decoder PSNR of
  D_a's samples, where play's predicted s_a land among the training clips', identity accuracy on the toy world.
The commands, ``python -m animegamer_jax.commands.eval [table1|identity|representation|decoder|vae]``, are
animegamer_jax/commands/eval.py (flags, printing, building systems and engines, saving games: no module here imports
game/).
"""
