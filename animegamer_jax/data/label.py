"""Deprecated alias of animegamer_jax.data.caption, the captioning command (removed next release).

``python -m animegamer_jax.data.label`` runs ``python -m animegamer_jax.data.caption``.
"""
from animegamer_jax.data.caption import *  # noqa: F401,F403
from animegamer_jax.data.caption import cli, main  # noqa: F401

if __name__ == "__main__":
    cli()
