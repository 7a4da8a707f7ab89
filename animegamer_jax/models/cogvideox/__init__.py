"""The CogVideoX family: the video decoder's DiT and the 3-D causal VAE.

- ``dit.py``: :class:`CogVideoXDiT` (``DiTBlock`` modules under ``nnx.scan``, flow embedding, LoRA).
- ``dit_convert.py``: SAT / diffusers DiT key tables and the old-block-layout migration.
- ``vae.py``: :class:`CogVideoXVAE` (encoder, decoder, posterior, encode / decode of scaled latents).
- ``vae_tiling.py``: time-chunk plans, spatial tiling and the decode's device-memory budget.
- ``vae_convert.py``: SAT ``3d-vae.pt`` / diffusers VAE key table.

Command line: ``python -m animegamer_jax.commands.convert {dit,vae}`` (``animegamer_jax/convert/``).
"""
