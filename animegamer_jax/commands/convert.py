"""``python -m animegamer_jax.commands.convert <kind> SRC DST [flags]``: outside checkpoints -> our orbax layout.

Every kind takes absl flags after (or between) its positional paths, and a config file where the
sizes come from one: ``--config=configs/release_tiny.py --config.dit.num_layers=2`` (without
``--config`` the overrides apply to configs/animegamer_2b_7b.py). SRC and DST may be URLs.

Kinds (each takes ``--help``):
  mistral           HF Mistral folder (sharded safetensors + index, or pytorch_model.bin)
  animegamer-mllm   the release MLLM pytorch_model.bin (peft names; LoRA kept or merged)
  clip              open_clip ViT-B-16 state dict or an HF CLIP folder
  t5                HF T5EncoderModel safetensors
  dit               SAT mp_rank_00_model_states.pt folder or diffusers CogVideoXTransformer3DModel
                    (``dit migrate OLD NEW``: a system checkpoint of the flat legacy DiT block layout)
  vae               SAT 3d-vae.pt or diffusers AutoencoderKLCogVideoX
  release           the whole release download (checkpoints/ folder) -> one system checkpoint
  check-release     play a recorded release turn on a converted system; per-stage max |diff|
"""

import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from absl import flags
from ml_collections import config_flags

from animegamer_jax import checkpoint, parallel

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.commands import cli as cli_lib
from animegamer_jax.convert import check_release, migrate, release
from animegamer_jax.game.engine import GameEngine
from animegamer_jax.game.loading import CheckpointError, load_game_system
from animegamer_jax.models.clip import convert as clip_convert
from animegamer_jax.models.clip.model import CLIPConfig
from animegamer_jax.models.cogvideox import dit_convert, vae_convert
from animegamer_jax.models.cogvideox.dit import DiTConfig
from animegamer_jax.models.cogvideox.vae import VAEConfig
from animegamer_jax.models.mistral import convert as mistral_convert
from animegamer_jax.models.mistral import mllm_convert
from animegamer_jax.models.mistral.mllm import MLLMConfig
from animegamer_jax.models.t5 import convert as t5_convert
from animegamer_jax.models.t5.model import T5Config
from animegamer_jax.weights import ConversionError, load_state_dict, save_state

PROG = "python -m animegamer_jax.commands.convert"
#: the config file whose sections give the sizes when no --config is given
DEFAULT_CONFIG = "configs/animegamer_2b_7b.py"


@dataclasses.dataclass(frozen=True)
class Family:
    """One network family's converter, as the shared run path (:func:`convert_family`) uses it:
    ``model_config(f, SRC)`` -> ``load(f, SRC)`` (the state dict) -> ``convert(f, SRC, state dict,
    model config)`` (a library converter of ``models/``) -> ``save(f, DST, converted, model config)``,
    which writes under DST and returns the one line printed."""

    doc: str  #: the --help text
    model_config: Callable[[flags.FlagValues, str], Any]
    convert: Callable[[flags.FlagValues, str, dict[str, Any], Any], Any]
    save: Callable[[flags.FlagValues, str, Any, Any], str]
    load: Callable[[flags.FlagValues, str], dict[str, Any]] = lambda f, src: load_state_dict(src)
    #: the config section with the sizes (``--config``, ``--config.<section>.x=v``); None: no --config
    section: str | None = None
    sizes_note: str = ""  #: said after "has the sizes" in --config's help
    extra_flags: Callable[[flags.FlagValues], None] = lambda fv: None  #: the family's own flags
    positional: tuple[str, str] = ("SRC", "DST")


def _hf_config(f: flags.FlagValues) -> dict[str, Any]:
    """The ``--hf_config`` JSON file as a dict."""
    return json.loads(paths.as_path(f.hf_config).read_text())


def _write_json(path: str, value: Any, **kw: Any) -> None:
    paths.as_path(path).write_text(json.dumps(value, **kw))


# --- mistral ---------------------------------------------------------------------------------

def _mistral_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_string("param_dtype", "bfloat16", "dtype of the stored parameters (and of compute).", flag_values=fv)
    flags.DEFINE_integer("vocab_size", None, "Only for an already resized checkpoint (default: config.json's).",
                         flag_values=fv)


def _mistral_config(f: flags.FlagValues, src: str) -> mistral_convert.MistralConfig:
    over: dict[str, Any] = {"param_dtype": f.param_dtype, "dtype": f.param_dtype}
    if f.vocab_size:
        over["vocab_size"] = f.vocab_size
    return mistral_convert.config_from_hf(mistral_convert.load_hf_config(src), **over)


def _mistral_save(f: flags.FlagValues, dst: str, state: Any, cfg: Any) -> str:
    fileio.makedirs(dst)
    save_state(state, paths.join(dst, "params"))
    _write_json(paths.join(dst, "mistral_config.json"),
                {k: (str(v) if not isinstance(v, (int, float, tuple, type(None))) else v)
                 for k, v in dataclasses.asdict(cfg).items()}, indent=1)
    return f"wrote {dst}/params: {cfg}"


# --- animegamer-mllm -------------------------------------------------------------------------

def _mllm_flags(fv: flags.FlagValues) -> None:
    flags.DEFINE_string("base", None, "HF Mistral dir for base weights missing from BIN.", flag_values=fv)
    flags.DEFINE_bool("merge_lora", False, "Fold the LoRA into the base weights (--nomerge_lora: keep it "
                      "separate, the default).", flag_values=fv)
    flags.DEFINE_float("lora_alpha", None, "Default: config mllm.lora_alpha (release 32).", flag_values=fv)
    flags.DEFINE_string("param_dtype", "bfloat16", "dtype of the stored parameters.", flag_values=fv)


def _mllm_load(f: flags.FlagValues, bin_path: str) -> dict[str, Any]:
    sd = load_state_dict(bin_path)
    print(f"{len(sd)} keys in {bin_path}; first: {sorted(sd)[:5]}")
    if f.base:
        mllm_convert.add_base_weights(sd, load_state_dict(f.base))
    return sd


def _mllm_save(f: flags.FlagValues, dst: str, converted: Any, _cfg: Any) -> str:
    cfg, state = converted
    fileio.makedirs(dst)
    save_state(state, paths.join(dst, "params"))
    _write_json(paths.join(dst, "mllm_config.json"),
                {"lora_rank": cfg.llm.lora_rank, "lora_alpha": cfg.llm.lora_alpha,
                 "lora_targets": list(cfg.llm.lora_targets), "merged": f.merge_lora})
    return f"wrote {dst}/params (lora_rank={cfg.llm.lora_rank}, merged={f.merge_lora})"


# --- clip, t5 --------------------------------------------------------------------------------

def _hf_config_flag(what: str) -> Callable[[flags.FlagValues], None]:
    def define(fv: flags.FlagValues) -> None:
        flags.DEFINE_string("hf_config", "", f"An HF {what} config.json (its sizes win over --config).",
                            flag_values=fv)
    return define


def _clip_flags(fv: flags.FlagValues) -> None:
    _hf_config_flag("CLIP")(fv)
    flags.DEFINE_enum("layout", "auto", ["auto", "open_clip", "hf"], "Key names of SRC (auto: detected).",
                      flag_values=fv)
    flags.DEFINE_bool("text_tower", True, "Convert the text tower too (--notext_tower: the vision tower only, "
                      "what the game system uses).", flag_values=fv)


def _clip_save(f: flags.FlagValues, out: str, state: Any, cfg: Any) -> str:
    save_state(state, out)
    return f"wrote {paths.as_path(out)} ({'full CLIP' if f.text_tower else 'vision tower'}, act {cfg.hidden_act})"


def _save_state(f: flags.FlagValues, out: str, state: Any, cfg: Any) -> str:
    save_state(state, out)
    return f"wrote {paths.as_path(out)}"


# --- dit, vae --------------------------------------------------------------------------------

def _dit_config(f: flags.FlagValues, src: str) -> DiTConfig:
    if f.kind is None:
        raise cli_lib.UsageError("--kind is required: --kind=sat (SAT engine) or --kind=diffusers")
    return DiTConfig.from_config(f.config.dit)


def _dit_save(f: flags.FlagValues, dst: str, converted: Any, cfg: DiTConfig) -> str:
    model, extras = converted
    dit_convert.save_orbax(model, dst)
    with paths.as_path(paths.join(dst, "dit_extras.npz")).open("wb") as fh:
        np.savez(fh, **extras)
    return f"wrote {dst}: DiT {cfg.num_layers} layers x {cfg.hidden_size}, extras {sorted(extras)}"


def _vae_convert(f: flags.FlagValues, src: str, sd: dict[str, Any], cfg: VAEConfig) -> Any:
    return vae_convert.convert_vae(sd, cfg, vae_convert.detect_format(src) if f.format == "auto" else f.format)


def _vae_save(f: flags.FlagValues, dst: str, state: Any, cfg: Any) -> str:
    save_state(state, dst)
    return f"wrote {dst}"


#: kind -> its family: the converters that run through :func:`convert_family`
FAMILIES: dict[str, Family] = {
    "mistral": Family(
        doc="""HF Mistral checkpoint -> orbax (animegamer-jax layout).

SRC: HF model directory (config.json + safetensors / pytorch_model.bin), local or a URL;
DST: output directory (orbax state in DST/params), local or gs://.""",
        model_config=_mistral_config,
        convert=lambda f, src, sd, cfg: mistral_convert.convert_mistral(sd, cfg),
        save=_mistral_save, extra_flags=_mistral_flags),
    "animegamer-mllm": Family(
        doc="""AnimeGamer MLLM pytorch_model.bin -> orbax.

BIN is the release ``MLLM-*/pytorch_model.bin``. If it holds only the trainable subset (no base
weights), pass ``--base`` with the HF Mistral-7B-Instruct-v0.1 directory: its weights fill the
frozen base keys (the release's embeddings/lm_head, already resized to 32284, win). The sizes come
from ``--config`` (default configs/animegamer_2b_7b.py); ``--config.mllm.x=v`` overrides a field.""",
        model_config=lambda f, src: MLLMConfig.from_config(f.config, param_dtype=f.param_dtype,
                                                           dtype=f.param_dtype, lora_rank=0),
        load=_mllm_load,
        convert=lambda f, src, sd, cfg: mllm_convert.convert_animegamer_mllm(
            sd, cfg, merge_lora=f.merge_lora, lora_alpha=f.lora_alpha),
        save=_mllm_save, section="mllm", extra_flags=_mllm_flags, positional=("BIN", "DST")),
    "clip": Family(
        doc="""open_clip ViT-B-16 state dict or an HF CLIP folder -> orbax.

SRC: open_clip ``.bin`` / ``.pt`` or HF ``.safetensors`` (file or folder); sizes and the activation
come from ``--hf_config`` (an HF ``config.json``) if given, else from the config file's ``clip``
section. OUT: orbax directory, local or gs://.""",
        model_config=lambda f, src: (clip_convert.config_from_hf(_hf_config(f)) if f.hf_config
                                     else CLIPConfig.from_config(f.config.clip)),
        convert=lambda f, src, sd, cfg: clip_convert.convert_clip(sd, cfg, vision_only=not f.text_tower,
                                                                  layout=f.layout),
        save=_clip_save, section="clip", sizes_note=" (ignored with --hf_config)", extra_flags=_clip_flags,
        positional=("SRC", "OUT")),
    "t5": Family(
        doc="""HF T5EncoderModel safetensors -> orbax.

SRC: HF T5 safetensors / ``.bin`` file or folder (``google/t5-v1_1-xxl``); OUT: orbax directory,
local or gs://. Sizes from ``--hf_config`` (an HF config.json) if given, else the config's ``t5``.""",
        model_config=lambda f, src: (t5_convert.config_from_hf(_hf_config(f)) if f.hf_config
                                     else T5Config.from_config(f.config.t5)),
        convert=lambda f, src, sd, cfg: t5_convert.convert_t5(sd, cfg),
        save=_save_state, section="t5", sizes_note=" (ignored with --hf_config)", extra_flags=_hf_config_flag("T5"),
        positional=("SRC", "OUT")),
    "dit": Family(
        doc="""SAT mp_rank_00_model_states.pt folder or diffusers CogVideoXTransformer3DModel -> orbax.

Usage: python -m animegamer_jax.commands.convert dit SRC DST --kind={sat,diffusers} [--config=F]
       python -m animegamer_jax.commands.convert dit migrate OLD_SYSTEM NEW_SYSTEM

SRC: a SAT checkpoint dir / .pt, or a diffusers dir / .safetensors; DST: output directory (orbax
item `dit` + dit_config.json). The DiT sizes come from the config's `dit` section (default
configs/animegamer_2b_7b.py); extras (text/ip projections, mix LayerNorms) are saved beside the
checkpoint as `dit_extras.npz`. `migrate` rewrites a system checkpoint whose DiT blocks are stored
in the flat legacy layout into the NNX module layout (same arrays, new nesting).""",
        model_config=_dit_config,
        # SAT engine files also pickle their training arguments
        load=lambda f, src: load_state_dict(src, weights_only=False),
        convert=lambda f, src, sd, cfg: dit_convert.convert_dit(sd, cfg, f.kind),
        save=_dit_save, section="dit",
        extra_flags=lambda fv: flags.DEFINE_enum("kind", None, ["sat", "diffusers"], "Layout of SRC.",
                                                 flag_values=fv)),
    "vae": Family(
        doc="""SAT 3d-vae.pt or diffusers AutoencoderKLCogVideoX -> orbax.

SRC: 3d-vae.pt, a diffusers vae folder or a .safetensors file; DST: output orbax directory. The
model's sizes come from the config's ``vae`` section (default configs/animegamer_2b_7b.py).""",
        model_config=lambda f, src: VAEConfig.from_config(f.config.vae),
        convert=_vae_convert, save=_vae_save, section="vae",
        extra_flags=lambda fv: flags.DEFINE_enum("format", "auto", ["auto", "sat", "diffusers"],
                                                 "Layout of SRC (auto: detected).", flag_values=fv)),
}

_MIGRATE_DOC = ("Rewrites a system checkpoint's DiT into the NNX block layout (SRC, DST: system checkpoint "
                "folders, local or gs://; DST must not exist).")


def _define_flags(family: Family, fv: flags.FlagValues, argv: list[str]) -> None:
    """The flags every family shares (``--config`` with its overrides, where the family has a config
    section) and the family's own."""
    if family.section is not None:
        config_flags.DEFINE_config_file(
            "config", paths.resource(DEFAULT_CONFIG),
            f"Config whose `{family.section}` section has the sizes{family.sizes_note}; "
            f"--config.{family.section}.x=v overrides a field.", flag_values=fv, lock_config=False, sys_argv=argv)
    family.extra_flags(fv)


def convert_family(kind: str, f: flags.FlagValues, src: str, dst: str) -> int:
    """The run path of every family: model config -> state dict -> library converter -> files under
    ``dst``; prints the family's one line. Returns 0."""
    family = FAMILIES[kind]
    cfg = family.model_config(f, src)
    converted = family.convert(f, src, family.load(f, src), cfg)
    print(family.save(f, dst, converted, cfg))
    return 0


def _release_flags(fv: flags.FlagValues, argv: list[str]) -> None:
    """The flags of ``convert release``."""
    config_flags.DEFINE_config_file("config", release.DEFAULT_CONFIG, "Config with the sizes of the weights (default: "
                                    "paper size, configs/animegamer_2b_7b.py); --config.a.b=v overrides a field.",
                                    flag_values=fv, lock_config=False, sys_argv=argv)
    flags.DEFINE_string("character", None, "MLLM-<NAME> / VDM_Decoder-<NAME> when SRC holds several.", flag_values=fv)
    flags.DEFINE_bool("allow_pickle", False, "Read torch files with full pickle (only for files you trust, e.g. "
                      "DeepSpeed files whose bookkeeping entries pickle Python objects); default: the safe "
                      "weights-only loader.", flag_values=fv)
    flags.DEFINE_alias("allow-pickle", "allow_pickle", flag_values=fv)
    flags.DEFINE_string("cache_dir", None, "Where a remote (gs://...) SRC's files are copied to be memory-mapped "
                        "(default: a new temporary folder, removed afterwards).", flag_values=fv)


def _release_report(f, src: str, dst: str) -> int:
    """``convert release SRC DST``: :func:`~animegamer_jax.convert.release.convert_release` on parsed flags
    ``f``, printing its progress and the written line (or each problem and "nothing written"). SRC is the
    release's ``checkpoints/`` folder, local or a URL; DST a new system checkpoint (local or gs://) that
    ``play --checkpoint``, ``generate``, ``eval`` and ``train --config.train.init_checkpoint`` read. Exit
    status 1 with one line per problem."""
    if not fileio.isdir(src):  # a bad command line, one line before anything is read
        raise cli_lib.UsageError(f"{src}: release folder not found. Fix: pass the folder that holds AnimeGamer/, "
                                 f"vae/, google/, laion/ (the release's checkpoints/)")
    config, config_path = f.config, config_flags.get_config_filename(f["config"])
    t0 = time.perf_counter()
    try:
        counts = release.convert_release(src, dst, config, config_path=config_path, character=f.character,
                                         cache_dir=f.cache_dir, allow_pickle=f.allow_pickle)
    except release.ReleaseError as e:
        for line in e.problems:
            print(f"error: {line}", file=sys.stderr)
        print(f"nothing written at {release.absolute(dst)}", file=sys.stderr)
        return 1
    print(f"wrote {release.absolute(dst)}: {', '.join(f'{k} {v:,}' for k, v in sorted(counts.items()))} parameters "
          f"({time.perf_counter() - t0:.1f} s)")
    return 0


def reference_engine(dst: str) -> GameEngine:
    """A :class:`~animegamer_jax.game.engine.GameEngine` on one device playing the system at ``dst``
    in ``reference`` mode (the config saved in the checkpoint, float32 matmuls at highest precision):
    the engine :func:`animegamer_jax.convert.check_release.check_release` takes.

    Raises:
      animegamer_jax.game.loading.CheckpointError: ``dst`` is not a loadable system checkpoint.
    """
    jax.config.update("jax_default_matmul_precision", "highest")
    try:
        config = checkpoint.load_config(dst)
    except checkpoint.SystemCheckpointError as e:
        raise CheckpointError(f"{dst}: {e}. Fix: pass the DST written by `convert release`") from None
    config.game.mode = "reference"
    mesh = parallel.make_mesh((1, 1, 1, 1), devices=jax.devices()[:1])
    return GameEngine(config, load_game_system(dst, config, mesh=mesh), mesh=mesh)


def _check_release_report(_, dst: str, case: str) -> int:
    """``convert check-release DST CASE.npz``: ``check_release`` on :func:`reference_engine` ``(dst)``,
    printing each stage's line and the verdict line; exit status 0 iff all stages hold (1: a stage fails)."""
    stages = check_release.check_release(lambda: reference_engine(dst), case, log=print)
    ok = all(s.ok for s in stages)
    name = str(case).rstrip("/").rsplit("/", 1)[-1]
    print(f"{name}: {'all stages hold' if ok else 'FAILED: ' + ', '.join(s.name for s in stages if not s.ok)}")
    return 0 if ok else 1


#: ``convert dit migrate OLD NEW``
MIGRATE = cli_lib.Command(cli_lib.no_flags, lambda _, src, dst: print(f"wrote {migrate.migrate_system_checkpoint(src, dst)}"),
                          _MIGRATE_DOC, ("SRC", "DST"), errors=(ConversionError, checkpoint.SystemCheckpointError))

#: kind -> its command: the families of :data:`FAMILIES` (one run path, :func:`convert_family`), release,
#: check-release
KINDS: dict[str, cli_lib.Command] = {
    **{kind: cli_lib.Command(functools.partial(_define_flags, family), functools.partial(convert_family, kind),
                             family.doc, family.positional, errors=(ConversionError, FileNotFoundError),
                             subcommands={"migrate": MIGRATE} if kind == "dit" else None)
       for kind, family in FAMILIES.items()},
    "release": cli_lib.Command(_release_flags, _release_report, release.__doc__, ("SRC", "DST")),
    "check-release": cli_lib.Command(cli_lib.no_flags, _check_release_report, check_release.__doc__,
                                     ("DST", "CASE.npz"), errors=(FileNotFoundError, CheckpointError)),
}


def main(argv: list[str] | None = None) -> int:
    """Runs the kind of :data:`KINDS` that ``argv[0]`` names on the rest (``--help`` prints this module's
    docstring, exit status 0; no kind or an unknown one is one ``error:`` line, exit status 2); returns the
    exit status (2 with one ``error:`` line for a bad command line, a missing SRC or weights that do not fit
    the config)."""
    return cli_lib.run(PROG, argv, KINDS, __doc__)


def cli() -> None:
    """Console script (pyproject.toml)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
