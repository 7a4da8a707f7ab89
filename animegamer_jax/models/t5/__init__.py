"""The T5 v1.1 encoder (the DiT's text states).

- ``model.py``: :class:`T5Encoder`.
- ``convert.py``: HF / SAT key table. Command line: ``python -m animegamer_jax.commands.convert t5``.
"""
