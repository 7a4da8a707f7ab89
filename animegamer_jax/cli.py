"""What every command-line entry point shares: absl start-up, config paths, quiet logs.

:func:`run` is what ``python -m animegamer_jax.<command>`` and the console scripts
(``animegamer-train`` ...; pyproject.toml) call instead of ``absl.app.run``:

- ``--config=configs/tiny.py`` works from any directory: a config path that does not exist from
  the working directory is looked up in the checkout / editable install (``paths.resource``), so
  the README's commands and ``configs/...`` in scripts keep working after ``cd``.
- Quiet by default: absl's own INFO lines and the INFO chatter of orbax, grain, jax and
  tensorstore (hundreds of lines per checkpoint) are hidden; the command's results and progress
  are printed. ``--verbosity=0`` (or ``-v 0``) brings every INFO line back, ``--verbosity=-1`` is
  the default.
"""

from __future__ import annotations

import logging as std_logging
import os
import sys
from collections.abc import Callable, Sequence

#: loggers (std logging names) that are set to WARNING unless --verbosity >= 0
NOISY_LOGGERS = ("orbax", "absl", "jax", "jax._src", "grain", "etils", "gcsfs", "fsspec", "google",
                 "urllib3", "tensorstore", "gcp_storage_emulator")


def resolve_config_args(argv: Sequence[str], flag_names: Sequence[str] = ("config",)) -> list[str]:
    """``argv`` with the values of ``--config=PATH`` / ``--config PATH`` resolved (``paths.resource``).

    Overrides (``--config.a.b=v``) and every other argument are left as they are.
    """
    from animegamer_jax import paths

    out = list(argv)
    for i, a in enumerate(out):
        for name in flag_names:
            flag = f"--{name}"
            if a.startswith(flag + "="):
                out[i] = flag + "=" + paths.resource(a[len(flag) + 1:])
            elif a == flag and i + 1 < len(out):
                out[i + 1] = paths.resource(out[i + 1])
    return out


def quiet_logs(verbosity: int) -> None:
    """INFO of libraries off when ``verbosity < 0`` (absl's -1 = WARNING default)."""
    level = std_logging.INFO if verbosity >= 0 else std_logging.WARNING
    for name in NOISY_LOGGERS:
        std_logging.getLogger(name).setLevel(level)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1" if verbosity < 0 else "0")


def run(main: Callable[[list[str]], int | None], argv: Sequence[str] | None = None) -> None:
    """``absl.app.run(main)`` with resolved config paths and quiet library logs.

    The absl default verbosity becomes WARNING (-1): absl prints INFO by default when flags are
    parsed through ``app.run``; ``--verbosity=0`` restores it.
    """
    from absl import app, flags, logging

    argv = resolve_config_args(sys.argv if argv is None else argv)
    if not any(a.startswith(("--verbosity", "-v=", "--v=")) or a in ("-v", "--v") for a in argv):
        argv.insert(1, "--verbosity=-1")

    def _main(args: list[str]) -> int | None:
        quiet_logs(flags.FLAGS.verbosity)
        logging.use_absl_handler()
        _console["on"] = True
        return main(args)

    app.run(_main, argv=argv)


_console = {"on": False}


def status(fmt: str, *args: object) -> None:
    """A stage line (``"compiling the train step ..."``): absl INFO, and under :func:`run` at the
    default verbosity also printed to stderr on process 0, so commands show their stages while the
    libraries' INFO chatter stays hidden. Library use (tests, notebooks) only logs."""
    from absl import logging

    logging.info(fmt, *args)
    if not _console["on"] or logging.get_verbosity() >= logging.INFO:
        return
    import jax

    if jax.process_index() == 0:
        print(fmt % args if args else fmt, file=sys.stderr, flush=True)
