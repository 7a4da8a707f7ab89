"""The command line the game commands share: play, generate, the web app and the game benchmark.

Each takes the flags of :func:`common_flags`, its own, and ``--config``: a config file, or without
one the config saved in ``--checkpoint`` (checked first, :func:`checkpoint_config`), else, with
``--demo``, the config saved in the demo's checkpoint (configs/tiny.py's ``game.checkpoint``, the
shipped checkpoints/tiny_system, when it exists: :func:`demo_checkpoint`), else configs/tiny.py. ``--config.a.b=value`` overrides a field of either (``--config.game.mode=reference``,
``--config.game.seed=3``): what the config holds is set only that way, and the flags are the run's
arguments (input and output paths, ``--demo``, ``--overwrite``, ...).

* :func:`game_command` is a game command's row for ``cli.run`` (these flags, the errors it reports);
* :func:`parse_game_flags` parses a game command line for library use (tests, benchmarks);
* :func:`game_flags` is the ``define(fv, argv)`` both hand to ``cli.parse_flags``;
* :data:`CLI_ERRORS` are the errors a game command reports as one line (exit status 2).

The process-wide JAX options the game commands set are inference/layout.py ``setup_jax``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from absl import flags
from ml_collections import config_flags

from animegamer_jax.commands import cli

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.checkpoint import SystemCheckpointError, load_config, verify_checkpoint
from animegamer_jax.config import ConfigError, SavedConfigError, fill_added_keys, load_config as load_config_file
from animegamer_jax.game.errors import GAME_ERRORS
from animegamer_jax.inference import executables

#: the errors the game commands report as one line (exit status 2) instead of a traceback
CLI_ERRORS = (cli.UsageError, *GAME_ERRORS)

#: the default ``--out``: where game folders are written
OUT_DIR = "outputs/games"

CONFIG_HELP = ("Config file (default: the config saved in --checkpoint, else configs/tiny.py); "
               "--config.a.b=value overrides a field, e.g. --config.game.mode=reference (unknown keys are errors).")


def character_flag(fv) -> None:
    """``--character NAME=IMAGE`` (repeatable; game/characters.py) on ``fv``: play and generate."""
    flags.DEFINE_multi_string("character", [], "NAME=IMAGE: the turns whose Character field is NAME "
                              "(case-insensitive) show the character of IMAGE (a PNG/JPEG, local or URL; needs a "
                              "system trained with phase r). Repeatable.", flag_values=fv)


def common_flags(fv) -> None:
    """The absl flags shared by play, generate, the web app and the game benchmark, defined on ``fv``.

    Spellings of the argparse era keep working: ``--verify-checkpoint`` is an alias of
    ``--verify_checkpoint``.
    """
    flags.DEFINE_string("checkpoint", "", "System checkpoint directory (save_system layout), local or gs://.",
                        flag_values=fv)
    flags.DEFINE_bool("standin", False, "Play a randomly initialised stand-in system (untrained; labelled in "
                      "outputs).", flag_values=fv)
    flags.DEFINE_string("out", OUT_DIR, "Parent folder of the game folders, local or gs://.", flag_values=fv)
    flags.register_validator("out", bool, "--out is empty. Fix: --out=DIR (default outputs/games)", flag_values=fv)
    flags.DEFINE_bool("demo", False, "Use config.game.checkpoint when it exists (without --config: with the config "
                      "saved in it, as --checkpoint would), else a clearly-labelled randomly initialised system of "
                      "the config's sizes.", flag_values=fv)
    flags.DEFINE_bool("overwrite", False, "Replace a finished game of the same id from an earlier run (folders "
                      "this program did not write are never replaced).", flag_values=fv)
    flags.DEFINE_enum("verify_checkpoint", "fast", ["fast", "full"], "Checkpoint integrity check before loading: "
                      "fast = every file's size, full hash of files up to 8 MiB and sampled blocks of larger ones; "
                      "full = sha256 of every byte.", flag_values=fv)
    flags.DEFINE_alias("verify-checkpoint", "verify_checkpoint", flag_values=fv)
    flags.DEFINE_string("executables", "", "Folder of compiled stage programs saved by python -m "
                        "animegamer_jax.commands.aot --save (same jax, commit, devices and config: loaded instead of "
                        "compiled; else one line says why and they compile).", flag_values=fv)


def checkpoint_config(checkpoint: str, verify: str = "fast"):
    """The config saved in a system checkpoint, after its integrity check.

    A system checkpoint carries the config it was built with
    (docs/design.md#one-checkpoint-directory-for-a-whole-system), so ``play --checkpoint DIR``
    needs nothing else.

    Raises:
      ConfigError: no such folder, a damaged checkpoint, or no readable saved config (the fix named).
    """
    if not fileio.isdir(checkpoint):
        raise ConfigError(f"checkpoint directory {checkpoint!r} not found. Fix: pass the folder "
                          f"written by save_system (or --standin for a random stand-in)")
    try:
        verify_checkpoint(checkpoint, verify)
    except SystemCheckpointError as e:
        raise ConfigError(str(e)) from None
    try:
        return fill_added_keys(load_config(checkpoint))
    except (SystemCheckpointError, OSError) as e:
        raise ConfigError(f"{e}. Fix: pass --config for this checkpoint") from None


#: the config file a game command reads without ``--config`` (and without a checkpoint's saved config)
DEFAULT_CONFIG = "configs/tiny.py"


def demo_checkpoint(argv: Sequence[str]) -> str:
    """The checkpoint ``--demo`` plays without ``--config`` and ``--checkpoint``: a
    ``--config.game.checkpoint=DIR`` override of ``argv``, else :data:`DEFAULT_CONFIG`'s
    ``game.checkpoint`` (the shipped checkpoints/tiny_system), as ``paths.resource`` finds it; ``""``
    when that is no folder (the demo then plays the randomly initialised system of configs/tiny.py).

    The demo plays it with the config saved in it (as ``--checkpoint DIR``): the one it was trained
    with (its VAE's fitted ``vae.scaling_factor`` included), not configs/tiny.py's defaults.
    """
    ckpt = None
    for i, a in enumerate(argv[1:], 1):
        if a.startswith("--config.game.checkpoint="):
            ckpt = a.split("=", 1)[1]
        elif a == "--config.game.checkpoint" and i + 1 < len(argv):
            ckpt = argv[i + 1]
    if ckpt is None:
        ckpt = str(load_config_file(DEFAULT_CONFIG).game.checkpoint)
    ckpt = paths.resource(ckpt) if ckpt else ""
    return ckpt if ckpt and fileio.isdir(ckpt) else ""


def _config_given(argv: Sequence[str]) -> bool:
    return any(re.match(r"^--?config(=|$)", a) for a in argv[1:])


def game_flags(define: Callable[[object], None] | None = None,
               exclude: Sequence[str] = ()) -> Callable[[object, list[str]], None]:
    """The ``define(fv, argv)`` of a game command for ``cli.parse_flags`` / ``cli.run_command``.

    Defines :func:`common_flags` (less the names in ``exclude``; the web app has no ``overwrite``),
    ``define(fv)``'s own flags and ``--config``: ``config_flags.DEFINE_config_file`` of ``--config=FILE``
    or configs/tiny.py; without ``--config`` but with ``--checkpoint DIR`` the config saved in the
    checkpoint (``config_flags.DEFINE_config_dict``), read after :func:`checkpoint_config`'s check;
    without either but with ``--demo``, the config saved in :func:`demo_checkpoint` (its
    ``game.checkpoint`` set to that folder, which the demo then loads).

    The returned function raises :class:`SavedConfigError` for a checkpoint whose config cannot be
    read.
    """

    def own(fv) -> None:
        if define is not None:
            define(fv)
        common_flags(fv)
        for name in exclude:
            delattr(fv, name)

    def define_all(fv, argv: list[str]) -> None:
        own(fv)
        saved = None
        # --checkpoint / --verify_checkpoint / --demo, read before --config exists
        probe = None if _config_given(argv) else cli.probe_flags(own, argv)
        if probe is not None:
            demo = demo_checkpoint(argv) if probe.demo and not probe.checkpoint else ""
            if probe.checkpoint or demo:
                try:
                    saved = checkpoint_config(probe.checkpoint or demo, probe.verify_checkpoint)
                except ConfigError as e:
                    raise SavedConfigError(str(e)) from None
                if demo:
                    saved.game.checkpoint = demo  # what resolve_system loads (not fingerprinted)
        if saved is not None:
            config_flags.DEFINE_config_dict("config", saved, CONFIG_HELP, flag_values=fv, lock_config=False,
                                            sys_argv=argv)
        else:
            config_flags.DEFINE_config_file("config", paths.resource(DEFAULT_CONFIG), CONFIG_HELP,
                                            flag_values=fv, lock_config=False, sys_argv=argv)

    return define_all


def config_overrides(f) -> dict:
    """The ``--config.a.b=value`` overrides of the command line parsed into flag values ``f``:
    ``{"a.b": value}`` (config_flags ``get_override_values``; empty without any)."""
    return dict(config_flags.get_override_values(f["config"]))


def parse_game_flags(prog: str, argv: Sequence[str], define: Callable[[object], None] | None = None, doc: str = "",
                     exclude: Sequence[str] = ()):
    """Parses a game command line (:func:`game_flags`).

    Args:
      prog: program name shown in errors; argv: the arguments after it; define: the command's own
        flags; doc: printed by ``--help``; exclude: names of :func:`common_flags` the command does not
        take (the web app: ``overwrite``).

    Returns:
      (flag values, positional arguments, the parsed config: ``f.config``).

    Raises:
      cli.UsageError: an unknown flag or config key, a bad value. ConfigError: a missing or damaged
        checkpoint whose config was to be used. SystemExit(0): ``--help`` (printed).
    """
    try:
        f, rest = cli.parse_flags([prog, *argv], game_flags(define, exclude), doc)
    except SavedConfigError as e:
        raise ConfigError(str(e)) from None
    return f, rest, f.config


def game_command(define: Callable[[object], None] | None, body: Callable[..., int], doc: str,
                 exclude: Sequence[str] = (), interrupted: str | None = None,
                 setup: Callable[[], object] | None = None) -> cli.Command:
    """A game command's row for ``cli.run``: its flags are :func:`game_flags` ``(define, exclude)``.

    Args:
      body: ``(flag values, config, *positional) -> exit status``; the config is ``f.config``; it runs
        with ``--executables`` in use.
      doc: the ``--help`` text; setup: called before parsing (process-wide JAX options).
      interrupted: with it, SIGTERM stops the command like Ctrl-C (``cli.sigterm_as_interrupt``), and
        an interruption that ``body`` does not handle itself (during flag parsing or loading) prints
        ``interrupted: <interrupted>`` with exit status 130 (143 for SIGTERM). None: neither.

    The command returns ``body``'s exit status, or 2 after one ``error: ...`` line on stderr for a bad
    command line, a bad checkpoint or any of :data:`CLI_ERRORS` raised by ``body``.
    """
    return cli.Command(game_flags(define, exclude), lambda f, *rest: _with_executables(f, body, *rest), doc,
                       positional=None, errors=(*CLI_ERRORS, SavedConfigError), interrupted=interrupted,
                       sigterm=interrupted is not None, setup=setup)


def _with_executables(f, body, *rest):
    """``body(f, config, *rest)`` with ``--executables`` in use (inference/executables.py)."""
    with executables.use(f.executables if "executables" in f else ""):
        return body(f, f.config, *rest)
