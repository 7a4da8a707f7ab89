"""CLIP (vision tower for f_v, and the full model for evaluation).

- ``model.py``: :class:`CLIP`, :class:`CLIPVisionTransformer`, ``preprocess``.
- ``convert.py``: open_clip / HF key tables. Command line: ``python -m animegamer_jax.commands.convert clip``.
"""
