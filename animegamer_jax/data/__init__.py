"""animegamer_jax.data (see the package docstring)."""
