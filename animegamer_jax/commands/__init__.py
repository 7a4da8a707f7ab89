"""The commands, one module each (``python -m animegamer_jax.commands.<name>``): flags, printing, the top layer."""
