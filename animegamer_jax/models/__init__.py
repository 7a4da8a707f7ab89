"""animegamer_jax.models (see the package docstring)."""
