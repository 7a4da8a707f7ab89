"""animegamer_jax.diffusion (see the package docstring)."""
