"""``python -m animegamer_jax.commands.eval``: the evaluation commands (the library is the rest of eval/).

Usage::

    python -m animegamer_jax.commands.eval --config=configs/tiny.py --checkpoint=DIR     # Table 1 (also: eval table1 ...)
    python -m animegamer_jax.commands.eval --standin --games=bunny-day          # random stand-in system, one game
    python -m animegamer_jax.commands.eval --checkpoint=DIR --config.eval.clip=/models/clip-vit-large-patch14 --out=outputs/eval
    python -m animegamer_jax.commands.eval identity --system DIR --world DIR --out DIR     # eval/identity.py
    python -m animegamer_jax.commands.eval game --system DIR --world DIR --out DIR         # the referee (eval/referee_games.py)
    python -m animegamer_jax.commands.eval representation --game data/games/sample_tour.txt  # eval/representation.py
    python -m animegamer_jax.commands.eval decoder --checkpoint DIR                       # eval/decoder.py
    python -m animegamer_jax.commands.eval vae --checkpoint DIR                           # eval/vae.py

``table1`` is the default subcommand (no subcommand, or a first argument that is a flag): it generates
every benchmark game and writes the Table 1 report (eval/table1.py). Any ``--config.a.b=value``
overrides a config field (unknown keys are errors): the benchmark file ``--config.eval.benchmark``, the
CLIP folder ``--config.eval.clip``, the mode ``--config.game.mode``. Writes ``<out>/report.md``, ``<out>/report.json``
and (unless ``--config.eval.write_games=false``) ``<out>/games/<game_id>/``. ``eval KIND --help`` lists a subcommand's
flags. This module parses flags and prints; eval/games.py plays and saves the games.
"""

from __future__ import annotations

import json
import os
import sys

import ml_collections
import numpy as np
from absl import flags
from ml_collections import config_flags
from PIL import Image

from animegamer_jax.checkpoint import SystemCheckpointError, load_config, load_system
from animegamer_jax.commands import cli as cli_lib
from animegamer_jax.config import ConfigError, SavedConfigError
from animegamer_jax.data import datasets, toy_world
from animegamer_jax.diffusion import samplers
from animegamer_jax.eval import decoder as eval_decoder
from animegamer_jax.eval import embedders, games, identity, referee, referee_games, representation
from animegamer_jax.eval import vae as eval_vae
from animegamer_jax.eval.embedders import embedder_from_config
from animegamer_jax.eval.table1 import render_markdown
from animegamer_jax.eval.table1_games import BenchmarkError
from animegamer_jax.game.errors import GAME_ERRORS
from animegamer_jax.game.loading import CheckpointError
from animegamer_jax.game.script import load_script
from animegamer_jax.inference.clip_sampler import sampling_component
from animegamer_jax.inference.instructions import GameScriptError
from animegamer_jax.inference.layout import setup_jax
from animegamer_jax.inference.mode import apply_mode
from animegamer_jax.inference.vae_decode import FRAME_RANGE
from animegamer_jax.io import fileio, media, paths

PROG = "python -m animegamer_jax.commands.eval"
#: the default ``--out`` of ``eval [table1]``: the report folder
OUT_DIR = "outputs/eval"
#: what a Ctrl-C leaves of the commands that play games
KEPT = "finished games are kept; rerun the same command to resume"


def _table1_flags(fv, argv: list[str]) -> None:
    """The flags of ``animegamer-eval [table1]`` on ``fv`` (absl + ml_collections config_flags)."""
    config_flags.DEFINE_config_file("config", paths.resource("configs/tiny.py"),
                                    "Config file; --config.a.b=value overrides a field.",
                                    flag_values=fv, lock_config=False, sys_argv=argv)
    flags.DEFINE_string("checkpoint", "", "System checkpoint directory (default config.game.checkpoint).",
                        flag_values=fv)
    flags.DEFINE_bool("standin", False, "Evaluate the random stand-in system (pipeline check).", flag_values=fv)
    flags.DEFINE_string("out", OUT_DIR, "Report folder, local or gs://.", flag_values=fv)
    flags.register_validator("out", bool, f"--out is empty. Fix: --out=DIR (default {OUT_DIR})", flag_values=fv)
    flags.DEFINE_list("games", [], "Comma-separated subset of game ids (default: all).", flag_values=fv)


def _table1_run(f) -> int:
    """``eval [table1]`` on parsed flags ``f``: plays the benchmark, prints the report."""
    config = f.config
    embedder = embedder_from_config(config.eval.clip)
    if config.eval.dreamsim:
        raise ConfigError("DreamSim scoring needs its ensemble (DINO + CLIP + OpenCLIP ViTs + LoRA), which is "
                          "not ported. Fix: leave config.eval.dreamsim empty (the column reads n/a)")
    report = games.run_table1(
        config, config.eval.benchmark, f.out,
        checkpoint=f.checkpoint, standin=f.standin, embedder=embedder, games=list(f.games) or None,
        write_games=bool(config.eval.write_games))
    print(render_markdown(report))
    return 0


def _identity_flags(fv, argv: list[str]) -> None:
    """The flags of ``eval identity`` on ``fv`` (absl)."""
    del argv
    flags.DEFINE_string("system", None, "System checkpoint trained on the toy world (with phase r's reference "
                        "component).", flag_values=fv)
    flags.DEFINE_string("world", None, "The toy world folder (characters/<Name>/reference.png, manifest.json).",
                        flag_values=fv)
    flags.DEFINE_string("out", None, "Output folder: games.jsonl, without/, with/, report.json, report.md.",
                        flag_values=fv)
    flags.DEFINE_bool("ground_truth", False, "Score the world's own films instead of a system's games (no "
                      "--system; the features' ceiling).", flag_values=fv)
    flags.DEFINE_integer("games_per_character", 4, "Games per character.", lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("turns", 3, "Turns per game.", lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("seed", 0, "Draws the games' motions, backgrounds and seeds.", flag_values=fv)
    flags.DEFINE_integer("frames_per_clip", 4, "Frames of each clip compared with the references (0 = all).",
                         lower_bound=0, flag_values=fv)
    flags.DEFINE_integer("max_batch", 1, "Games per batched model call (generate's --max_batch).", lower_bound=1,
                         flag_values=fv)
    flags.DEFINE_integer("decoder_clips", 12, "Clips of --dataset scored for the decoder PSNR without / with a "
                         "reference (0 = skip).", lower_bound=0, flag_values=fv)
    flags.DEFINE_string("dataset", "", "Prepared dataset for the decoder PSNR (default: the system config's "
                        "data.dataset_dir, its training clips).", flag_values=fv)


def _required(f, *names: str) -> None:
    for name in names:
        if not getattr(f, name):
            raise cli_lib.UsageError(f"--{name} is required")


def _write_report(out: str, report: dict, md: str) -> None:
    """Writes OUT/report.json and OUT/report.md; prints the table and where they are."""
    fileio.makedirs(out)
    fileio.write_text_atomic(paths.join(out, "report.json"), json.dumps(report, indent=1) + "\n")
    fileio.write_text_atomic(paths.join(out, "report.md"), md)
    print(md + f"wrote {paths.join(out, 'report.json')} and report.md")


def _identity_run(f, *rest: str) -> int:
    """``eval identity`` on parsed flags ``f``: plays and scores the identity games (eval/games.py)."""
    if rest:
        raise cli_lib.UsageError(f"unexpected arguments {list(rest)}")
    if f.ground_truth:
        return _identity_ground_truth(f)
    _required(f, "system", "world", "out")
    report = games.identity_report(paths.resource(f.system), f.world, f.out,
                                   games_per_character=f.games_per_character, turns=f.turns, seed=f.seed,
                                   frames_per_clip=f.frames_per_clip, max_batch=f.max_batch,
                                   decoder_clips=f.decoder_clips, dataset=f.dataset)
    _write_report(f.out, report, identity.render_markdown(report))
    return 0


def _identity_ground_truth(f) -> int:
    """``--ground_truth``: both features on the world's own films; prints a table, writes OUT/ground_truth.json."""
    _required(f, "world")
    names, refs, heldout = identity.toy_references(f.world)
    clips, named = identity.ground_truth_clips(f.world)
    features = {"crop": identity.crop_feature, "standin": embedders.standin_embedder().image}
    res = {feat: identity.score_games(clips, named, refs, heldout, names, embed, f.frames_per_clip)
           for feat, embed in features.items()}
    lines = [f"Ground truth of {f.world}: {len(clips)} clips, {len(names)} characters (chance "
             f"{identity.pct(1.0 / len(names))})", "", "| feature | seen | held-out | all |", "|---|---|---|---|"]
    pct = identity.pct
    lines += [f"| {feat} | {pct(r['seen'])} | {pct(r['heldout'])} | {pct(r['all'])} |" for feat, r in res.items()]
    print("\n".join(lines))
    if f.out:
        fileio.makedirs(f.out)
        fileio.write_text_atomic(paths.join(f.out, "ground_truth.json"), json.dumps(
            {"world": f.world, "chance": 1.0 / len(names), "identity": res}, indent=1) + "\n")
    return 0


def _game_flags(fv, argv: list[str]) -> None:
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


def _kind(f) -> str:
    chosen = [k for k in referee_games.KINDS[1:] if getattr(f, k)]
    if len(chosen) > 1:
        raise cli_lib.UsageError(f"pass one of --ground_truth, --standin, --retrieval (got {chosen})")
    if not chosen and not f.system:
        raise cli_lib.UsageError("pass --system DIR (or --ground_truth, --standin or --retrieval)")
    if chosen and chosen[0] == "retrieval" and f.system:
        raise cli_lib.UsageError("--retrieval plays no system; drop --system")
    return chosen[0] if chosen else "system"


def _game_run(f, *rest: str) -> int:
    """``eval game`` on parsed flags ``f``: the referee's report (eval/referee_games.py)."""
    if rest:
        raise cli_lib.UsageError(f"unexpected arguments {list(rest)}")
    _required(f, "world", "out")
    kind = _kind(f)
    bad = sorted(set(f.splits) - set(toy_world.SPLITS))
    if bad or not f.splits:
        raise cli_lib.UsageError(f"--splits: unknown {bad or 'none given'}; choose from {list(toy_world.SPLITS)}")
    world, out = (str(paths.as_path(p)).rstrip("/") for p in (f.world, f.out))
    if paths.is_url(world) == paths.is_url(out) and not paths.is_url(world):
        world, out = os.path.realpath(world), os.path.realpath(out)
    if out == world or out.startswith(world + "/"):
        raise cli_lib.UsageError(f"--out {f.out} is inside the world {f.world}; pass a folder outside it")
    report = referee_games.referee_report(f.world, f.out, kind, f.splits, f.games,
                                          checkpoint=paths.resource(f.system) if f.system else "",
                                          references=f.references, pixels=f.pixels, max_batch=f.max_batch)
    _write_report(f.out, report, referee.render_markdown(report))
    return 0


#: ``eval game --help``
_GAME_DOC = """``python -m animegamer_jax.commands.eval game``: the referee (eval/referee.py) on a toy world's game scripts
(eval/referee_games.py).

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


def _representation_flags(fv, argv: list[str]) -> None:
    """The flags of ``python -m animegamer_jax.commands.eval representation`` on ``fv`` (absl)."""
    flags.DEFINE_string("game", None, "Game script to play (one instruction a line, game/script.py).", flag_values=fv)
    flags.DEFINE_string("checkpoint", "checkpoints/tiny_system", "System checkpoint.", flag_values=fv)
    flags.DEFINE_string("dataset", "", "Prepared dataset whose clips to compare with (default: the checkpoint "
                        "config's data.dataset_dir, its training clips).", flag_values=fv)
    flags.DEFINE_string("json", "", "Also write the figures to this JSON file.", flag_values=fv)


def _fmt(c: dict | None, action: bool = False) -> str:
    if c is None:
        return "none"
    return f"{c['film_id']}#{c['clip_index']}" + (f" ({c['action']!r})" if action else "") + f" {c['mse']:.3f}"


def _representation_run(f, *rest: str) -> int:
    """``eval representation`` on parsed flags ``f`` (a bad input raises; ``cli.run_command`` reports it)."""
    if rest:
        raise cli_lib.UsageError(f"unexpected arguments {list(rest)}")
    if not f.game:
        raise cli_lib.UsageError("--game is required: a game script, e.g. data/games/sample_tour.txt")
    game = load_script(paths.resource(f.game))
    ckpt = paths.resource(f.checkpoint)
    config = load_config(ckpt)
    dataset = paths.resource(f.dataset or str(config.data.dataset_dir))
    eval_decoder.check_dataset(dataset, config)  # before the load: a wrong or missing dataset fails fast
    if f.json:
        fileio.write_text_atomic(f.json, "{}")  # an unwritable --json fails before the run
    # E_a first: a checkpoint without T5 / CLIP fails before the game is played
    components = load_system(ckpt, config, names=["shot_encoder", "t5", "clip"])
    clip_reps, rows = representation.clip_representations(components, config, dataset)
    res = representation.turn_distances(games.script_reps(ckpt, config, game), [t.motion for t in game.turns],
                                        clip_reps, rows)
    for k, (turn, r) in enumerate(zip(game.turns, res)):
        mean = "none" if r["mse_to_mean"] is None else f"{r['mse_to_mean']:.3f}"
        print(f"turn {k + 1} {turn.motion!r}: {r['clips']} clip(s) with this action; MSE to their mean {mean}, "
              f"nearest {_fmt(r['nearest'])}, farthest {_fmt(r['farthest'])}; nearest of another action "
              f"{_fmt(r['nearest_other_action'], action=True)}; mean square of the prediction "
              f"{r['rep_mean_square']:.3f}")
    ms = np.mean(clip_reps ** 2, axis=(1, 2))
    print(f"{ckpt}: {len(res)} turns of {f.game} against E_a of the {len(rows)} clips of {dataset} (MSE over "
          f"Q x D; the clips' own mean squares {ms.min():.2f}-{ms.max():.2f})")
    if f.json:
        fileio.write_text_atomic(f.json, json.dumps({"game": f.game, "checkpoint": ckpt, "dataset": dataset,
                                                     "turns": res}, indent=1))
    return 0


def _decoder_own_flags(fv) -> None:
    flags.DEFINE_string("checkpoint", "checkpoints/tiny_system", "System checkpoint (E_a, DiT, VAE, T5, CLIP).",
                        flag_values=fv)
    flags.DEFINE_string("dataset", "", "Prepared dataset of clips to score (default: the checkpoint config's "
                        "data.dataset_dir, its training clips).", flag_values=fv)
    flags.DEFINE_integer("clips", 12, "Clips to score, evenly spaced over the dataset.", flag_values=fv)
    flags.DEFINE_integer("seed", 0, "Noise seed of the first scored clip (the k-th uses seed + k).", flag_values=fv)
    flags.DEFINE_bool("reference", False, "Sample each clip with a reference image: the first frame of another "
                      "clip of the same character (phase r's pairs; needs a system trained with phase r).",
                      flag_values=fv)
    flags.DEFINE_string("json", "", "Also write the figures to this JSON file.", flag_values=fv)
    flags.DEFINE_string("sheet", "", "Also write a PNG here: a row a scored clip, its middle frame, the VAE's "
                        "reconstruction of it and the sample.", flag_values=fv)


def _decoder_flags(fv, argv: list[str]) -> None:
    """The flags of ``python -m animegamer_jax.commands.eval decoder`` on ``fv`` (absl) and ``--config``: the config
    saved in ``--checkpoint`` (``config_flags.DEFINE_config_dict``), whose fields ``--config.a.b=value``
    overrides (e.g. ``--config.diffusion.sampler=student``; unknown keys are errors).

    Raises:
      SavedConfigError: no readable config in ``--checkpoint`` (not for ``--help``).
    """
    _decoder_own_flags(fv)
    saved = ml_collections.ConfigDict()
    probe = cli_lib.probe_flags(_decoder_own_flags, argv)  # --checkpoint, before --config exists
    if probe is not None:
        try:
            saved = load_config(paths.resource(probe.checkpoint))
        except (SystemCheckpointError, ConfigError, OSError) as e:
            raise SavedConfigError(str(e)) from None
    config_flags.DEFINE_config_dict("config", saved, "The config saved in --checkpoint; --config.a.b=value "
                                    "overrides a field, e.g. --config.diffusion.sampler=student.",
                                    flag_values=fv, lock_config=False, sys_argv=argv)


def _decoder_run(f, *rest: str) -> int:
    """``eval decoder`` on parsed flags ``f`` (a bad input raises; ``cli.run_command`` reports it)."""
    if rest:
        raise cli_lib.UsageError(f"unexpected arguments {list(rest)}")
    if f.clips < 1:
        raise cli_lib.UsageError(f"--clips={f.clips}: score at least one clip")
    ckpt = paths.resource(f.checkpoint)
    config = f.config
    known = (*samplers.SAMPLERS, samplers.STUDENT)
    if config.diffusion.sampler not in known:
        raise cli_lib.UsageError(f"--config.diffusion.sampler={config.diffusion.sampler!r} is not a sampler. Fix: "
                                 f"one of {', '.join(known)}")
    config = apply_mode(config)  # as play samples; the summary line shows the sampler used
    dataset = paths.resource(f.dataset or str(config.data.dataset_dir))
    eval_decoder.check_dataset(dataset, config)  # before the load: a wrong or missing dataset fails fast
    if f.json:
        fileio.write_text_atomic(f.json, "{}")  # an unwritable --json fails before the run
    if f.sheet and not paths.is_url(f.sheet) and not fileio.isdir(paths.as_path(f.sheet).parent):
        raise FileNotFoundError(f"--sheet={f.sheet}: its folder does not exist")  # before the run, not after
    sampler_dit = sampling_component(config)
    components = load_system(ckpt, config, names=["shot_encoder", sampler_dit, "vae", "t5", "clip"]
                             + (["reference"] if f.reference else []))
    components["dit"] = components.pop(sampler_dit)
    res = eval_decoder.decoder_psnr(components, config, dataset, f.clips, f.seed, keep_frames=bool(f.sheet),
                                    reference=f.reference)
    d = config.diffusion
    for c in res["clips"]:
        print(f"clip {c['index']} ({c['film_id']}, ML {c['motion_level']}, {c['action']!r}): sample "
              f"{c['sample']:.2f} dB, VAE reconstruction {c['reconstruction']:.2f} dB")
    print(f"{ckpt}: decoder sample PSNR {res['sample']:.2f} dB (VAE reconstruction {res['reconstruction']:.2f} "
          f"dB) over {len(res['clips'])} of the {res['dataset_clips']} clips ({len(res['dataset_films'])} films) "
          f"of {dataset}; {d.sampler} {d.num_sampling_steps} steps, DynamicCFG {d.cfg_schedule} scale "
          f"{float(d.cfg_scale):g}"
          f"{'; with a reference image (another clip of the same character)' if f.reference else ''}")
    if f.sheet:
        media.save_image(f.sheet, Image.fromarray(media.contact_sheet(res.pop("frames"), 3, FRAME_RANGE)),
                            format="PNG")
        print(f"wrote {f.sheet}: one row per clip, its frame | the VAE's reconstruction | the sample")
    if f.json:
        fileio.write_text_atomic(f.json, json.dumps(res, indent=1))
    return 0


def _vae_flags(fv, argv: list[str]) -> None:
    """The flags of ``python -m animegamer_jax.commands.eval vae`` on ``fv`` (absl + ml_collections config_flags)."""
    config_flags.DEFINE_config_file("config", paths.resource("configs/tiny.py"),
                                    "With --train_workdir: the run's config file; --config.a.b=value overrides.",
                                    flag_values=fv, lock_config=False, sys_argv=argv)
    flags.DEFINE_string("checkpoint", "checkpoints/tiny_system", "System checkpoint holding a VAE.", flag_values=fv)
    flags.DEFINE_string("train_workdir", "", "Instead: the newest checkpoint of a 'vae' train --workdir.",
                        flag_values=fv)
    flags.DEFINE_string("dataset", "", "Prepared dataset whose clips the VAE trained on (default "
                        "train.vae_eval_dataset_dir, else train.vae_dataset_dir of the checkpoint's / run's config, "
                        "else data.dataset_dir).", flag_values=fv)
    flags.DEFINE_integer("frames", 17, "Frames per clip window (1 + 4k).", flag_values=fv)
    flags.DEFINE_integer("max_per_film", 0, "Score at most this many held-out frames per film (0: all).",
                         flag_values=fv)
    flags.DEFINE_string("json", "", "Also write the figures to this JSON file.", flag_values=fv)


def _vae_run(f) -> int:
    """``eval vae`` on parsed flags ``f`` (a bad input raises; ``cli.run_command`` reports it)."""
    if f.train_workdir:
        config = f.config
        vae, step = eval_vae.vae_from_train_workdir(f.train_workdir, config)
        source = f"{os.path.abspath(f.train_workdir)} step {step}"
    else:
        config = load_config(f.checkpoint)
        vae = load_system(f.checkpoint, config, names=["vae"])["vae"]
        source = os.path.abspath(f.checkpoint)
    dataset = f.dataset or str(config.train.get("vae_eval_dataset_dir", "") or config.train.get("vae_dataset_dir", "")
                               or config.data.dataset_dir)
    # the set the "vae" phase read (pipeline.make_data): its clips must be the scored set's
    trained_on = str(config.train.get("vae_dataset_dir", "") or config.data.dataset_dir)
    if not f.dataset and os.path.abspath(trained_on) != os.path.abspath(dataset):
        if os.path.isdir(trained_on):
            eval_vae.check_same_segments(trained_on, dataset)
        else:
            print(f"note: {trained_on} (the VAE's training set) is not here, so the held-out frames of "
                  f"{dataset} are not checked against its clips", file=sys.stderr)
    held = eval_vae.held_out_frames(dataset, f.max_per_film)
    if not held:
        raise ValueError(f"{dataset}: every film frame lies in a clip; no held-out frames to score")
    res = eval_vae.reconstruction_psnr(vae, held, f.frames)
    res.update(checkpoint=source, dataset=os.path.abspath(dataset),
               height=int(held[0].frames.shape[1]), width=int(held[0].frames.shape[2]))
    for film, r in res["per_film"].items():
        clip = "n/a" if r["clip"] is None else f"{r['clip']:.2f} dB"
        print(f"{film}: frame PSNR {r['frame']:.2f} dB over {r['num_frames_scored']} held-out frames; "
              f"{f.frames}-frame clip PSNR {clip} over {r['num_clips']} clips")
    clip = "n/a" if res["clip"] is None else f"{res['clip']:.2f} dB"
    print(f"{source}: VAE reconstruction PSNR at {res['height']}x{res['width']} on held-out frames: frame "
          f"{res['frame']:.2f} dB ({res['num_frames_scored']} frames), clip {clip} ({res['num_clips']} clips of "
          f"{f.frames})")
    if f.json:
        with open(f.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


#: the subcommands: ``eval [table1] | identity | game | representation | decoder | vae``
COMMANDS = {
    "table1": cli_lib.Command(_table1_flags, _table1_run, __doc__, errors=(
        ConfigError, BenchmarkError, FileNotFoundError, KeyError, ValueError, OSError)),
    "identity": cli_lib.Command(_identity_flags, _identity_run, identity.__doc__, positional=None, errors=(
        *GAME_ERRORS, ConfigError, FileNotFoundError, SystemCheckpointError, datasets.DatasetError, ValueError,
        OSError), interrupted=KEPT, setup=setup_jax),
    "game": cli_lib.Command(_game_flags, _game_run, _GAME_DOC, positional=None, errors=(
        *GAME_ERRORS, ConfigError, FileNotFoundError, SystemCheckpointError, ValueError, OSError), interrupted=KEPT,
        setup=setup_jax),
    "representation": cli_lib.Command(_representation_flags, _representation_run, representation.__doc__,
                                      positional=None, errors=(
        ConfigError, FileNotFoundError, SystemCheckpointError, datasets.DatasetError, GameScriptError,
        CheckpointError, ValueError, OSError)),
    "decoder": cli_lib.Command(_decoder_flags, _decoder_run, eval_decoder.__doc__, positional=None, errors=(
        ConfigError, FileNotFoundError, SystemCheckpointError, datasets.DatasetError, SavedConfigError, ValueError,
        OSError)),
    "vae": cli_lib.Command(_vae_flags, _vae_run, eval_vae.__doc__, errors=(
        ConfigError, FileNotFoundError, SystemCheckpointError, KeyError, ValueError, OSError)),
}


def main(argv: list[str] | None = None) -> int:
    """``eval [KIND] ...``: runs the subcommand of :data:`COMMANDS` (``table1`` when the first argument is a flag
    or there is none); returns its exit status (2 with one line on bad input)."""
    return cli_lib.run(PROG, argv, COMMANDS, __doc__, default="table1")


def cli() -> None:
    """Console script ``animegamer-eval`` (pyproject.toml)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
