"""``python -m animegamer_jax.commands.eval game``: the referee (eval/referee.py) on a toy world's game scripts.

Usage::

    python -m animegamer_jax.commands.eval game --system DIR --world DIR --out DIR   # a trained system
    python -m animegamer_jax.commands.eval game --ground_truth --world DIR --out DIR # the engine's own clips: the ceiling
    python -m animegamer_jax.commands.eval game --ground_truth --system DIR ...     # those clips through DIR's VAE
    python -m animegamer_jax.commands.eval game --standin --world DIR --out DIR      # the random stand-in: a floor
    python -m animegamer_jax.commands.eval game --retrieval --world DIR --out DIR    # the nearest training clip: a floor

Plays the world's game scripts (``WORLD/games/<split>.jsonl``: seen, heldout_compositions,
heldout_characters, long; ``--games`` of each, ``--splits``) as ``generate`` plays them (the same engine,
``OUT/games/<split>/<game_id>/``; a rerun keeps finished games), with ``--character NAME=WORLD/characters/
NAME/reference.png`` for each game's character unless ``--noreferences``; then scores every turn (its clip
read back from the turn video, the HUD cut off; its states from game.json) against ``WORLD/games/
truth.json``. ``--ground_truth`` scores the engine's own render of each turn made as a training clip is
made (H.264 at the world's size, decoded, resized: ``Referee.film_clip``), ``--retrieval`` the training
clip (of the world's train/ films) that matches the instruction best (character, then action, then
background), rendered from that scene's own start: neither plays a system.

Writes ``OUT/report.json`` (keys in eval/referee.py: ``splits.<split>.<column>``, ``chance.<column>``,
``by_turn.<column>``; ``turns``: every scored turn) and ``OUT/report.md``; prints the table.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np
from absl import flags

from animegamer_jax.commands import cli as cli_lib
from animegamer_jax import parallel
from animegamer_jax.checkpoint import SystemCheckpointError, load_config, load_system
from animegamer_jax.config import ConfigError
from animegamer_jax.config import load_config as load_config_file
from animegamer_jax.data import toy_motion, toy_world
from animegamer_jax.eval import referee
from animegamer_jax.eval import vae as eval_vae
from animegamer_jax.game.folder import hud, layout
from animegamer_jax.game.characters import load_characters
from animegamer_jax.game.engine import GameEngine, batches
from animegamer_jax.game.errors import GAME_ERRORS
from animegamer_jax.game.loading import resolve_system
from animegamer_jax.game.folder.saves import fingerprint_of, pending_games, save_game
from animegamer_jax.game.script import load_jsonl
from animegamer_jax.inference.layout import setup_jax
from animegamer_jax.inference.mode import apply_mode
from animegamer_jax.inference.turn_inputs import validate_games
from animegamer_jax.io import fileio, paths

PROG = "python -m animegamer_jax.commands.eval game"
#: the config whose data size the referee reads clips at when no system is played
WORLD_CONFIG = "configs/toy_world.py"
KINDS = ("system", "ground_truth", "standin", "retrieval")


def played_clips(game_dir: str) -> list[np.ndarray]:
    """Every turn's clip of a saved game, uint8 [T, h, w, 3] (turn videos cut from under the HUD)."""
    rec = layout.read_json(paths.join(game_dir, layout.GAME_JSON))
    return [hud.clip_from_hud(layout.read_video(paths.join(game_dir, t["video"])), rec["save"]["frame_size"])
            for t in rec["turns"]]


def played_states(game_dir: str) -> list[tuple[int, int, int]]:
    """Every turn's predicted (SC, ET, ST) of a saved game (game.json)."""
    rec = layout.read_json(paths.join(game_dir, layout.GAME_JSON))
    return [(int(t["states"]["SC"]), int(t["states"]["ET"]), int(t["states"]["ST"])) for t in rec["turns"]]


def play_games(engine: GameEngine, games, out_dir: str) -> int:
    """Plays every pending game of ``games`` into ``out_dir`` (generate's loop: finished games are kept);
    returns how many were played."""
    layout.check_writable(out_dir, keep=False)
    validate_games(games, engine.spec, engine.tok)
    seeds = {g.game_id: engine.game_seed(g) for g in games}
    todo, done, replay = pending_games(games, out_dir, 0, 1, lambda g: fingerprint_of(engine.config, engine.model, g, seeds[g.game_id]),
                                       False)
    print(f"{out_dir}: {len(todo)} games to play, {done} already finished", flush=True)
    for group in batches(todo, engine.batch_size):
        for result in engine.play(group):
            save_game(engine.config, engine.model, result, out_dir, overwrite=result["game"].game_id in replay)
    return len(todo)


def _flags(fv, argv: list[str]) -> None:
    """The flags of ``eval game`` on ``fv`` (absl)."""
    del argv
    flags.DEFINE_string("system", None, "System checkpoint trained on the toy world.", flag_values=fv)
    flags.DEFINE_string("world", None, "The toy world folder (manifest.json, games/, characters/).", flag_values=fv)
    flags.DEFINE_string("out", None, "Output folder: games/<split>/, report.json, report.md.", flag_values=fv)
    flags.DEFINE_bool("ground_truth", False, "Score the engine's own render of every turn (with --system: "
                      "encoded and decoded by its VAE).", flag_values=fv)
    flags.DEFINE_bool("standin", False, "Play the random stand-in system (configs/toy_world.py, or --system's "
                      "config).", flag_values=fv)
    flags.DEFINE_bool("retrieval", False, "Score the training clip nearest each instruction (no system).",
                      flag_values=fv)
    flags.DEFINE_integer("games", 32, "Games of each split (the first N of its script; the long split has one).",
                         lower_bound=1, flag_values=fv)
    flags.DEFINE_list("splits", list(toy_world.SPLITS), "Splits to play and score.", flag_values=fv)
    flags.DEFINE_bool("references", True, "Play each game with --character NAME=its reference image.",
                      flag_values=fv)
    flags.DEFINE_bool("pixels", True, "Score PSNR / SSIM against the engine's render.", flag_values=fv)
    flags.DEFINE_integer("max_batch", 1, "Games per batched model call (generate's --max_batch).", lower_bound=1,
                         flag_values=fv)


def _retrieval_scenes(manifest: dict) -> list[tuple[str, dict]]:
    """(character, scene) of every scene of the world's training films, in manifest order."""
    return [(f["character"], s) for f in manifest["films"] if f["split"] == "train" for s in f["scenes"]]


def retrieve(scenes: list[tuple[str, dict]], character: str, turn: dict) -> tuple[str, dict]:
    """The training scene nearest a turn: the same character first, then motion, then speed, then background
    (lexicographic); the first of the best in manifest order."""
    def key(item):
        c, s = item
        same_m = s["motion"] == turn["motion"]
        return (c == character, same_m, same_m and bool(s["quick"]) == bool(turn["quick"]),
                s["background"] == turn["background"])
    return max(scenes, key=key)


def _kind(f) -> str:
    chosen = [k for k in KINDS[1:] if getattr(f, k)]
    if len(chosen) > 1:
        raise cli_lib.UsageError(f"pass one of --ground_truth, --standin, --retrieval (got {chosen})")
    if not chosen and not f.system:
        raise cli_lib.UsageError("pass --system DIR (or --ground_truth, --standin or --retrieval)")
    if chosen and chosen[0] == "retrieval" and f.system:
        raise cli_lib.UsageError("--retrieval plays no system; drop --system")
    return chosen[0] if chosen else "system"


def _run(f, *rest: str) -> int:
    """The body of :func:`main` on parsed flags ``f``."""
    if rest:
        raise cli_lib.UsageError(f"unexpected arguments {list(rest)}")
    for name in ("world", "out"):
        if not getattr(f, name):
            raise cli_lib.UsageError(f"--{name} is required")
    kind = _kind(f)
    bad = sorted(set(f.splits) - set(toy_world.SPLITS))
    if bad or not f.splits:
        raise cli_lib.UsageError(f"--splits: unknown {bad or 'none given'}; choose from {list(toy_world.SPLITS)}")
    world, out = (str(paths.as_path(p)).rstrip("/") for p in (f.world, f.out))
    if paths.is_url(world) == paths.is_url(out) and not paths.is_url(world):
        world, out = os.path.realpath(world), os.path.realpath(out)
    if out == world or out.startswith(world + "/"):
        raise cli_lib.UsageError(f"--out {f.out} is inside the world {f.world}; pass a folder outside it")
    manifest, truth = toy_world.read_manifest(f.world), toy_world.read_truth(f.world)
    splits = [s for s in toy_world.SPLITS if s in f.splits and truth["splits"].get(s)]
    chosen = {s: truth["splits"][s][:f.games] for s in splits}
    ckpt = paths.resource(f.system) if f.system else ""
    config = load_config(ckpt) if ckpt else load_config_file(paths.resource(WORLD_CONFIG))
    ref = referee.Referee(manifest, int(config.data.height), int(config.data.width))
    plan = truth["clip_plan"]
    times = toy_motion.turn_times(float(truth["seconds"]), int(plan["num_frames"]), float(plan["fps"]),
                                 float(truth["fps"]))
    if kind in ("system", "standin") and (int(config.data.num_frames), float(config.data.fps)) != (
            int(plan["num_frames"]), float(plan["fps"])):
        raise cli_lib.UsageError(f"{ckpt or WORLD_CONFIG} plays {config.data.num_frames} frames at {config.data.fps} "
                                 f"fps but {f.world}'s turns are {plan['num_frames']} at {plan['fps']}: score a "
                                 f"system trained on this world's clips")
    clips: dict[str, list[list[np.ndarray]]] = {}
    states: dict[str, list[list[tuple[int, int, int]]]] = {}
    if kind in ("system", "standin"):
        mesh = parallel.mesh_from_config(config, devices=jax.local_devices())
        system = resolve_system(apply_mode(config), ckpt, standin=kind == "standin", mesh=mesh,
                                need_references=bool(f.references))
        engine = GameEngine(config, system, mesh=mesh, rows=f.max_batch)
        for split in splits:
            games = {g.game_id: g for g in load_jsonl(paths.join(f.world, manifest["games"][split]))}
            play = []
            for g in chosen[split]:
                game = games[g["game_id"]]
                if f.references:
                    chars = load_characters([f"{g['character']}={paths.join(f.world, 'characters', g['character'], 'reference.png')}"])
                    game = dataclasses.replace(game, characters=chars)
                play.append(game)
            out_dir = paths.join(f.out, "games", split)
            play_games(engine, play, out_dir)
            clips[split] = [played_clips(paths.join(out_dir, g["game_id"])) for g in chosen[split]]
            states[split] = [played_states(paths.join(out_dir, g["game_id"])) for g in chosen[split]]
    else:
        scenes = _retrieval_scenes(manifest)
        # --ground_truth --system DIR: the clips through that system's VAE (its decoder's ceiling)
        through = eval_vae.roundtrip(load_system(ckpt, config, names=["vae"])["vae"]) if ckpt else None
        for split in splits:
            clips[split], states[split] = [], []
            for g in chosen[split]:
                cs, ss = [], []
                for t in g["turns"]:
                    if kind == "ground_truth":
                        clip = ref.film_clip(t, g["character"], times)
                        cs.append(through(clip) if through else clip)
                        ss.append(tuple(t["states"]))
                    else:
                        c, s = retrieve(scenes, g["character"], t)
                        cs.append(ref.truth_clip(s, c, times))
                        ss.append(toy_motion.state_changes(s["motion"], bool(s["quick"])))
                clips[split].append(cs)
                states[split].append(ss)
    scored, rows = {}, []
    for split in splits:
        scored[split] = []
        for g, gclips, gstates in zip(chosen[split], clips[split], states[split]):
            turns = []
            for k, (t, clip, st) in enumerate(zip(g["turns"], gclips, gstates)):
                s = ref.score_turn(clip, t, g["character"], times, st, pixels=f.pixels)
                turns.append(s)
                rows.append({"split": split, "game_id": g["game_id"], "turn": k, "character": g["character"],
                             "instruction": t["instruction"], **s})
            scored[split].append(turns)
    report = {"world": f.world, "system": (f"{ckpt} (its VAE)" if kind == "ground_truth" else ckpt) if ckpt else kind,
              "kind": kind, "games_per_split": {s: len(chosen[s]) for s in splits},
              **referee.summarize(scored, manifest), "turns": rows}
    md = referee.render_markdown(report)
    fileio.makedirs(f.out)
    fileio.write_text_atomic(paths.join(f.out, "report.json"), json.dumps(report, indent=1) + "\n")
    fileio.write_text_atomic(paths.join(f.out, "report.md"), md)
    print(md + f"wrote {paths.join(f.out, 'report.json')} and report.md")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``eval game``: the referee (module docstring); returns the exit status (2 with one line on bad input)."""
    setup_jax()
    return cli_lib.run_command(PROG, argv, _flags, __doc__, None, _run,
                               (*GAME_ERRORS, ConfigError, FileNotFoundError, SystemCheckpointError, ValueError,
                                OSError),
                               interrupted="finished games are kept; rerun the same command to resume")
