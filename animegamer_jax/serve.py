"""Play in the browser: a local web app over the game engine (one model, many browser sessions).

Usage::

    python -m animegamer_jax.serve --checkpoint checkpoints/tiny_system            # http://127.0.0.1:7860/
    python -m animegamer_jax.serve --checkpoint DIR --port 8080 --host 0.0.0.0 --out /data/games
    python -m animegamer_jax.serve --standin                                       # random stand-in system
    python -m animegamer_jax.serve --config=configs/tiny.py --config.game.mode=reference --checkpoint DIR
    python -m animegamer_jax.serve --checkpoint DIR --config.game.seed=3   # overrides the config saved in DIR

The page has character / motion / background fields (or one whole instruction line), Generate,
Undo and Restart, the current clip in a video player (its frames shown as the VAE decodes them),
the meters as bars with this turn's changes, the history strip and a download of the game folder.
Every turn is the ``play`` command's engine step, and the game is saved after every turn in the
``play`` layout (``<out>/<game_id>/``, game/writers.py). The server binds to loopback unless
``--host`` says otherwise; it has no authentication, so expose it only on networks you trust.
Implementation: animegamer_jax/web/ (server.py: sessions, queue, worker; app.py: the routes).
"""

from __future__ import annotations

import sys
import threading
import time



def define_flags(fv) -> None:
    """serve's own flags on ``fv``, next to play's :func:`~animegamer_jax.play.common_flags` and
    ``--config`` (default: the config saved in ``--checkpoint``, else configs/tiny.py;
    ``--config.a.b=v`` overrides a field of either)."""
    from absl import flags

    flags.DEFINE_integer("seed", None, "Game seed of new games (default config.game.seed).", flag_values=fv)
    flags.DEFINE_string("host", "127.0.0.1", "Address to bind (default loopback only).", flag_values=fv)
    flags.DEFINE_integer("port", 7860, "TCP port.", flag_values=fv)
    flags.DEFINE_bool("warmup", True, "Compile the model with one throwaway turn before serving, so the first "
                      "player does not wait for compilation (--nowarmup: compile on the first turn).", flag_values=fv)
    flags.DEFINE_integer("verbosity", -1, "Log level: -1 = warnings only (default), 0 = INFO of every library "
                         "(orbax's per-array restore lines ...).", flag_values=fv)


def build_server(config, checkpoint: str = "", standin: bool = False, out: str | None = None,
                 seed: int | None = None, verify: str = "fast", random_fallback: bool = False):
    """The :class:`~animegamer_jax.web.server.GameServer` of a config and a system (worker not started).

    Raises:
      CheckpointError: a missing or bad checkpoint. OutputError: ``out`` not writable.
    """
    from animegamer_jax import parallel, play
    from animegamer_jax.game.engine import GameEngine, apply_mode
    from animegamer_jax.game.system import resolve_system
    from animegamer_jax.web.server import GameServer

    play.setup_jax()
    mesh = parallel.mesh_from_config(config)
    system = resolve_system(apply_mode(config), checkpoint, standin, mesh=mesh, verify=verify,
                            random_fallback=random_fallback)
    engine = GameEngine(config, system, mesh=mesh)
    return GameServer(engine, out or config.game.out_dir, seed)


class HttpThread:
    """Serves a Starlette app with uvicorn on a background thread (tests, notebooks).

    ``start()`` returns once the socket listens; ``url`` is ``http://host:port``; ``stop()`` shuts
    uvicorn down and joins the thread.
    """

    def __init__(self, asgi_app, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self._server = uvicorn.Server(uvicorn.Config(asgi_app, host=host, port=port, log_level="warning",
                                                     access_log=False, lifespan="off"))
        self._server.install_signal_handlers = lambda: None  # not the main thread
        self._thread = threading.Thread(target=self._server.run, name="http", daemon=True)
        self.host = host
        self.port = port

    def start(self, timeout: float = 30.0) -> "HttpThread":
        self._thread.start()
        t0 = time.time()
        while not self._server.started:
            if not self._thread.is_alive() or time.time() - t0 > timeout:
                raise RuntimeError(f"the HTTP server did not start on {self.host}:{self.port}")
            time.sleep(0.02)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(30)


def main(argv: list[str] | None = None) -> int:
    """Serves the game of ``argv`` (flags only) until Ctrl-C; returns the exit status (2 with a
    one-line message on bad input)."""
    import uvicorn
    from absl import logging

    from animegamer_jax import cli, play
    from animegamer_jax.web.app import create_app

    try:
        f, rest, config = play.parse_game_flags("animegamer-serve", sys.argv[1:] if argv is None else argv,
                                                define_flags, __doc__, exclude=("overwrite",))
        if rest:
            raise cli.UsageError(f"unexpected arguments {rest}; serve takes flags only")
        cli.quiet_logs(f.verbosity)
        logging.set_verbosity(f.verbosity)
        server = build_server(config, f.checkpoint, f.standin, f.out, f.seed, f.verify_checkpoint,
                              random_fallback=f.demo)
    except play.CLI_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"system: {server.engine.system.label}\nconfig {config.name}, mode {server.engine.config.game.mode}, "
          f"games in {server.out_dir}/", flush=True)
    if f.warmup:
        print("compiling (one throwaway turn)...", flush=True)
        print(f"ready after {server.warmup():.1f} s", flush=True)
    server.start()
    print(f"serving on http://{f.host}:{f.port}/ (Ctrl-C stops)", flush=True)
    try:
        uvicorn.run(create_app(server), host=f.host, port=f.port, log_level="warning")
    finally:
        server.stop(timeout=5)
    return 0


def cli() -> None:
    """Console script ``animegamer-serve``."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
