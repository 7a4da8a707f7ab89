"""The toy world: a procedural game of named sprite characters, rendered with numpy (no download), that
knows the truth of every clip (the referee's ground truth, eval/referee.py). Its characters and backgrounds
are data/toy_sprites.py's, their motions and states data/toy_motion.py's; this module plans and writes it.

K characters (default 60: 48 seen, 12 held out) act on backgrounds (default the first 6) with the 13
actions of toy_motion.ACTIONS. A film shows ONE character in ``scenes_per_film`` scenes separated by hard
cuts; consecutive scenes differ in background (PySceneDetect finds every cut at the generator's frame), and
a scene starts in the state the one before it ended in. A scene's action never leaves the sprite's range
(toy_motion.feasible); a game's instruction that would is clamped (a walk stops at the wall).

Splits (all drawn from the seed and written in the manifest):
- held-out characters: ``num_heldout`` characters whose films go to ``heldout/`` (no phase reads it);
- held-out compositions: for every seen character a ``heldout_share`` of the (motion, background) pairs
  that none of its training films shows (``manifest["heldout_compositions"]``);
- game scripts (generate's JSONL, ``num_turns`` turns): ``games/seen.jsonl`` (seen characters, compositions
  their training films show), ``games/heldout_compositions.jsonl`` (seen characters, each turn one of its held-out
  compositions), ``games/heldout_characters.jsonl``, and ``games/long.jsonl`` (one game of ``long_turns``
  turns); ``games/truth.json`` holds each turn's truth (action, background, start and end state, states).

Command (also ``python -m animegamer_jax.commands.data sample --world=toy``):
  python -m animegamer_jax.commands.data sample --world=toy --out_dir data/prepared/toy

Writes into ``--out_dir``:
  train/<film_id>.mp4, heldout/<film_id>.mp4   H.264 films (video.write_film), film_id "toy_<name>_<k>"
  characters/<Name>/reference.png             each character centred on plain grey at the film size (the
                                              layout data.caption --characters reads)
  labels.jsonl                                the generator's ground truth as clip labels (label_schema) of
                                              every film, clips planned as data.prepare plans them
  games/*.jsonl, games/truth.json             the referee's game scripts and their truth (above)
  manifest.json                               characters (+ reference, heldout), backgrounds, held-out
                                              compositions, films with their scenes (frames, background,
                                              motion, action, start state) and cuts
Same arguments and seed: the same bytes (x264 single-threaded with fixed options). A folder that holds
other files than a toy world's is refused; files of an earlier toy world that the new one lacks are
removed.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tempfile

import numpy as np
from PIL import Image

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.data import clips as clips_lib
from animegamer_jax.data import label_schema, scenes, toy_motion, toy_sprites, video

FORMAT = "animegamer_jax.toy_world/2"
SPLITS = ("seen", "heldout_compositions", "heldout_characters", "long")
#: libx264 options of the films: with x264's macroblock tree on, the bytes of these small flat-colour films
#: vary from run to run (same frames); without it they repeat
X264_PARAMS = "mbtree=0"


def _pick(rng: np.random.Generator, options: list):
    return options[int(rng.integers(len(options)))]


def plan_world(num_characters: int = 60, num_heldout: int = 12, num_backgrounds: int = 6, films_per_character: int = 2,
               scenes_per_film: int = 8, scene_seconds: float = 2.0, heldout_share: float = 0.2,
               seed: int = 0) -> tuple[list[toy_sprites.Character], list[str], dict[str, list[list[str]]], list[dict]]:
    """(characters, held-out names, held-out compositions, films), all drawn from ``seed``.

    Held-out compositions: for each seen character ``round(heldout_share * 7 * num_backgrounds)`` [motion,
    background] pairs its films never show. Each film is {film_id, split, character, scenes: [{background,
    motion, quick, start}]}: consecutive scenes on different backgrounds, each scene starting at the state
    the one before it ended in (``start``: State.to_json) and feasible for ``scene_seconds`` (uniform over
    the feasible (background, action) pairs).

    Raises:
      ValueError: a count out of range (named as its flag).
    """
    chars = toy_sprites.make_characters(num_characters, seed)
    if not 0 <= num_heldout < num_characters:
        raise ValueError(f"--num_heldout={num_heldout}: must be 0..{num_characters - 1} (--num_characters - 1)")
    if not 2 <= num_backgrounds <= len(toy_sprites.BACKGROUNDS):
        raise ValueError(f"--num_backgrounds={num_backgrounds}: must be 2..{len(toy_sprites.BACKGROUNDS)} (a cut "
                         f"needs a new background)")
    if films_per_character < 1 or scenes_per_film < 1:
        raise ValueError("--films_per_character and --scenes_per_film must be >= 1")
    if not 0.0 <= heldout_share < 1.0:
        raise ValueError(f"--heldout_share={heldout_share}: must be in [0, 1)")
    rng = np.random.default_rng(seed)
    heldout = sorted((chars[i].name for i in rng.choice(num_characters, num_heldout, replace=False)),
                     key=[c.name for c in chars].index)
    bgs = list(toy_sprites.BACKGROUNDS)[:num_backgrounds]
    pairs = [[m, b] for m in toy_motion.MOTIONS for b in bgs]
    n_hold = int(round(heldout_share * len(pairs)))
    held_pairs = {c.name: sorted(pairs[int(i)] for i in rng.choice(len(pairs), n_hold, replace=False))
                  for c in chars if c.name not in heldout}
    films = []
    for c in chars:
        banned = {tuple(p) for p in held_pairs.get(c.name, ())}
        for k in range(films_per_character):
            state, prev, scene_list = toy_motion.START, None, []
            for _ in range(scenes_per_film):
                options = [(b, m, q) for b in bgs if b != prev for m, q in toy_motion.ACTIONS
                           if (m, b) not in banned and toy_motion.feasible(state, m, q, scene_seconds)]
                b, m, q = _pick(rng, options)
                scene_list.append({"background": b, "motion": m, "quick": q, "start": state.to_json()})
                state, prev = toy_motion.advance(state, m, q, scene_seconds), b
            films.append({"film_id": f"toy_{c.name.lower()}_{k}", "split": "heldout" if c.name in heldout else "train",
                          "character": c.name, "scenes": scene_list})
    return chars, heldout, held_pairs, films


def shown_compositions(films: list[dict]) -> dict[str, set[tuple[str, str]]]:
    """{character: {(motion, background)}} that the character's training films show (plan_world's films)."""
    out: dict[str, set[tuple[str, str]]] = {}
    for f in films:
        if f["split"] == "train":
            out.setdefault(f["character"], set()).update((s["motion"], s["background"]) for s in f["scenes"])
    return out


def plan_games(chars: list[toy_sprites.Character], heldout: list[str], held_pairs: dict, bgs: list[str], seconds: float,
               num_games: int = 32, num_turns: int = 6, long_turns: int = 100, seed: int = 0,
               shown: dict | None = None) -> dict[str, list[dict]]:
    """The referee's games per split (SPLITS; module docstring): {split: [{game_id, seed, character, turns:
    [{instruction, motion, quick, background, action, states, composition, start, end}]}]}.

    Each game starts at START and each turn's state is the one the turn before it ended in; a turn is drawn
    uniformly from the (background, action) pairs of its split that are feasible for ``seconds``: seen and
    long, the (motion, background) pairs the character's training films show (``shown``:
    :func:`shown_compositions`; without it, every pair not held out); held-out compositions, the
    character's held-out pairs; held-out characters, any. A turn with none feasible takes any pair not held
    out. ``composition`` says which each turn is: "shown", "unshown", "heldout" or "new_character".
    """
    seen = [c for c in chars if c.name not in heldout]
    held = [c for c in chars if c.name in heldout]
    out: dict[str, list[dict]] = {}
    for si, split in enumerate(SPLITS):
        rng = np.random.default_rng([seed, 31, si])
        pool = held if split == "heldout_characters" else seen
        n_games, n_turns = (1, long_turns) if split == "long" else (num_games, num_turns)
        if not pool or n_games < 1 or n_turns < 1:
            out[split] = []
            continue
        order = [pool[int(i)] for i in rng.permutation(len(pool))]
        games = []
        for g in range(n_games):
            c = order[g % len(order)]
            banned = {tuple(p) for p in held_pairs.get(c.name, ())}
            allowed = None if shown is None else shown.get(c.name, set())
            state, turns = toy_motion.START, []
            for _ in range(n_turns):
                every = [(b, m, q) for b in bgs for m, q in toy_motion.ACTIONS
                         if toy_motion.feasible(state, m, q, seconds)]
                free = [o for o in every if (o[1], o[0]) not in banned]
                if split == "heldout_compositions":
                    options = [o for o in every if (o[1], o[0]) in banned] or free
                elif split == "heldout_characters" or allowed is None:
                    options = free
                else:
                    options = [o for o in free if (o[1], o[0]) in allowed] or free
                b, m, q = _pick(rng, options)
                end = toy_motion.advance(state, m, q, seconds)
                kind = ("new_character" if c.name in heldout else "heldout" if (m, b) in banned
                        else "shown" if allowed is not None and (m, b) in allowed else "unshown")
                turns.append({"instruction": toy_motion.instruction(c.name, m, q, b), "motion": m, "quick": q,
                              "background": b, "action": toy_motion.action_text(m, q),
                              "states": list(toy_motion.state_changes(m, q)), "composition": kind,
                              "start": state.to_json(), "end": end.to_json()})
                state = end
            games.append({"game_id": f"{split.replace('_', '-')}-{g:02d}-{c.name.lower()}",
                          "seed": seed * 1_000_003 + si * 10_007 + g, "character": c.name, "turns": turns})
        out[split] = games
    return out


def scene_label(film_id: str, clip_index: int, start: float, character: str, scene: dict) -> label_schema.ClipLabel:
    """The ground-truth label of a clip of ``scene`` (a plan_world scene)."""
    sc, et, st = toy_motion.state_changes(scene["motion"], scene["quick"])
    return label_schema.ClipLabel(film_id, clip_index, float(start), (character,),
                                  toy_motion.action_text(scene["motion"], scene["quick"]),
                                  toy_sprites.BACKGROUNDS[scene["background"]], sc, et, st)


def _png(rgb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def _check_out_dir(out_dir: str) -> list[str]:
    """Files of an earlier toy world in ``out_dir`` (relative paths); raises FileExistsError when the folder
    holds anything else than a toy world."""
    if not fileio.isdir(out_dir) or not fileio.listdir(out_dir):
        return []
    manifest = paths.join(out_dir, "manifest.json")
    try:
        old = json.loads(fileio.read_bytes(manifest))
        assert str(old["format"]).startswith("animegamer_jax.toy_world/")
    except Exception:
        raise FileExistsError(f"--out_dir={out_dir}: holds files but no toy world manifest.json; pass an empty or "
                              f"new folder (or an earlier toy world's)") from None
    return [str(p) for p in old.get("files", [])]


def make_toy_world(out_dir: str, data_cfg, num_characters: int = 60, num_heldout: int = 12, num_backgrounds: int = 6,
                   films_per_character: int = 2, scenes_per_film: int = 8, scene_seconds: float = 2.0,
                   size: tuple[int, int] = toy_sprites.TOY_SIZE, fps: float = toy_motion.TOY_FPS, seed: int = 0,
                   heldout_share: float = 0.2, num_games: int = 32, num_turns: int = 6, long_turns: int = 100) -> dict:
    """Writes the toy world (module docstring) into ``out_dir`` and returns its manifest.

    Args:
      data_cfg: the `data` config section that plans the labelled clips (clips.plan_clips: num_frames, fps,
        clip_seconds, clip_stride_seconds), as data.prepare will be run with; a game turn lasts clip_seconds.
      size: (width, height), both even; fps: the films' frame rate; scene_seconds: length of every scene.
      heldout_share: share of (motion, background) pairs held out per seen character; num_games, num_turns:
        games per split and turns per game of the game scripts; long_turns: turns of the long game.

    Raises:
      ValueError: a count, size or length out of range; FileExistsError: ``out_dir`` holds other files.
    """
    if size[0] % 2 or size[1] % 2 or min(size) < 16:
        raise ValueError(f"--width/--height {size[0]}x{size[1]}: both must be even and >= 16")
    n = int(round(scene_seconds * fps))
    if n < 15 or n < round(float(data_cfg.clip_seconds) * fps):
        raise ValueError(f"--scene_seconds={scene_seconds}: a scene must hold one clip "
                         f"({data_cfg.clip_seconds} s) and 15 frames (PySceneDetect's shortest shot)")
    chars, heldout, held_pairs, films = plan_world(num_characters, num_heldout, num_backgrounds, films_per_character,
                                                   scenes_per_film, n / fps, heldout_share, seed)
    bgs = list(toy_sprites.BACKGROUNDS)[:num_backgrounds]
    seconds = float(data_cfg.clip_seconds)
    games = plan_games(chars, heldout, held_pairs, bgs, seconds, num_games, num_turns, long_turns, seed,
                       shown_compositions(films))
    stale = _check_out_dir(out_dir)
    refs = {c.name: f"characters/{c.name}/reference.png" for c in chars}
    game_files = [f"games/{s}.jsonl" for s in SPLITS if games[s]] + ["games/truth.json"]
    files = sorted([*refs.values(), "labels.jsonl", *game_files] + [f"{f['split']}/{f['film_id']}.mp4" for f in films])
    manifest = {"format": FORMAT, "complete": False, "seed": seed, "size": list(size), "fps": fps,
                "scene_seconds": scene_seconds, "heldout": heldout,
                "characters": [{**dataclasses.asdict(c), "description": c.description, "reference": refs[c.name],
                                "heldout": c.name in heldout} for c in chars],
                "backgrounds": {b: toy_sprites.BACKGROUNDS[b] for b in bgs}, "heldout_compositions": held_pairs,
                "clip_plan": {k: data_cfg.get(k, 0.0) for k in ("num_frames", "fps", "clip_seconds",
                                                                 "clip_stride_seconds")},
                "games": {s: f"games/{s}.jsonl" for s in SPLITS if games[s]}, "truth": "games/truth.json",
                "labels": "labels.jsonl", "films": [], "files": sorted(set(files) | set(stale))}
    fileio.makedirs(out_dir)
    fileio.write_text_atomic(paths.join(out_dir, "manifest.json"), json.dumps(manifest, indent=1) + "\n")
    for c in chars:
        fileio.makedirs(paths.join(out_dir, "characters", c.name))
        fileio.write_bytes_atomic(paths.join(out_dir, refs[c.name]), _png(toy_sprites.reference_image(c, size)))
    fileio.makedirs(paths.join(out_dir, "games"))
    for s in SPLITS:
        if games[s]:
            fileio.write_text_atomic(paths.join(out_dir, f"games/{s}.jsonl"), "".join(
                json.dumps({"game_id": g["game_id"], "seed": g["seed"], "turns": [t["instruction"] for t in g["turns"]]})
                + "\n" for g in games[s]))
    truth = {"format": FORMAT, "seconds": seconds, "clip_plan": manifest["clip_plan"], "size": list(size), "fps": fps,
             "splits": games}
    fileio.write_text_atomic(paths.join(out_dir, "games/truth.json"), json.dumps(truth, indent=1) + "\n")
    by_name = {c.name: c for c in chars}
    labels = []
    with tempfile.TemporaryDirectory() as tmp:
        for film in films:
            c, bgs_px = by_name[film["character"]], {}
            for k, s in enumerate(film["scenes"]):
                s.update(start_frame=k * n, end_frame=(k + 1) * n)

            def frames(film=film, c=c, bgs_px=bgs_px):
                for s in film["scenes"]:
                    bg = bgs_px.setdefault(s["background"], toy_sprites.background(s["background"], *size))
                    start = toy_motion.State.from_json(s["start"])
                    for i in range(n):
                        yield toy_motion.render_frame(c, bg, start, s["motion"], s["quick"], i / fps)

            local = os.path.join(tmp, "film.mp4")
            video.write_film(local, frames(), fps, x264_params=X264_PARAMS)
            rel = f"{film['split']}/{film['film_id']}.mp4"
            fileio.makedirs(paths.join(out_dir, film["split"]))
            fileio.write_bytes_atomic(paths.join(out_dir, rel), open(local, "rb").read())
            shots = [scenes.Scene(k, s["start_frame"], s["end_frame"]) for k, s in enumerate(film["scenes"])]
            for spec in clips_lib.plan_clips(film["film_id"], shots, fps, int(data_cfg.num_frames),
                                             float(data_cfg.fps), float(data_cfg.clip_seconds),
                                             float(data_cfg.get("clip_stride_seconds", 0.0))):
                labels.append(scene_label(film["film_id"], spec.clip_index, spec.start_time, c.name,
                                          film["scenes"][spec.scene_id]))
            for s in film["scenes"]:
                s["action"] = toy_motion.action_text(s["motion"], s["quick"])
            manifest["films"].append({**film, "path": rel, "num_frames": n * len(film["scenes"]),
                                      "cut_frames": [s["start_frame"] for s in film["scenes"][1:]]})
    body = "".join(json.dumps({"type": "film", "film_id": f["film_id"], "characters": [f["character"]]}) + "\n"
                   for f in films) + "".join(json.dumps(lab.to_json()) + "\n" for lab in labels)
    fileio.write_text_atomic(paths.join(out_dir, "labels.jsonl"), body)
    for rel in sorted(set(stale) - set(files)):
        if fileio.exists(paths.join(out_dir, rel)):
            fileio.remove(paths.join(out_dir, rel))
    manifest.update(complete=True, files=files)
    fileio.write_text_atomic(paths.join(out_dir, "manifest.json"), json.dumps(manifest, indent=1) + "\n")
    return manifest


def character_of(manifest: dict, name: str) -> toy_sprites.Character:
    """The toy_sprites.Character ``name`` of a manifest (ValueError naming the characters when absent)."""
    for c in manifest["characters"]:
        if c["name"] == name:
            return toy_sprites.Character(c["name"], c["shape"], c["colour"], c["colour2"], c["pattern"])
    raise ValueError(f"no character {name!r} in the toy world (characters: {[c['name'] for c in manifest['characters']]})")


def read_truth(out_dir: str) -> dict:
    """A toy world's games/truth.json (:func:`plan_games`' splits, ``seconds``, ``clip_plan``, ``size``).

    Raises:
      FileNotFoundError / ValueError: no finished toy world, or one made before game scripts (one line).
    """
    manifest = read_manifest(out_dir)
    if "truth" not in manifest:
        raise ValueError(f"{out_dir}: a toy world without game scripts ({manifest['format']}); make it again with "
                         f"python -m animegamer_jax.commands.data sample --world=toy --out_dir {out_dir}")
    return json.loads(fileio.read_bytes(paths.join(out_dir, manifest["truth"])))


def read_manifest(out_dir: str) -> dict:
    """A toy world's manifest.json.

    Raises:
      FileNotFoundError / ValueError: no manifest, another format, or an unfinished world (one line each).
    """
    path = paths.join(out_dir, "manifest.json")
    if not fileio.exists(path):
        raise FileNotFoundError(f"{out_dir}: no toy world (manifest.json); make one with "
                                f"python -m animegamer_jax.commands.data sample --world=toy --out_dir {out_dir}")
    manifest = json.loads(fileio.read_bytes(path))
    if manifest.get("format") != FORMAT or not manifest.get("complete"):
        raise ValueError(f"{path}: not a finished toy world ({FORMAT}); run the --world=toy command again")
    return manifest


def load_reference(out_dir: str, name: str) -> np.ndarray:
    """uint8 [H, W, 3] RGB: the reference image of character ``name`` of the toy world in ``out_dir``."""
    manifest = read_manifest(out_dir)
    rel = {c["name"]: c["reference"] for c in manifest["characters"]}
    if name not in rel:
        raise ValueError(f"{out_dir}: no character {name!r} (characters: {sorted(rel)})")
    return np.asarray(Image.open(io.BytesIO(fileio.read_bytes(paths.join(out_dir, rel[name])))).convert("RGB"))
