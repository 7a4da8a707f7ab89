"""The referee's games (``eval game``, eval/referee.py): a toy world's game scripts played by a system
or the stand-in (eval/games.py), or the floors and ceiling that play none (the engine's own render of
each turn, the nearest training clip), every turn scored against the world's truth.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from animegamer_jax.checkpoint import load_config, load_system
from animegamer_jax.config import load_config as load_config_file
from animegamer_jax.data import toy_motion, toy_world
from animegamer_jax.eval import referee
from animegamer_jax.eval import vae as eval_vae
from animegamer_jax.eval.games import engine_for, play_games, played_clips, played_states
from animegamer_jax.game.characters import load_characters
from animegamer_jax.game.script import load_jsonl
from animegamer_jax.io import paths

#: the config whose data size the referee reads clips at when no system is played
WORLD_CONFIG = "configs/toy_world.py"
#: what plays the games: a system checkpoint, the engine's own render, the random stand-in, the nearest clip
KINDS = ("system", "ground_truth", "standin", "retrieval")


def retrieval_scenes(manifest: dict) -> list[tuple[str, dict]]:
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


def _played(world: str, out: str, manifest: dict, chosen: dict, config, checkpoint: str, standin: bool,
            references: bool, max_batch: int) -> tuple[dict, dict]:
    """Plays the chosen games of each split into ``out/games/<split>/``; returns their clips and states."""
    engine = engine_for(config, checkpoint, standin=standin, references=references, rows=max_batch)
    clips, states = {}, {}
    for split, picked in chosen.items():
        games = {g.game_id: g for g in load_jsonl(paths.join(world, manifest["games"][split]))}
        play = []
        for g in picked:
            game = games[g["game_id"]]
            if references:
                ref = paths.join(world, "characters", g["character"], "reference.png")
                game = dataclasses.replace(game, characters=load_characters([f"{g['character']}={ref}"]))
            play.append(game)
        out_dir = paths.join(out, "games", split)
        play_games(engine, play, out_dir)
        clips[split] = [played_clips(paths.join(out_dir, g["game_id"])) for g in picked]
        states[split] = [played_states(paths.join(out_dir, g["game_id"])) for g in picked]
    return clips, states


def _unplayed(kind: str, manifest: dict, chosen: dict, ref: referee.Referee, times, through) -> tuple[dict, dict]:
    """The clips and states of ``ground_truth`` (the engine's render, ``through`` a VAE when given) or
    ``retrieval`` (the nearest training scene) for the chosen games."""
    scenes = retrieval_scenes(manifest)
    clips, states = {}, {}
    for split, picked in chosen.items():
        clips[split], states[split] = [], []
        for g in picked:
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
    return clips, states


def referee_report(world: str, out: str, kind: str, splits: Sequence[str], games: int, *, checkpoint: str = "",
                   references: bool = True, pixels: bool = True, max_batch: int = 1) -> dict:
    """Plays (or, for ``ground_truth`` / ``retrieval``, renders) the first ``games`` games of each of
    ``splits`` of the toy world ``world`` and scores every turn; returns the report (eval/referee.py's keys,
    ``render_markdown``'s input). Played games are saved under ``out/games/<split>/`` (finished ones kept).

    Args:
      kind: one of :data:`KINDS`; ``checkpoint``: the system (``system``; with ``ground_truth`` its VAE
        round-trips the clips; with ``standin`` its config sizes the stand-in).

    Raises:
      ValueError: the system plays clips of another length or frame rate than the world's turns.
      FileNotFoundError: no such world. The game's errors (game/errors.py) for a system that cannot play.
    """
    manifest, truth = toy_world.read_manifest(world), toy_world.read_truth(world)
    splits = [s for s in toy_world.SPLITS if s in splits and truth["splits"].get(s)]
    chosen = {s: truth["splits"][s][:games] for s in splits}
    config = load_config(checkpoint) if checkpoint else load_config_file(paths.resource(WORLD_CONFIG))
    ref = referee.Referee(manifest, int(config.data.height), int(config.data.width))
    plan = truth["clip_plan"]
    times = toy_motion.turn_times(float(truth["seconds"]), int(plan["num_frames"]), float(plan["fps"]),
                                 float(truth["fps"]))
    if kind in ("system", "standin"):
        if (int(config.data.num_frames), float(config.data.fps)) != (int(plan["num_frames"]), float(plan["fps"])):
            raise ValueError(f"{checkpoint or WORLD_CONFIG} plays {config.data.num_frames} frames at "
                             f"{config.data.fps} fps but {world}'s turns are {plan['num_frames']} at {plan['fps']}: "
                             f"score a system trained on this world's clips")
        clips, states = _played(world, out, manifest, chosen, config, checkpoint, kind == "standin", references,
                                max_batch)
    else:
        # ground truth with a checkpoint: the clips through that system's VAE (its decoder's ceiling)
        through = eval_vae.roundtrip(load_system(checkpoint, config, names=["vae"])["vae"]) if checkpoint else None
        clips, states = _unplayed(kind, manifest, chosen, ref, times, through)
    scored, rows = {}, []
    for split in splits:
        scored[split] = []
        for g, gclips, gstates in zip(chosen[split], clips[split], states[split]):
            turns = []
            for k, (t, clip, st) in enumerate(zip(g["turns"], gclips, gstates)):
                s = ref.score_turn(clip, t, g["character"], times, st, pixels=pixels)
                turns.append(s)
                rows.append({"split": split, "game_id": g["game_id"], "turn": k, "character": g["character"],
                             "instruction": t["instruction"], **s})
            scored[split].append(turns)
    system = (f"{checkpoint} (its VAE)" if kind == "ground_truth" else checkpoint) if checkpoint else kind
    return {"world": world, "system": system, "kind": kind, "games_per_split": {s: len(chosen[s]) for s in splits},
            **referee.summarize(scored, manifest), "turns": rows}

