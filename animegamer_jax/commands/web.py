"""Play in the browser: a local web app over the game engine (one model, many browser sessions).

Usage::

    python -m animegamer_jax.commands.web --checkpoint checkpoints/tiny_system            # http://127.0.0.1:7860/
    python -m animegamer_jax.commands.web --checkpoint DIR --port 8080 --host 0.0.0.0 --out /data/games
    python -m animegamer_jax.commands.web --standin                                       # random stand-in system
    python -m animegamer_jax.commands.web --config=configs/tiny.py --config.game.mode=reference --checkpoint DIR
    python -m animegamer_jax.commands.web --checkpoint DIR --config.game.seed=3   # new games' seed (a config field)
    python -m animegamer_jax.commands.web --checkpoint DIR --max_queue 8          # "busy, try again" past 8 waiting turns
    python -m animegamer_jax.commands.web --checkpoint DIR --max_batch 8          # 8 players' turns per model call
    python -m animegamer_jax.commands.web --checkpoint DIR --host 0.0.0.0 --token "$(openssl rand -hex 16)"  # prints the URL

(The ``animegamer-web`` console script runs the same command.)

The page has character / motion / background fields (or one whole instruction line), Generate,
Undo and Restart, the current clip in a video player (its frames shown as the VAE decodes them),
the meters as bars with this turn's changes, the history strip and a download of the game folder.
Every turn is the ``play`` command's engine step, and the game is saved after every turn in the
``play`` layout (``<out>/<game_id>/``, game/folder/layout.py). At most ``--max_queue`` turns wait; past
that a turn gets HTTP 503 with ``Retry-After`` and "the server is busy ... try again in N s"; at
most ``--max_sessions`` players hold games, past that a new player gets 503. The server binds to
loopback and answers only to loopback ``Host`` names unless ``--host`` says otherwise; any other
host prints a warning (app.py ``no_auth_warning``). ``--token T`` makes every request need T: the
page's URL carries it (``http://host:port/?token=T``, printed at start), then a cookie does.
Implementation: server.py (sessions, queue, worker), app.py (the routes and what each refusal gets).
"""

from __future__ import annotations

import sys

from absl import flags

from animegamer_jax.commands.cli import UsageError, define_verbosity, run
from animegamer_jax.commands.game_flags import game_command
from animegamer_jax.game.run import print_turn
from animegamer_jax.web.app import check_port, check_token, create_app, no_auth_warning, uvicorn_settings
from animegamer_jax.web.server import MAX_BATCH, MAX_QUEUE, MAX_SESSIONS, build_server


def define_flags(fv) -> None:
    """The web app's own flags on ``fv``, next to game_flags.py's ``common_flags`` (less ``--overwrite``)
    and ``--config`` (default: the config saved in ``--checkpoint``, else configs/tiny.py;
    ``--config.a.b=v`` overrides a field of either)."""
    flags.DEFINE_string("host", "127.0.0.1", "Address to bind (default loopback only); the server also answers to "
                        "this name in the Host header (0.0.0.0 or :: answer to any IP address and this machine's name).",
                        flag_values=fv)
    flags.DEFINE_string("token", None, "Secret every request must carry (16+ URL-safe characters): open "
                        "http://host:port/?token=TOKEN once, a cookie carries it from then on.", flag_values=fv)
    flags.DEFINE_integer("port", 7860, "TCP port.", lower_bound=0, upper_bound=65535, flag_values=fv)
    flags.DEFINE_integer("max_queue", MAX_QUEUE, "Turns that may wait for the model; past that a turn is refused "
                         "with HTTP 503 'busy, try again' and Retry-After.", lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("max_sessions", MAX_SESSIONS, "Players whose games the server holds in memory; past that a "
                         "new player gets HTTP 503 (no game is dropped to make room).", lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("max_batch", MAX_BATCH, "Turns of different players run in one batched model call, per "
                         "device (data-parallel slice): the model always runs this one batch shape (empty rows "
                         "padded), so a game's clips do not depend on who else played beside it.", lower_bound=1,
                         flag_values=fv)
    flags.DEFINE_bool("warmup", True, "Compile the model with one throwaway turn before serving, so the first "
                      "player does not wait for compilation (--nowarmup: compile on the first turn).", flag_values=fv)
    define_verbosity(fv)


def _serve(f, config, *rest: str) -> int:
    """Serves the game of the parsed command line until Ctrl-C; returns 0.

    Raises:
      UsageError: a positional argument; any of game_flags.py's ``CLI_ERRORS`` (a bad checkpoint, an
        output folder that is not writable).
    """
    import uvicorn  # optional

    if rest:
        raise UsageError(f"unexpected arguments {list(rest)}; the web app takes flags only")
    try:
        check_token(f.token)
        check_port(f.host, f.port)  # before the system loads and compiles
    except ValueError as e:
        raise UsageError(str(e)) from None
    warning = no_auth_warning(f.host, token=f.token is not None)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    server = build_server(config, f.checkpoint, f.standin, out=f.out, verify=f.verify_checkpoint,
                          random_fallback=f.demo, max_queue=f.max_queue, max_sessions=f.max_sessions,
                          max_batch=f.max_batch, on_turn=print_turn)
    print(f"system: {server.engine.model.label}\nconfig {config.name}, mode {server.engine.config.game.mode}, "
          f"games in {server.out_dir}/, at most {server.max_queue} turns waiting, {server.engine.batch_size} "
          f"turns per batch", flush=True)
    if f.warmup:
        print("compiling (one throwaway turn)...", flush=True)
        print(f"ready after {server.warmup():.1f} s", flush=True)
    server.start()
    shown = f"[{f.host}]" if ":" in f.host and not f.host.startswith("[") else f.host
    print(f"serving on http://{shown}:{f.port}/{'?token=' + f.token if f.token else ''} (Ctrl-C stops)", flush=True)
    try:
        uvicorn.run(create_app(server, host=f.host, token=f.token), host=f.host, port=f.port, **uvicorn_settings())
    finally:
        server.stop(timeout=5)
    return 0


#: ``web --flag ...`` (no ``--overwrite``: a session's games are its own)
COMMAND = game_command(define_flags, _serve, __doc__, exclude=("overwrite",))


def main(argv: list[str] | None = None) -> int:
    """Serves the game of ``argv`` (flags only) until Ctrl-C; returns the exit status (2 with a
    one-line message on bad input)."""
    return run("animegamer-web", argv, COMMAND)


def cli() -> None:
    """Console script ``animegamer-web``."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
