"""The shot encoder E_a (T5 + CLIP features -> the MLLM's action representation).

- ``model.py``: :class:`ShotEncoder`.
- ``convert.py``: its key table (the release keeps E_a inside the SAT DiT checkpoint, so it is
  converted by ``python -m animegamer_jax.commands.convert release``, which calls this table).
"""
