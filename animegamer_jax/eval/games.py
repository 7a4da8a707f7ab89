"""The games eval scores, played on the game engine (game/) and saved as ``generate`` saves them:
Table 1's benchmark (:func:`run_table1`), the identity games of a toy world (:func:`identity_report`),
a game script's predicted s_a (:func:`script_reps`); :func:`play_games` is generate's resumable loop.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence

import jax
import numpy as np

from animegamer_jax import parallel
from animegamer_jax.checkpoint import load_config, load_system
from animegamer_jax.eval import decoder as eval_decoder
from animegamer_jax.eval import embedders, identity
from animegamer_jax.eval.embedders import Embedder
from animegamer_jax.eval.table1 import run_benchmark
from animegamer_jax.eval.table1_games import load_benchmark
from animegamer_jax.game.characters import load_characters
from animegamer_jax.game.engine import GameEngine, batches
from animegamer_jax.game.loading import load_game_system, resolve_system
from animegamer_jax.game.folder import hud, layout
from animegamer_jax.game.folder.saves import fingerprint_of, pending_games, save_game
from animegamer_jax.game.script import load_jsonl
from animegamer_jax.inference.clip_sampler import sampling_component
from animegamer_jax.inference.instructions import Game
from animegamer_jax.inference.mode import apply_mode
from animegamer_jax.inference.standin_model import StandinTurnModel
from animegamer_jax.inference.turn_inputs import validate_games
from animegamer_jax.io import fileio, paths


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
    todo, done, replay = pending_games(
        games, out_dir, 0, 1, lambda g: fingerprint_of(engine.config, engine.model, g, seeds[g.game_id]), False)
    print(f"{out_dir}: {len(todo)} games to play, {done} already finished", flush=True)
    for group in batches(todo, engine.batch_size):
        for result in engine.play(group):
            save_game(engine.config, engine.model, result, out_dir, overwrite=result["game"].game_id in replay)
    return len(todo)


def engine_for(config, checkpoint: str, *, standin: bool = False, references: bool = False,
               rows: int = 1) -> GameEngine:
    """The engine that plays ``checkpoint`` (or the random stand-in) on this host's devices (a mesh of
    the config's), ``rows`` games per batched call; ``references``: the system must have the reference
    adapter."""
    mesh = parallel.mesh_from_config(config, devices=jax.local_devices())
    system = resolve_system(apply_mode(config), checkpoint, standin=standin, mesh=mesh,
                            need_references=references)
    return GameEngine(config, system, mesh=mesh, rows=rows)


def build_system(config, checkpoint: str = "", standin: bool = False):
    """The game system to evaluate: a system checkpoint, or the labelled random stand-in.

    Raises:
      ValueError: neither given.
    """
    if standin:
        return StandinTurnModel(config, seed=int(config.seed))
    return resolve_system(config, checkpoint, False)


def run_table1(config, benchmark_path: str, out_dir: str, *, system=None, checkpoint: str = "",
               standin: bool = False, embedder: Embedder | None = None, dreamsim: Embedder | None = None,
               games: Sequence[str] | None = None, write_games: bool = True, scope_fn=None,
               log=print) -> dict:
    """Builds the engine, plays every benchmark game (saving each under ``out_dir/games`` when
    ``write_games``) and writes the Table 1 report (eval/table1.py ``run_benchmark``); returns the report.

    Args:
      config: full config (sections game, data, eval and the model sections).
      benchmark_path: benchmark JSON (eval/table1_games.py format).
      out_dir: report folder.
      system: a ready ``TurnModel`` (inference/turn_model.py; tests); else from ``checkpoint`` / ``standin``.
      embedder, dreamsim, games, scope_fn, log: as for ``table1.run_benchmark``.

    Raises:
      BenchmarkError: a malformed benchmark (before anything is generated).
      OutputError / OSError: ``out_dir`` not writable.
    """
    t_start = time.perf_counter()
    bench = load_benchmark(benchmark_path)
    layout.check_writable(out_dir)
    if system is None:
        system = build_system(config, checkpoint, standin)
    engine = GameEngine(config, system)
    save = None
    if write_games:
        games_dir = str(paths.as_path(paths.join(out_dir, "games")))  # absolute, as logged

        def save(result: dict) -> None:
            save_game(engine.config, engine.model, result, games_dir, overwrite=True)  # a rerun replaces its own games

    return run_benchmark(engine, bench, out_dir, batches, save=save, embedder=embedder, dreamsim=dreamsim,
                         games=games, scope_fn=scope_fn, log=log, t_start=t_start)


def identity_games_file(out: str, games: list[dict]) -> str:
    """Writes OUT/games.jsonl (atomically), or keeps the same one; returns its path.

    Raises:
      ValueError: OUT holds a games.jsonl of other settings.
    """
    path = paths.join(out, "games.jsonl")
    text = "".join(json.dumps({k: g[k] for k in ("game_id", "seed", "turns")}) + "\n" for g in games)
    if fileio.exists(path):
        if fileio.read_bytes(path).decode("utf-8") != text:
            raise ValueError(f"{path}: games of other settings (--games_per_character, --turns, --seed or world); "
                             f"pass another --out or the settings it was made with")
        return path
    fileio.makedirs(out)
    fileio.write_text_atomic(path, text)
    return path


def identity_report(checkpoint: str, world: str, out: str, *, games_per_character: int, turns: int, seed: int,
                    frames_per_clip: int, max_batch: int = 1, decoder_clips: int = 0, dataset: str = "") -> dict:
    """Plays the identity games of the toy world ``world`` (eval/identity.py's docstring) with the system
    ``checkpoint`` into ``out/without`` and ``out/with`` (finished games kept), scores them and, with
    ``decoder_clips``, the decoder PSNR without / with a reference on ``dataset`` (default the config's
    data.dataset_dir); returns the report (``identity.render_markdown``'s input, ``accept`` included).

    Raises:
      FileNotFoundError: no such world (before the system loads). ValueError: ``out`` holds the games of
      other settings. The game's errors (game/errors.py) for a system that cannot play them.
    """
    names, refs, heldout = identity.toy_references(world)  # a missing world fails before the load
    config = load_config(checkpoint)
    games = identity.toy_games(world, games_per_character, turns, seed)
    games_path = identity_games_file(out, games)
    character_of = {g["game_id"]: names.index(g["character"]) for g in games}
    chars = load_characters([f"{n}={paths.join(world, 'characters', n, 'reference.png')}" for n in names])
    variants = {"without": load_jsonl(games_path)}
    variants["with"] = tuple(dataclasses.replace(g, characters=chars) for g in variants["without"])
    engine = engine_for(config, checkpoint, references=True, rows=max_batch)
    for v in identity.VARIANTS:
        play_games(engine, variants[v], paths.join(out, v))
    features = {"crop": identity.crop_feature, "standin": embedders.standin_embedder().image}
    by_feature = {feat: {} for feat in features}
    for v in identity.VARIANTS:
        clips, named = [], []
        for g in variants[v]:
            for clip in played_clips(paths.join(out, v, g.game_id)):
                clips.append(clip)
                named.append(character_of[g.game_id])
        for feat, embed in features.items():
            by_feature[feat][v] = identity.score_games(clips, named, refs, heldout, names, embed, frames_per_clip)
    chance = 1.0 / len(names)
    crop = by_feature["crop"]
    report = {"system": checkpoint, "world": world, "num_characters": len(names), "chance": chance,
              "games_per_character": games_per_character, "turns": turns, "seed": seed,
              "characters": {n: h for n, h in zip(names, heldout)}, "identity": by_feature}
    acc = {"heldout_with": crop["with"]["heldout"], "heldout_without": crop["without"]["heldout"]}
    acc["heldout_3x_chance"] = acc["heldout_with"] is not None and acc["heldout_with"] >= 3 * chance
    acc["heldout_2x_without"] = acc["heldout_with"] is not None and acc["heldout_with"] >= 2 * acc["heldout_without"]
    if decoder_clips:
        dataset = paths.resource(dataset or str(config.data.dataset_dir))
        dconfig = apply_mode(config)
        eval_decoder.check_dataset(dataset, dconfig)
        dit = sampling_component(dconfig)
        comps = load_system(checkpoint, dconfig, names=["shot_encoder", dit, "vae", "t5", "clip", "reference"])
        comps["dit"] = comps.pop(dit)
        res = {v: eval_decoder.decoder_psnr(comps, dconfig, dataset, decoder_clips, seed, reference=v == "with")
               for v in identity.VARIANTS}
        report["decoder"] = {"dataset": dataset, "clips": len(res["with"]["clips"]),
                             "without": res["without"]["sample"],
                             "with": res["with"]["sample"], "reconstruction": res["with"]["reconstruction"],
                             "per_clip": {v: res[v]["clips"] for v in identity.VARIANTS}}
        acc["decoder_drop_db"] = res["with"]["sample"] - res["without"]["sample"]
        acc["decoder_ok"] = acc["decoder_drop_db"] >= -0.5
    report["acceptance"] = acc
    return report


def script_reps(checkpoint: str, config, game: Game) -> list[np.ndarray]:
    """Plays the game script ``game`` with the system ``checkpoint`` (not saved); returns each turn's
    predicted s_a (``TurnResult.rep``)."""
    engine = GameEngine(config, load_game_system(checkpoint, config))
    return [t.rep for t in engine.play([game])[0]["turns"]]
