"""Generate many games offline from a JSONL file (one game a line, game/script.py ``load_jsonl``).

Usage::

    python -m animegamer_jax.commands.generate data/games/demo.jsonl --checkpoint=DIR --out=outputs/games
    python -m animegamer_jax.commands.generate data/games/demo.jsonl --config=configs/tiny.py --checkpoint=DIR --limit=2
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m animegamer_jax.commands.generate games.jsonl --standin

Games are played ``B`` at a time, B = ``--max_batch`` x the data-parallel size of the mesh
(``--max_batch`` games per data shard, default 1, the web server's flag of the same name), games with
equal turn counts grouped together (game/engine.py ``batches``); a short batch is padded with filler
rows, so every batch has the one shape and each game's files are byte for byte those of the same
game generated alone with the same ``--max_batch``. Under a multi-process launch
(``JAX_NUM_PROCESSES`` etc., parallel/distributed.py) process p takes games p, p + P, ... and plays
them on a mesh of its local devices, so processes never wait for each other. Every game's
instructions are checked (fields, token length, file:line) before the first turn. Resumable and
verified: a game is skipped only when its folder is a finished game of this project made from the
same instructions, seed, mode, config and system (the fingerprint in its game.json) with every file
intact (sizes and sha256 recorded there; game/folder/saves.py ``pending_games``); any other is
replayed, and the run says which and why. One writer per game folder (game/folder/layout.py
``game_lock``): a batch's games are locked before it plays, so a game another process is writing
stops the run with one line (its pid and host, exit 2) before that batch plays; the batches saved
before it are kept, and a rerun resumes.
A folder of the same name that this program did not write stops the run before anything is played.
``--overwrite`` replays every game. A tqdm bar shows games done and the ETA. Flags (absl) and
``--config`` / ``--config.a.b=value`` are play's (game_flags.py): without ``--config`` the config
saved in ``--checkpoint`` is used. ``--character NAME=IMAGE`` (repeatable, game/characters.py) applies
to every game: each game's turns naming NAME are decoded with IMAGE's reference (each game's output
is the one it has alone, with or without references beside it); the image goes into each game folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys

import jax
from absl import flags
from tqdm import tqdm

from animegamer_jax import parallel
from animegamer_jax.io import paths
from animegamer_jax.commands.cli import UsageError, interrupt_exit, run
from animegamer_jax.game.folder import layout
from animegamer_jax.game.engine import GameEngine, batches
from animegamer_jax.game.characters import check_used, load_characters
from animegamer_jax.commands.game_flags import character_flag, game_command
from animegamer_jax.game.loading import resolve_system
from animegamer_jax.game.folder.saves import fingerprint_of, pending_games, save_game
from animegamer_jax.game.script import load_jsonl
from animegamer_jax.inference.layout import setup_jax
from animegamer_jax.inference.mode import apply_mode
from animegamer_jax.inference.turn_inputs import validate_games
from animegamer_jax.parallel import distributed


def define_flags(fv) -> None:
    """generate's own flags (next to game_flags.py's ``common_flags`` and ``--config``) on ``fv``."""
    flags.DEFINE_integer("limit", 0, "Stop after this many games (0 = all).", lower_bound=0, flag_values=fv)
    flags.DEFINE_integer("max_batch", 1, "Games played in one batched model call, per device (data-parallel "
                         "slice), as web's --max_batch: every batch has this one shape (a short one is padded), so "
                         "a game's files do not depend on the games beside it.", lower_bound=1, flag_values=fv)
    character_flag(fv)


def _generate(f, config, *rest: str) -> int:
    """Plays every pending game of the parsed command line (``rest``: ``[GAMES.jsonl]``).

    Returns:
      0, or 130 on Ctrl-C (143 on SIGTERM).

    Raises:
      UsageError: not exactly one positional argument; any of game_flags.py's ``CLI_ERRORS``.
    """
    if len(rest) != 1:
        raise UsageError(f"expected one JSONL file of games, got {list(rest) or 'none'}")
    try:
        out_dir = f.out
        layout.check_writable(out_dir, keep=False)  # created when a game is written
        games = load_jsonl(rest[0])
        characters = load_characters(f.character)
        if characters:  # every game gets them; each turn naming one is decoded with its reference
            check_used(characters, [t for g in games for t in g.turns], rest[0])  # a name no game uses: refused
            games = tuple(dataclasses.replace(g, characters=characters) for g in games)
        mesh = parallel.mesh_from_config(config, devices=jax.local_devices())
        system = resolve_system(apply_mode(config), f.checkpoint, f.standin, mesh=mesh,
                                random_fallback=f.demo, verify=f.verify_checkpoint,
                                need_references=bool(characters))
        engine = GameEngine(config, system, mesh=mesh, rows=f.max_batch)
        validate_games(games, engine.spec, engine.tok)  # every game, before the first turn
        seeds = {g.game_id: engine.game_seed(g) for g in games}
        todo, done, replay = pending_games(games, out_dir, jax.process_index(), jax.process_count(),
                                           lambda g: fingerprint_of(engine.config, engine.model, g, seeds[g.game_id]), f.overwrite)
        if f.limit:
            todo = todo[: f.limit]
            replay = {g.game_id: replay[g.game_id] for g in todo if g.game_id in replay}
        print(f"system: {system.label}\nprocess {jax.process_index()}/{jax.process_count()}: "
              f"{len(todo)} games to play ({len(replay)} replayed), {done} already finished, batch "
              f"{engine.batch_size} on mesh {dict(mesh.shape)}", flush=True)
        for gid, why in replay.items():
            print(f"  replaying {gid}: {why}", flush=True)
        with tqdm(total=len(todo), unit="game", desc="games", file=sys.stdout) as bar:
            for group in batches(todo, engine.batch_size):
                with contextlib.ExitStack() as held:  # the batch's game folders: one writer each
                    for g in group:
                        held.enter_context(layout.game_lock(paths.join(out_dir, g.game_id)))
                    for result in engine.play(group):
                        gid = result["game"].game_id
                        save_game(engine.config, engine.model, result, out_dir, overwrite=gid in replay)
                        bar.update(1)
    except KeyboardInterrupt as e:
        print("interrupted: finished games are kept; rerun the same command to resume", file=sys.stderr)
        return interrupt_exit(e)
    print(f"outputs: {out_dir}/<game_id>/ ({len(todo)} played, {len(replay)} of them replayed, {done} "
          f"skipped as finished); compilation {', '.join(f'{k} {v:.2f}s' for k, v in engine.compile_s.items())}")
    return 0


def _setup() -> None:
    distributed.initialize()
    setup_jax()


#: ``generate GAMES.jsonl --flag ...``
COMMAND = game_command(define_flags, _generate, __doc__,
                       interrupted="finished games are kept; rerun the same command to resume", setup=_setup)


def main(argv: list[str] | None = None) -> int:
    """Plays every pending game of the JSONL file of ``argv`` (``GAMES.jsonl --flag ...``); returns
    the exit status (2 with a one-line message on bad input, 130 on Ctrl-C, 143 on SIGTERM, which stops
    generate like Ctrl-C: a game whose save has begun is saved first)."""
    return run("animegamer-generate", argv, COMMAND)


def cli() -> None:
    """Console script (pyproject.toml)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
