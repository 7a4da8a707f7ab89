"""Deprecated alias of animegamer_jax.web (removed next release).

``python -m animegamer_jax.serve`` and the ``animegamer-serve`` console script run
``python -m animegamer_jax.web``.
"""

from animegamer_jax.web.__main__ import cli, define_flags, main  # noqa: F401
from animegamer_jax.web.app import HttpThread  # noqa: F401
from animegamer_jax.web.server import build_server  # noqa: F401

if __name__ == "__main__":
    cli()
