"""Per-turn time of the demo game, split into MLLM / sampling / VAE / writing, compilation apart.

Usage::

    python benchmarks/game_turn_bench.py [--config=configs/tiny.py] [--checkpoint=DIR | --standin]
        [--script=data/games/bunny.txt] [--repeat=2] [--config.x.y=v ...]

Flags and ``--config`` are play's (absl; animegamer_jax/commands/game_flags.py ``parse_game_flags``).

Without ``--checkpoint`` / ``--standin`` it plays ``config.game.checkpoint`` when that exists, else
the randomly initialised system of the config's sizes (as ``play --demo``). The game is played
``--repeat`` times on one engine: the first play includes compilation (reported separately, from
JAX's compile events), later plays must not compile at all (checked from the jit caches and the
compile-event counts, printed as "recompiles after turn 1").
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
from absl import flags  # noqa: E402

from animegamer_jax import parallel  # noqa: E402
from animegamer_jax.inference.turn_model import STAGES  # noqa: E402
from animegamer_jax.game.engine import GameEngine  # noqa: E402
from animegamer_jax.commands.game_flags import CLI_ERRORS, parse_game_flags  # noqa: E402
from animegamer_jax.inference.layout import setup_jax  # noqa: E402
from animegamer_jax.game.loading import resolve_system  # noqa: E402
from animegamer_jax.game.folder.saves import save_game  # noqa: E402
from animegamer_jax.game.script import load_script  # noqa: E402
from animegamer_jax.inference.mode import apply_mode  # noqa: E402


def main() -> None:
    def define(fv):
        flags.DEFINE_string("script", "data/games/bunny.txt", "Game script to play.", flag_values=fv)
        flags.DEFINE_integer("repeat", 2, "Plays of the game on one engine (the first compiles).", lower_bound=1,
                             flag_values=fv)

    setup_jax()
    try:
        args, rest, config = parse_game_flags("game_turn_bench.py", sys.argv[1:], define, __doc__)
    except CLI_ERRORS as e:
        sys.exit(f"error: {e}")
    if rest:
        sys.exit(f"error: unexpected arguments {rest}")
    mesh = parallel.mesh_from_config(config)
    t0 = time.perf_counter()
    system = resolve_system(apply_mode(config), args.checkpoint, args.standin, mesh=mesh, random_fallback=True)
    t_load = time.perf_counter() - t0
    engine = GameEngine(config, system, mesh=mesh)
    game = load_script(args.script, seed=int(config.game.seed))
    out_dir = args.out if args["out"].present else tempfile.mkdtemp(prefix="game_bench_")  # default: a temp folder
    print(f"system: {system.label}\nconfig {config.name} on {jax.device_count()} {jax.default_backend()} "
          f"device(s); {len(game.turns)} turns; load/init {t_load:.2f}s")
    rows = []
    for rep in range(args.repeat):
        before_c = dict(engine.compiles)
        before_s = dict(engine.compile_s)
        r = engine.play([game])[0]
        t = time.perf_counter()
        save_game(engine.config, engine.model, r, out_dir, overwrite=True)  # each repeat replaces its own game
        write_s = time.perf_counter() - t
        n = len(r["turns"])
        per = {s: [tm[f"{s}_s"] for tm in r["timings"]] for s in STAGES}
        comp = {s: engine.compile_s[s] - before_s[s] for s in STAGES}
        recompiles = {s: engine.compiles[s] - before_c[s] for s in STAGES}
        rows.append({"play": rep, "per_turn_s": per, "writing_s_per_turn": write_s / n, "compile_s": comp,
                     "compiles": recompiles})
        print(f"play {rep}: per turn (s, compile excluded): "
              + ", ".join(f"{s} " + "/".join(f"{v:.3f}" for v in per[s]) for s in STAGES)
              + f", writing {write_s / n:.3f}; compile " + ", ".join(f"{s} {comp[s]:.2f}s" for s in STAGES)
              + f"; compilations {recompiles}")
    later = sum(sum(row["compiles"].values()) for row in rows[1:])
    print(f"jit cache sizes {engine.cache_sizes()}; recompiles after the first play: {later}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
