"""Identity accuracy: which of K character references each generated clip looks like.

Command (a system trained on a toy world, data/toy_world.py, and that world)::

  python -m animegamer_jax.commands.eval identity --system DIR --world DIR --out DIR \
      [--games_per_character 4] [--turns 3] [--seed 0] [--decoder_clips 12] [--dataset DIR]

plays, for each of the world's K characters (held out or not), ``--games_per_character`` games of
``--turns`` turns whose instructions name it (``Character: NAME; Motion: ...; Background: ...``, motions
and backgrounds drawn from the world's labelled scenes by ``--seed``; ``OUT/games.jsonl``), twice with
the same seeds: ``OUT/without/`` as ``python -m animegamer_jax.commands.generate`` plays them, ``OUT/with/`` with
``--character NAME=WORLD/characters/NAME/reference.png`` for all K (the same engine, game/engine.py).
Then it scores every turn's clip (read back from its turn video, cut from under the HUD) with
:func:`identity_accuracy` in both features below, for seen and held-out characters and per character,
and (``--decoder_clips`` > 0) the decoder PSNR without and with a reference on ``--dataset`` (default
the system config's ``data.dataset_dir``, its training clips: seen characters; eval/decoder.py
``decoder_psnr``, ``reference``). Writes ``OUT/report.json`` and ``OUT/report.md``. Rerunning resumes:
finished games are kept (generate's check, game/folder/saves.py ``pending_games``).

  python -m animegamer_jax.commands.eval identity --ground_truth --world DIR [--out DIR]

scores the world's own films instead (no system: :func:`ground_truth_clips`), the features' ceiling.

For each clip, the mean cosine between its sampled frames and each reference image in an image
embedding (an :class:`embedders.Embedder`'s ``image``: CLIP with local weights, else the labelled
random-feature stand-in, the features CLIP-I uses; ``metrics.cosine_matrix``); the clip's predicted
character is the reference of the highest mean. Accuracy is the share of clips whose predicted
character is the one the turn named; chance is 1/K.

  names, refs, heldout = identity.toy_references("data/prepared/toy")         # K names, uint8 [K, H, W, 3]
  res = identity.identity_accuracy(clips, [names.index(n) for n in named], refs, embedder.image)
  res["accuracy"], res["chance"]                                               # e.g. 0.75, 0.125
  res = identity.identity_accuracy(clips, named_idx, refs, identity.crop_feature)  # the sprite feature

Two image features serve as ``image_embed``: an embedder's (CLIP, or the stand-in, a random projection
of a 16x16 thumbnail of the whole frame) and :func:`crop_feature`, a thumbnail of the frame's
foreground only (flat sprites on backgrounds that reach the frame border, as in the toy world). The
whole-frame features are dominated by the background and the sprite's position and size; the crop
feature is not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from animegamer_jax.io import paths

from animegamer_jax.io import media
from animegamer_jax.data import toy_sprites, toy_world
from animegamer_jax.eval import metrics

#: :func:`crop_feature`'s defaults: colour cell width (levels), border ring width (px), background
#: tolerance (cells), thumbnail side (cells), the crop box's percentiles (%), fewest foreground pixels
CELL, BORDER, TOLERANCE, SIZE, PERCENTILE, MIN_PIXELS = 8, 6, 5, 16, 2.0, 4
_GREY = 128.0


def toy_references(world_dir: str) -> tuple[list[str], np.ndarray, list[bool]]:
    """The K references of a toy world (``characters/<Name>/reference.png``, data/toy_world.py):
    (names in the manifest's order, uint8 [K, H, W, 3], held-out flags).

    Raises:
      FileNotFoundError / ValueError: no finished toy world at ``world_dir`` (one line).
    """
    chars = toy_world.read_manifest(world_dir)["characters"]
    names = [str(c["name"]) for c in chars]
    return names, np.stack([toy_world.load_reference(world_dir, n) for n in names]), [bool(c["heldout"]) for c in chars]


def identity_scores(clips: Sequence[np.ndarray], references: np.ndarray,
                    image_embed: Callable[[np.ndarray], np.ndarray], frames_per_clip: int = 4) -> np.ndarray:
    """float64 [N, K]: for each clip (uint8 [T, H, W, 3]) the mean cosine between its
    ``frames_per_clip`` evenly spaced frames (all when <= 0; ``metrics.sample_frame_indices``) and each
    reference (uint8 [K, H', W', 3]; any size the embedder takes) in ``image_embed``'s space.

    Raises:
      ValueError: no references, or a clip that is not [T, H, W, 3].
    """
    refs = np.asarray(references)
    if refs.ndim != 4 or not len(refs):
        raise ValueError(f"references must be uint8 [K, H, W, 3] with K >= 1, got shape {refs.shape}")
    ref_emb = image_embed(refs.astype(np.uint8))
    out = np.zeros((len(clips), len(refs)))
    for i, clip in enumerate(clips):
        clip = np.asarray(clip)
        if clip.ndim != 4 or clip.shape[-1] != 3:
            raise ValueError(f"clip {i}: expected uint8 [T, H, W, 3], got shape {clip.shape}")
        frames = clip[metrics.sample_frame_indices(len(clip), frames_per_clip)].astype(np.uint8)
        out[i] = metrics.cosine_matrix(image_embed(frames), ref_emb).mean(axis=0)
    return out


def identity_accuracy(clips: Sequence[np.ndarray], named: Sequence[int], references: np.ndarray,
                      image_embed: Callable[[np.ndarray], np.ndarray], frames_per_clip: int = 4) -> dict:
    """Identity accuracy of ``clips`` whose turns named the characters ``named`` (index into
    ``references``, one per clip): {"accuracy": share in [0, 1], "chance": 1 / K, "num_clips": N,
    "predicted": [K index per clip], "per_character": {index: {"accuracy", "num_clips"}}}
    (:func:`identity_scores`; ties go to the lower index).

    Raises:
      ValueError: ``named`` of another length than ``clips``, an index outside [0, K), or no clips.
    """
    named = [int(k) for k in named]
    k = len(references)
    if len(named) != len(clips) or not clips:
        raise ValueError(f"need one named character per clip and at least one clip: {len(clips)} clips, "
                         f"{len(named)} names")
    if any(not 0 <= n < k for n in named):
        raise ValueError(f"named characters {named} must index the {k} references")
    pred = identity_scores(clips, references, image_embed, frames_per_clip).argmax(axis=1)
    hit = pred == np.asarray(named)
    per = {c: {"accuracy": float(hit[np.asarray(named) == c].mean()), "num_clips": int((np.asarray(named) == c).sum())}
           for c in sorted(set(named))}
    return {"accuracy": float(hit.mean()), "chance": 1.0 / k, "num_clips": len(clips),
            "predicted": [int(p) for p in pred], "per_character": per}


def _dilate(occupied: np.ndarray, radius: int) -> np.ndarray:
    """bool [N, C, C, C] -> bool [N, C, C, C]: True within ``radius`` cells (Chebyshev) of a True cell."""
    out = occupied
    for axis in (1, 2, 3):
        grown = out.copy()
        for shift in range(1, radius + 1):
            lo = [slice(None)] * 4
            hi = [slice(None)] * 4
            lo[axis], hi[axis] = slice(shift, None), slice(None, -shift)
            grown[tuple(lo)] |= out[tuple(hi)]
            grown[tuple(hi)] |= out[tuple(lo)]
        out = grown
    return out


def foreground_mask(frames: np.ndarray, border: int = BORDER, tolerance: int = TOLERANCE,
                    cell: int = CELL) -> np.ndarray:
    """bool [N, H, W]: the pixels of uint8 frames [N, H, W, 3] whose colour is not the background's.

    The background's colours are those of each frame's border ring (``border`` px wide): a pixel is
    background when its colour cell (each channel // ``cell``) lies within ``tolerance`` cells
    (Chebyshev, i.e. about ``tolerance * cell`` levels per channel) of a border pixel's cell. Assumes
    the background reaches the frame border and the foreground neither touches the ring nor shares the
    background's colours (a sprite that reaches the ring makes its own colours background).
    """
    frames = np.asarray(frames, np.uint8)
    n, h, w, _ = frames.shape
    levels = 256 // cell
    codes = frames.astype(np.int32) // cell
    codes = (codes[..., 0] * levels + codes[..., 1]) * levels + codes[..., 2]  # [N, H, W]
    b = max(1, min(border, h // 2, w // 2))
    ring = np.concatenate([codes[:, :b].reshape(n, -1), codes[:, -b:].reshape(n, -1),
                           codes[:, :, :b].reshape(n, -1), codes[:, :, -b:].reshape(n, -1)], axis=1)
    occupied = np.zeros((n, levels ** 3), bool)
    occupied[np.arange(n)[:, None], ring] = True
    near = _dilate(occupied.reshape(n, levels, levels, levels), int(tolerance)).reshape(n, -1)
    return ~near[np.arange(n)[:, None, None], codes]


def _quantile_edges(counts: np.ndarray, q: float) -> tuple[np.ndarray, np.ndarray]:
    """int [N] first and last index where the cumulative share of ``counts`` [N, L] passes q and 1 - q."""
    cum = np.cumsum(counts, axis=1)
    total = cum[:, -1:]
    lo = np.argmax(cum > q * total, axis=1)
    hi = np.argmax(cum >= (1.0 - q) * total, axis=1)
    return lo, np.maximum(hi, lo)


def crop_feature(frames: np.ndarray, size: int = SIZE, percentile: float = PERCENTILE, border: int = BORDER,
                 tolerance: int = TOLERANCE, min_pixels: int = MIN_PIXELS) -> np.ndarray:
    """A frame's foreground, cropped and thumbnailed: uint8 [N, H, W, 3] -> float64 [N, size * size * 3].

    The foreground (:func:`foreground_mask`) is put on grey (128), cropped to the box between its
    ``percentile`` and ``100 - percentile`` percentiles of rows and of columns (stray pixels do not widen
    it), and area-averaged onto ``size`` x ``size`` cells; values are pixel / 255 - 0.5. So the feature
    is the sprite's shape and colours regardless of where it is, how large, and on which background
    (compare with cosine, ``metrics.cosine_matrix``). A frame with fewer than ``min_pixels`` foreground
    pixels gets zeros (cosine 0 with everything). Assumes flat sprites on backgrounds that reach the
    frame border (the toy world); a reference image (one sprite on plain grey) gives its sprite.
    """
    frames = np.asarray(frames, np.uint8)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 [N, H, W, 3], got shape {frames.shape}")
    n, h, w, _ = frames.shape
    mask = foreground_mask(frames, border, tolerance)
    img = np.where(mask[..., None], frames.astype(np.float64), _GREY)
    y0, y1 = _quantile_edges(mask.sum(axis=2), percentile / 100.0)
    x0, x1 = _quantile_edges(mask.sum(axis=1), percentile / 100.0)
    # cell k of a box [a, b] spans [a + floor(k * len / size), a + floor((k + 1) * len / size)), >= 1 px
    k = np.arange(size + 1)
    ey = y0[:, None] + (k[None] * (y1 - y0 + 1)[:, None]) // size  # [N, size + 1]
    ex = x0[:, None] + (k[None] * (x1 - x0 + 1)[:, None]) // size
    ys, ye = ey[:, :-1], np.minimum(np.maximum(ey[:, 1:], ey[:, :-1] + 1), h)
    xs, xe = ex[:, :-1], np.minimum(np.maximum(ex[:, 1:], ex[:, :-1] + 1), w)
    integral = np.zeros((n, h + 1, w + 1, 3))
    integral[:, 1:, 1:] = img.cumsum(axis=1).cumsum(axis=2)
    idx = np.arange(n)[:, None, None]

    def at(yy, xx):  # integral[n, yy[n, i], xx[n, j]] -> [N, size, size, 3]
        return integral[idx, yy[:, :, None], xx[:, None, :]]

    area = ((ye - ys)[:, :, None] * (xe - xs)[:, None, :])[..., None]
    cells = (at(ye, xe) - at(ys, xe) - at(ye, xs) + at(ys, xs)) / area
    out = (cells / 255.0 - 0.5).reshape(n, -1)
    out[mask.sum(axis=(1, 2)) < min_pixels] = 0.0
    return out


VARIANTS = ("without", "with")  # references off / on: OUT/without/, OUT/with/


def toy_games(world_dir: str, per_character: int, turns: int, seed: int = 0) -> list[dict]:
    """The games of the command (module docstring): per character of the world's manifest (its order),
    ``per_character`` games ``{"game_id": "<name>-<g>", "seed": ..., "turns": [instruction, ...],
    "character": NAME}`` whose ``turns`` instructions name it, each with a (motion, background) of one
    of the world's scenes drawn by ``seed`` (numpy ``default_rng([seed, character, game])``)."""
    manifest = toy_world.read_manifest(world_dir)
    scenes = sorted({(sc["action"], toy_sprites.BACKGROUNDS[sc["background"]])
                     for film in manifest["films"] for sc in film["scenes"]})
    out = []
    for k, c in enumerate(manifest["characters"]):
        for g in range(per_character):
            rng = np.random.default_rng([seed, k, g])
            picks = [scenes[int(i)] for i in rng.integers(len(scenes), size=turns)]
            out.append({"game_id": f"{c['name'].lower()}-{g}", "seed": seed * 100003 + k * 1009 + g,
                        "turns": [f"Character: {c['name']}; Motion: {m}; Background: {b}." for m, b in picks],
                        "character": c["name"]})
    return out


def ground_truth_clips(world_dir: str, num_frames: int = 17, stride: int = 50) -> tuple[list[np.ndarray], list[int]]:
    """The toy world's own films as clips: every ``stride`` frames of each film of the manifest (train and
    held out), ``num_frames`` frames each (uint8 [num_frames, H, W, 3], film size), and the index of each
    film's character in the manifest's order."""
    manifest = toy_world.read_manifest(world_dir)
    names = [c["name"] for c in manifest["characters"]]
    clips, named = [], []
    for film in manifest["films"]:
        frames = media.read_video(paths.join(world_dir, film["path"]))[0]
        for start in range(0, max(1, len(frames) - num_frames + 1), stride):
            clips.append(frames[start:start + num_frames])
            named.append(names.index(film["character"]))
    return clips, named


def score_games(clips: Sequence[np.ndarray], named: Sequence[int], references: np.ndarray, heldout: Sequence[bool],
                names: Sequence[str], image_embed, frames_per_clip: int = 4) -> dict:
    """:func:`identity_accuracy` of ``clips`` (``named``: index of the character each turn named) over all
    clips and split by seen / held-out characters: {"all", "seen", "heldout": accuracy or None (no clips),
    "num_clips": {...}, "per_character": {name: accuracy}}."""
    res = identity_accuracy(clips, named, references, image_embed, frames_per_clip)
    hit = np.asarray(res["predicted"]) == np.asarray(named)
    held = np.asarray([heldout[n] for n in named])
    out = {"all": res["accuracy"], "num_clips": {"all": len(clips)}, "per_character": {}}
    for key, sel in (("seen", ~held), ("heldout", held)):
        out[key] = float(hit[sel].mean()) if sel.any() else None
        out["num_clips"][key] = int(sel.sum())
    for k, v in res["per_character"].items():
        out["per_character"][names[k]] = v["accuracy"]
    return out


def pct(v) -> str:
    """A share in [0, 1] as ``"75.0 %"``; None as ``"n/a"``."""
    return "n/a" if v is None else f"{100 * v:.1f} %"


def render_markdown(report: dict) -> str:
    """report.md: identity accuracy per feature and references, seen / held-out, per character; decoder PSNR."""
    lines = [f"Identity accuracy, {report['num_characters']} characters (chance {pct(report['chance'])}), "
             f"{report['games_per_character']} games x {report['turns']} turns per character; system "
             f"{report['system']}, world {report['world']}.", "",
             "| feature | references | seen | held-out | all |", "|---|---|---|---|---|"]
    for feat, by in report["identity"].items():
        for v in VARIANTS:
            r = by[v]
            lines.append(f"| {feat} | {v} | {pct(r['seen'])} | {pct(r['heldout'])} | {pct(r['all'])} |")
    names = list(report["characters"])
    lines += ["", "| feature | references | " + " | ".join(
        f"{n}{' (held out)' if report['characters'][n] else ''}" for n in names) + " |",
              "|---|---|" + "---|" * len(names)]
    for feat, by in report["identity"].items():
        for v in VARIANTS:
            lines.append(f"| {feat} | {v} | " + " | ".join(pct(by[v]["per_character"].get(n)) for n in names) + " |")
    d = report.get("decoder")
    if d:
        lines += ["", f"Decoder PSNR on {d['clips']} clips of {d['dataset']} (seen characters): "
                  f"{d['without']:.2f} dB without a reference, {d['with']:.2f} dB with one "
                  f"(VAE reconstruction {d['reconstruction']:.2f} dB)."]
    a = report["acceptance"]
    lines += ["", f"Held-out with reference (crop feature) {pct(a['heldout_with'])}: >= 3x chance "
              f"{a['heldout_3x_chance']}, >= 2x without ({pct(a['heldout_without'])}) {a['heldout_2x_without']}"
              + (f"; decoder PSNR with - without {a['decoder_drop_db']:+.2f} dB >= -0.5 dB {a['decoder_ok']}"
                 if d else "")]
    return "\n".join(lines) + "\n"
