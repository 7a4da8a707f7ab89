"""animegamer_jax.game (see the package docstring)."""
