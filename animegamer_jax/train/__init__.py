"""animegamer_jax.train (see the package docstring)."""
