"""What every command-line entry point shares: flag parsing, the ``main(argv)`` pattern, quiet logs.

The pattern of a command (``python -m animegamer_jax.commands.<command>``, console script ``animegamer-<command>``)::

    def _define(fv, argv):                 # the command's flags, on a private absl FlagValues
        config_flags.DEFINE_config_file("config", ..., flag_values=fv, sys_argv=argv)
        flags.DEFINE_string("out", "", "...", flag_values=fv)

    def _run(f, *positional) -> int:       # the command itself; raises UsageError for a bad flag
        ...

    #: the table: one Command, or {subcommand: Command} (``<prog> SUBCOMMAND [args]``)
    COMMANDS = {"x": cli.Command(_define, _run, __doc__, positional=("SRC",), errors=(XError,))}

    def main(argv=None) -> int:
        return cli.run(PROG, argv, COMMANDS, __doc__)

    def cli() -> None:                     # the console script (pyproject.toml)
        sys.exit(main())

:func:`run` reads the table; each :class:`Command` runs through :func:`run_command`, which
parses with :func:`parse_flags`, prints ``error: <message>`` and returns 2 for a
bad command line or one of the command's input errors, returns 130 after Ctrl-C when the command
says what an interruption leaves behind, and quiets library logs. Every command gets ``--verbosity``
(:func:`define_verbosity`, added by :func:`parse_flags` where the command does not define it) and
``--compilation_cache_dir`` (:func:`define_compilation_cache`): the body runs with JAX's persistent
compilation cache in that folder (:func:`compilation_cache`).

Config paths: ``--config=configs/tiny.py`` works from any directory: a config path that does not
exist from the working directory is looked up in the checkout / editable install
(``paths.resource``). Logs: absl's own INFO lines and the INFO chatter of orbax, grain, jax and
tensorstore are hidden at the default ``--verbosity=-1``; the command's results and its stage lines
(:func:`status`) are printed; ``--verbosity=0`` brings every INFO line back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging as std_logging
import os
import signal
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import NoReturn

import jax
from jax._src import compilation_cache as jax_cache  # reset_cache: no public equivalent
from jax._src import xla_bridge  # backends_are_initialized: no public equivalent
from absl import flags
from absl import logging as absl_logging

from animegamer_jax import config as config_lib
from animegamer_jax.io import paths

#: loggers (std logging names) that are set to WARNING unless --verbosity >= 0
NOISY_LOGGERS = ("orbax", "absl", "jax", "jax._src", "grain", "etils", "gcsfs", "fsspec", "google",
                 "urllib3", "tensorstore", "gcp_storage_emulator")

HELP_ARGS = ("-h", "--help", "--helpshort", "--helpfull", "-?")

#: exit status of a bad command line or a bad input; of a run stopped with Ctrl-C; with SIGTERM (128 + 15)
USAGE_EXIT, INTERRUPTED_EXIT, TERMINATED_EXIT = 2, 130, 143

Define = Callable[[flags.FlagValues, list[str]], None]


class UsageError(ValueError):
    """A bad command line (unknown flag, bad value, unexpected argument); the message says which."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread the way Ctrl-C raises KeyboardInterrupt (:func:`sigterm_as_interrupt`)."""


def interrupt_exit(e: KeyboardInterrupt) -> int:
    """The exit status of a command stopped by ``e``: 143 for :class:`Terminated` (SIGTERM), else 130."""
    return TERMINATED_EXIT if isinstance(e, Terminated) else INTERRUPTED_EXIT



def exit_finished(code: int) -> NoReturn:
    """Exits with ``code``, the status of a command that has returned (its files written, its summary
    printed). A Ctrl-C or SIGTERM from here on lands in the interpreter's shutdown (JAX's backends,
    thread joins: seconds), where there is nothing left to save or abandon: it ends the process at once
    with 130 / 143 and one line on stderr, instead of a KeyboardInterrupt traceback and a -2 status."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()

    def now(signum, frame):
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.write("interrupted: the command had already finished; everything it reported is written\n")
            sys.stderr.flush()
        os._exit(TERMINATED_EXIT if signum == signal.SIGTERM else INTERRUPTED_EXIT)

    if _on_main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(s) is not None:
                signal.signal(s, now)
    sys.exit(code)

def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside, SIGTERM (a scheduler's stop, a preemptible VM's notice) raises :class:`Terminated` in the
    main thread, so the command stops the way Ctrl-C stops it (its ``except KeyboardInterrupt`` runs,
    exit status 143 through :func:`interrupt_exit`). The previous handler comes back on exit. Off the
    main thread, or where a non-Python handler is installed: nothing changes."""
    if not _on_main_thread() or signal.getsignal(signal.SIGTERM) is None:
        yield
        return

    def _raise(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def resolve_config_args(argv: Sequence[str], flag_names: Sequence[str] = ("config",)) -> list[str]:
    """``argv`` with the values of ``--config=PATH`` / ``--config PATH`` resolved (``paths.resource``).

    Overrides (``--config.a.b=v``) and every other argument are left as they are.
    """
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


def define_verbosity(fv: flags.FlagValues) -> None:
    """Defines ``--verbosity`` (alias ``-v``) on ``fv``: :func:`run_command` then applies it
    (:func:`quiet_logs`, absl's level) and prints :func:`status` lines at the default -1."""
    flags.DEFINE_integer("verbosity", -1, "Log level: -1 = warnings only (default), 0 = INFO of every library "
                         "(orbax, jax, ...), 1 = debug.", flag_values=fv)
    flags.DEFINE_alias("v", "verbosity", flag_values=fv)


#: the environment variable of jax's own that names its compilation cache folder ("" = no cache)
CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"


def default_compilation_cache_dir() -> str:
    """``$XDG_CACHE_HOME/animegamer_jax/jax_cache`` (without XDG_CACHE_HOME: ``~/.cache/...``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "animegamer_jax", "jax_cache")


def define_compilation_cache(fv: flags.FlagValues) -> None:
    """Defines ``--compilation_cache_dir`` on ``fv``; :func:`parse_flags` adds it to every command."""
    flags.DEFINE_string("compilation_cache_dir", None, "Folder (local or gs://) of JAX's persistent compilation "
                        "cache: a program compiled once loads from here in later runs. Default: "
                        f"${CACHE_ENV} if set, else $XDG_CACHE_HOME/animegamer_jax/jax_cache "
                        "(~/.cache/...). --compilation_cache_dir= (empty) turns the cache off.", flag_values=fv)


def compilation_cache_dir(flag_value: str | None) -> str:
    """The cache folder a command uses: ``--compilation_cache_dir`` if given, else ``$JAX_COMPILATION_CACHE_DIR``
    if set, else :func:`default_compilation_cache_dir`. ``""`` (given either way) means no cache."""
    if flag_value is not None:
        return flag_value
    env = os.environ.get(CACHE_ENV)
    return env if env is not None else default_compilation_cache_dir()


#: the jax options :func:`compilation_cache` sets, and restores on exit
_CACHE_OPTIONS = ("jax_compilation_cache_dir", "jax_enable_compilation_cache",
                  "jax_persistent_cache_min_compile_time_secs", "jax_persistent_cache_min_entry_size_bytes")


@contextlib.contextmanager
def compilation_cache(folder: str) -> Iterator[None]:
    """Inside, JAX's persistent compilation cache reads and writes ``folder`` ("" = off).

    Every program is cached whatever its compile time or size
    (``jax_persistent_cache_min_compile_time_secs = 0``, ``jax_persistent_cache_min_entry_size_bytes = -1``):
    JAX's default skips programs that compile in under 1 s, which are all of the tiny config's on a
    CPU and together still take seconds per run. Only jax options are set, so the backend does not
    start here (``jax.distributed.initialize`` may still come first). A cache is never a reason to
    fail, and its problems are one stage line each (:func:`status`), once: a local folder that cannot
    be created (a file's path, say) turns the cache off; one that cannot be written (read-only) is
    only read, its programs loaded and new ones not saved, JAX's warning for each program it could
    not save hidden. The options and JAX's cache object are restored on exit (a command run
    in-process leaves no cache behind).
    """
    read_only = False
    if folder and not paths.is_url(folder):
        folder = os.path.expanduser(folder)
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            status("compilation cache off: cannot create the folder %s (%s). Fix: pass --compilation_cache_dir "
                   "with a folder (empty turns the cache off)", folder, e.strerror or e)
            folder = ""
        else:
            read_only = not _writable(folder)
            if read_only:
                status("compilation cache %s is read-only: compiled programs are loaded from it, new ones are not "
                       "saved. Fix: pass --compilation_cache_dir with a folder you can write to", folder)
    before = {name: getattr(jax.config, name) for name in _CACHE_OPTIONS}
    wanted = {"jax_compilation_cache_dir": folder or None, "jax_enable_compilation_cache": bool(folder),
              "jax_persistent_cache_min_compile_time_secs": 0.0, "jax_persistent_cache_min_entry_size_bytes": -1}

    def apply(values: Mapping[str, object]) -> None:
        changed = any(getattr(jax.config, k) != v for k, v in values.items())
        for k, v in values.items():
            jax.config.update(k, v)
        if changed:
            jax_cache.reset_cache()  # the next compile opens the cache of the new settings

    apply(wanted)
    try:
        with warnings.catch_warnings() if read_only else contextlib.nullcontext():
            if read_only:  # said once above; JAX warns once for every program it cannot save
                warnings.filterwarnings("ignore", message="Error writing persistent compilation cache entry")
            yield
    finally:
        apply(before)


def _writable(folder: str) -> bool:
    """Whether a file can be created (and removed) in the local folder ``folder``."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=folder)
    except OSError:
        return False
    os.close(fd)
    try:
        os.remove(probe)
    except OSError:
        pass
    return True


def _override_error(overrides: Sequence[str], e: BaseException) -> UsageError:
    """An unknown config key (``AttributeError`` / ``KeyError`` of ml_collections) as one line."""
    return UsageError(f"unknown config key {str(e).strip(chr(34) + chr(39))!r} in {list(overrides)}")


#: the std logger of stage lines (``"compiling the train step ..."``): library modules log them as its INFO
#: records (``logging.getLogger("animegamer_jax.status").info(fmt, *args)``, without importing this module);
#: :func:`status` is the same for command modules
STATUS_LOGGER = "animegamer_jax.status"

#: whether stage lines also go to stderr (on while a command that defines --verbosity runs)
_console = {"on": False}


class _StageLines(std_logging.Handler):
    """The one handler of :data:`STATUS_LOGGER` once this module is imported (the logger then stops
    propagating and is set to INFO, so every line reaches it): each line is an absl INFO line, and while
    a command runs at the default verbosity (:func:`run_command` with ``--verbosity``) it is also printed
    to stderr on process 0, so commands show their stages while the libraries' INFO chatter stays
    hidden."""

    def emit(self, record: std_logging.LogRecord) -> None:
        message = record.getMessage()
        absl_logging.info("%s", message)
        if not _console["on"] or absl_logging.get_verbosity() >= absl_logging.INFO:
            return
        if _on_process_zero():
            print(message, file=sys.stderr, flush=True)


_status_logger = std_logging.getLogger(STATUS_LOGGER)
if not any(isinstance(h, _StageLines) for h in _status_logger.handlers):
    _status_logger.addHandler(_StageLines())
_status_logger.setLevel(std_logging.INFO)
_status_logger.propagate = False


def status(fmt: str, *args: object) -> None:
    """A stage line of a command module: an INFO record of :data:`STATUS_LOGGER` (:class:`_StageLines`
    says where it goes). Library modules log theirs to the same logger."""
    _status_logger.info(fmt, *args)


def _on_process_zero() -> bool:
    """jax.process_index() == 0 once the backend is up; before that (a stage line printed before
    ``jax.distributed.initialize``, which must run first) asking would start the backend, so the
    ``JAX_PROCESS_ID`` of the launchers decides."""
    if not xla_bridge.backends_are_initialized():
        return os.environ.get("JAX_PROCESS_ID", "0") in ("", "0")
    return jax.process_index() == 0


def parse_flags(argv: Sequence[str], define: Define, doc: str = "",
                positional: Sequence[str] | None = None) -> tuple[flags.FlagValues, list[str]]:
    """Parses ``argv`` (``argv[0]`` = program) with a command's own ``absl.flags.FlagValues``.

    ``define(flag_values, argv)`` defines the command's flags on ``flag_values`` (config files
    through ``config_flags.DEFINE_config_file(..., flag_values=fv, sys_argv=argv)``). A private
    FlagValues per call lets a command run in-process any number of times (tests, notebooks) next
    to other commands with flags of the same names. ``--help`` prints ``doc`` and every flag, and
    raises ``SystemExit(0)``. Subcommands and positional arguments (``convert release SRC DST``)
    are what absl leaves after the flags (flags may come before or after them).

    Args:
      positional: names of the positional arguments the command requires (``("SRC", "DST")``; ``()``
        for none); a different count is a :class:`UsageError` naming them. None: not checked.

    Returns:
      (flag values, positional arguments after the program name).

    Raises:
      UsageError: unknown flag, bad value, a missing required flag, or (with ``positional``) missing
        or extra positional arguments.
    """
    argv = resolve_config_args(list(argv))
    fv = flags.FlagValues()
    overrides = [a for a in argv[1:] if a.startswith("--config.")]
    try:
        for path in _config_paths(argv):
            config_lib.check_config_file(path)
    except config_lib.ConfigError as e:
        raise UsageError(str(e)) from None
    try:
        define(fv, argv)  # config_flags reads the file and applies --config.* overrides here
        if "compilation_cache_dir" not in fv:
            define_compilation_cache(fv)
        if "verbosity" not in fv:
            define_verbosity(fv)
    except (AttributeError, KeyError) as e:
        raise _override_error(overrides, e) from None
    except OSError as e:
        raise _config_file_error(argv, e) from None
    except (SyntaxError, ImportError, NameError) as e:  # a config file that fails to import
        raise UsageError(f"cannot load the config file {_config_paths(argv)}: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}. Fix: pass a Python config file with a "
                         f"get_config(), e.g. --config=configs/tiny.py") from None
    except (flags.Error, ValueError, TypeError) as e:
        raise UsageError(f"bad config or override {overrides}: {e}") from None
    if any(a in HELP_ARGS for a in argv[1:]):
        usage = f"usage: {argv[0]} {' '.join(positional)} [flags]\n\n" if positional else ""
        print(usage + (doc.strip() + "\n\n" if doc else "") + "flags:\n" + fv.get_help(include_special_flags=False))
        raise SystemExit(0)
    given = any(a == "--config" or a.startswith("--config=") for a in argv[1:])
    if overrides and not given and "config" in fv and fv["config"].default is None:
        raise UsageError(f"{' '.join(overrides)} overrides fields of --config, which this command has no "
                         f"default for. Fix: add --config=configs/tiny.py (or configs/animegamer_2b_7b.py)")
    try:
        rest = fv(argv)  # a config file without a default is read (and overridden) here
    except (AttributeError, KeyError) as e:
        raise _override_error(overrides, e) from None
    except flags.Error as e:
        raise UsageError(f"{e}. See --help") from None
    except OSError as e:
        raise _config_file_error(argv, e) from None
    except (SyntaxError, ImportError, NameError) as e:
        raise UsageError(f"cannot load the config file {_config_paths(argv)}: {type(e).__name__}: {e}. Fix: pass "
                         f"a Python config file with a get_config(), e.g. --config=configs/tiny.py") from None
    if "config" in fv:
        _validate_config(fv)
    if positional is not None and len(rest) - 1 != len(positional):
        if not positional:
            raise UsageError(f"unexpected arguments {rest[1:]}; {argv[0]} takes flags only (see --help)")
        raise UsageError(f"expected {' '.join(positional)}, got {rest[1:] or 'nothing'}. "
                         f"Usage: {argv[0]} {' '.join(positional)} [flags]; see --help")
    return fv, rest[1:]


def probe_flags(define: Callable[[flags.FlagValues], None], argv: Sequence[str]) -> flags.FlagValues | None:
    """The flags ``define(fv)`` defines, read from ``argv`` (unknown flags skipped) before the full parse:
    what a command's ``--config`` default depends on (the config saved in ``--checkpoint``). None for
    ``--help`` or a command line that does not parse (the full parse reports it)."""
    if any(a in HELP_ARGS for a in argv[1:]):
        return None
    probe = flags.FlagValues()
    define(probe)
    try:
        probe(list(argv), known_only=True)
    except flags.Error:
        return None
    return probe


def _config_paths(argv: Sequence[str]) -> list[str]:
    """The ``--config=PATH`` / ``--config PATH`` values of ``argv``."""
    out = []
    for i, a in enumerate(argv[1:], start=1):
        if a.startswith("--config="):
            out.append(a.split("=", 1)[1])
        elif a == "--config" and i + 1 < len(argv):
            out.append(argv[i + 1])
    return out


def _validate_config(fv: flags.FlagValues) -> None:
    """``config.validate`` of the parsed ``--config`` (overrides applied), as a :class:`UsageError`.

    A config file that is not there is reported where the command first reads it (config_flags
    loads it lazily); a value that is not a config (a command's own ``--config`` flag) is not checked.
    """
    try:
        value = fv["config"].value
    except (OSError, AttributeError):
        return
    if not hasattr(value, "keys"):
        return
    try:
        config_lib.validate(value)
    except config_lib.ConfigError as e:
        raise UsageError(str(e)) from None


def _config_file_error(argv: Sequence[str], e: OSError) -> UsageError:
    """config_flags' "Failed loading config file ..." (a --config path that does not exist) as one line."""
    given = next((a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")), "")
    return UsageError(f"cannot load the config file {given!r} (no such file, or it fails to import); give an "
                      f"existing config file, e.g. --config=configs/tiny.py")


def one_line(e: BaseException) -> str:
    """``str(e)`` as one line: a message of several lines (a library's) has them joined with ``; ``."""
    return "; ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__


def run_command(prog: str, argv: Sequence[str] | None, define: Define, doc: str,
                positional: Sequence[str] | None, body: Callable[..., int | None],
                errors: tuple[type[BaseException], ...] = (), *, interrupted: str | None = None) -> int:
    """The ``main(argv)`` of a command: parses ``[prog, *argv]`` with :func:`parse_flags` and returns
    ``body(flag_values, *positional_values)``.

    Args:
      prog: the program as the usage line shows it (``"python -m animegamer_jax.commands.convert clip"``).
      argv: the arguments after the program; None: ``sys.argv[1:]``.
      define, doc, positional: as for :func:`parse_flags` (``positional=None``: ``body`` gets every
        positional argument and checks them itself, raising :class:`UsageError`).
      body: the command itself; returns the exit status (None: 0). It may raise :class:`UsageError`
        for a check of its own (a flag that is required).
      errors: further exception types that ``body`` raises for a bad input (a missing file): each
        is reported as one ``error: ...`` line on stderr, exit status 2, like a bad command line.
      interrupted: what a Ctrl-C leaves behind (``"finished games are kept; rerun to resume"``):
        printed as ``interrupted: <message>`` with exit status 130. None: Ctrl-C raises.

    With a ``--verbosity`` flag (:func:`define_verbosity`) the libraries' INFO logs follow it
    (:func:`quiet_logs`) and :func:`status` lines are printed while ``body`` runs.

    Returns:
      ``body``'s exit status, or 2 after printing ``error: <message>`` to stderr on a
      :class:`UsageError` (or one of ``errors``). ``--help`` raises ``SystemExit(0)``.
    """
    full = [prog, *(sys.argv[1:] if argv is None else argv)]
    console = _console["on"]
    try:
        f, rest = parse_flags(full, define, doc, positional=positional)
        if "verbosity" in f:
            quiet_logs(f.verbosity)
            absl_logging.set_verbosity(f.verbosity)
            _console["on"] = True
        with compilation_cache(compilation_cache_dir(f.compilation_cache_dir)):
            rc = body(f, *rest)
        return 0 if rc is None else int(rc)
    except (UsageError, *errors) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return USAGE_EXIT
    except OSError as e:  # config_flags loads --config lazily: a missing file surfaces at first use
        if "Failed loading config file" not in str(e):
            raise
        print(f"error: {_config_file_error(full, e)}", file=sys.stderr)
        return USAGE_EXIT
    except KeyboardInterrupt as e:
        if interrupted is None:
            raise
        print(f"interrupted: {interrupted}", file=sys.stderr)
        return interrupt_exit(e)
    finally:
        _console["on"] = console


@dataclasses.dataclass(frozen=True)
class Command:
    """One row of a command's table: how :func:`run` parses a command line and runs it.

    Attributes:
      define: ``define(flag_values, argv)``, the flags (:func:`parse_flags`).
      body: the command itself, ``body(flag_values, *positional) -> exit status`` (None: 0); with
        ``with_argv``, ``body(flag_values, argv, *positional)`` (argv: the arguments after the program).
      doc: the ``--help`` text.
      positional: the positional arguments' names (``("SRC", "DST")``; ``()``: none; None: any, the
        body checks them).
      errors: exception types reported as one ``error: ...`` line, exit status 2 (:func:`run_command`).
      interrupted: what a Ctrl-C leaves behind (:func:`run_command`); None: Ctrl-C raises.
      sigterm: SIGTERM stops the command as Ctrl-C does (:func:`sigterm_as_interrupt`).
      setup: called before the command line is parsed (process-wide JAX options).
      subcommands: a table of its own for a first argument that names one (``convert dit migrate``).
    """

    define: Define
    body: Callable[..., int | None]
    doc: str = ""
    positional: Sequence[str] | None = ()
    errors: tuple[type[BaseException], ...] = ()
    interrupted: str | None = None
    sigterm: bool = False
    with_argv: bool = False
    setup: Callable[[], object] | None = None
    subcommands: Mapping[str, Command] | None = None


def no_flags(fv: flags.FlagValues, argv: list[str]) -> None:
    """The ``define`` of a command without flags of its own."""


def run(prog: str, argv: Sequence[str] | None, table: Command | Mapping[str, Command], doc: str = "",
        default: str | None = None) -> int:
    """The ``main(argv)`` of every command: runs the row of ``table`` that ``argv`` names.

    Args:
      prog: the program as usage lines show it; a subcommand's is ``f"{prog} {name}"``.
      argv: the arguments after the program; None: ``sys.argv[1:]``.
      table: one :class:`Command` (the command has no subcommands), or ``{name: Command}``: the first
        argument names the row (:func:`run_subcommand`: ``-h`` prints ``doc``; no name or an unknown one
        is one ``error:`` line, exit status 2; ``default``: the row run when the first argument is a
        flag or there is none).

    Returns:
      the row's exit status (:func:`run_command`).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if isinstance(table, Command):
        if table.subcommands and args and args[0] in table.subcommands:
            return run(f"{prog} {args[0]}", args[1:], table.subcommands[args[0]])
        if table.setup is not None:
            table.setup()
        body = (lambda f, *rest: table.body(f, args, *rest)) if table.with_argv else table.body
        with sigterm_as_interrupt() if table.sigterm else contextlib.nullcontext():
            return run_command(prog, args, table.define, table.doc, table.positional, body, table.errors,
                               interrupted=table.interrupted)
    rows = {name: (lambda rest, name=name: run(f"{prog} {name}", rest, table[name])) for name in table}
    return run_subcommand(args, rows, doc, default=default)


def run_subcommand(argv: Sequence[str] | None, commands: Mapping[str, Callable[[list[str]], int | None]],
                   doc: str, default: str | None = None) -> int:
    """``<program> KIND [args]``: runs ``commands[KIND](args)`` and returns its exit status (None: 0).

    ``-h`` / ``--help`` prints ``doc`` with exit status 0; no kind, or an unknown one, is one
    ``error: ...`` line naming the kinds (2). With ``default`` (a key of ``commands``), no argument
    or a first argument that is a flag (starts with ``-``, ``--help`` included) runs
    ``commands[default]`` on all the arguments: ``<program> --flag ...`` is ``<program> DEFAULT --flag ...``
    (so the default's help, whose ``doc`` should name the other kinds, is the program's).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if default is not None and (not args or args[0].startswith("-")):
        args = [default, *args]
    if args and args[0] in HELP_ARGS:
        print(doc, file=sys.stderr)
        return 0
    if not args:
        print(f"error: expected a kind: one of {', '.join(commands)} (see --help)", file=sys.stderr)
        return USAGE_EXIT
    if args[0] not in commands:
        print(f"error: unknown kind {args[0]!r}; choose one of {', '.join(commands)}", file=sys.stderr)
        return USAGE_EXIT
    rc = commands[args[0]](args[1:])
    return rc if isinstance(rc, int) else 0
