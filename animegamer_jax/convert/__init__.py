"""animegamer_jax.convert (see the package docstring)."""
