"""animegamer_jax.eval (see the package docstring)."""
