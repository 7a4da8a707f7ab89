"""Loading the :class:`~animegamer_jax.inference.turn_model.TurnModel` a command plays with.

``--checkpoint DIR``: every component from one system checkpoint directory
(docs/design.md#one-checkpoint-directory-for-a-whole-system), as a ``RealTurnModel``
(inference/turn_model.py). ``--standin``: the clearly-labelled random stand-in
(inference/standin_model.py), for when no checkpoint exists. ``--demo`` without a checkpoint: the
real networks, randomly initialised.
"""

from __future__ import annotations

import jax
from flax import nnx

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.checkpoint import (CheckpointIntegrityError, SystemCheckpointError, checkpoint_identity,
                                       load_system, read_manifest, verify_checkpoint)
from animegamer_jax.inference.clip_sampler import sampling_component
from animegamer_jax.inference.standin_model import StandinTurnModel
from animegamer_jax.inference.turn_model import RealTurnModel, TurnModel
from animegamer_jax.models.cogvideox.character import COMPONENT as CHARACTERS
from animegamer_jax.models.cogvideox.character import CharacterLoRAs, CharacterSpec
from animegamer_jax.models.registry import COMPONENT_BUILDERS, supports_preview, supports_references

#: components a game needs from the checkpoint (clip/t5 only build E_a's uncond embedding)
REQUIRED_COMPONENTS = ("mllm", "dit", "shot_encoder", "vae")


class CheckpointError(ValueError):
    """A system checkpoint that is missing, incomplete or does not match the config."""


def _standin_decode(config):
    st = StandinTurnModel(config)
    return lambda latents: st.decode(st.params, latents)


def no_reference_error(checkpoint: str) -> CheckpointError:
    """The one line for ``--character`` with a system that cannot take a reference image."""
    return CheckpointError(f"checkpoint {checkpoint} has no reference adapter; train phase r "
                           f"(docs/training.md#phase-r-reference) or drop --character")


def no_preview_error(checkpoint: str, decoder: str) -> CheckpointError:
    """The one line for ``game.decoder`` preview modes with a system that has no preview decoder."""
    return CheckpointError(f"checkpoint {checkpoint} has no preview decoder, which --config.game.decoder={decoder} "
                           f"plays; train phase preview (docs/training.md#phase-preview) or use "
                           f"--config.game.decoder=full")


def wants_preview(config) -> bool:
    """Whether ``config.game.decoder`` asks for the preview decoder (``preview`` / ``preview_then_full``)."""
    return str(config.game.get("decoder", "full")) != "full"


def load_game_system(checkpoint: str, config, mesh=None, standin_vae: bool = False,
                     verify: str = "fast", need_references: bool = False) -> RealTurnModel:
    """Loads every component from ``checkpoint`` as a :class:`RealTurnModel`.

    Args:
      checkpoint: a directory written by ``save_system``.
      config: the run config (component shapes must match the saved arrays).
      mesh: where to place the weights (default: one device).
      standin_vae: decode with the random stand-in decoder instead of a ``vae`` component (for
        builds without the VAE network); the system label says so.
      verify: integrity check of the checkpoint's files first (``checkpoint.verify_checkpoint``): ``"fast"``
        or ``"full"``.
      need_references: refuse (before loading any weights) a checkpoint without the ``reference``
        component (``--character``); one that has it is loaded with it either way.

    Raises:
      CheckpointError: missing directory, a missing, truncated or damaged file (named), or a
        missing component (named), or no ``reference`` with ``need_references``; always one line.
    """
    if not fileio.isdir(checkpoint):
        raise CheckpointError(f"checkpoint directory {checkpoint!r} not found. Fix: pass the folder "
                              f"written by save_system (or use --standin for a random stand-in)")
    try:
        verify_checkpoint(checkpoint, verify)
        identity = checkpoint_identity(checkpoint)
    except SystemCheckpointError as e:
        raise CheckpointError(str(e)) from None
    try:
        manifest = read_manifest(checkpoint)
    except CheckpointIntegrityError as e:
        raise CheckpointError(str(e)) from None
    except (SystemCheckpointError, FileNotFoundError, OSError) as e:
        raise CheckpointError(f"{checkpoint!r} is not a system checkpoint: {e}") from None
    need = [c for c in REQUIRED_COMPONENTS if not (standin_vae and c == "vae")]
    sampler_dit = sampling_component(config)
    if sampler_dit != "dit":
        need = [sampler_dit if c == "dit" else c for c in need]
        if sampler_dit not in manifest["components"]:
            raise CheckpointError(f"checkpoint {checkpoint!r} has no few-step student (it holds "
                                  f"{manifest['components']}), which --config.diffusion.sampler=student plays. "
                                  f"Fix: train it (python -m animegamer_jax.commands.train --config.train.phase=d "
                                  f"--config.train.init_checkpoint={checkpoint}) or drop the sampler override")
    if need_references and (standin_vae or not supports_references(manifest["components"])):
        raise no_reference_error(checkpoint)
    if supports_references(manifest["components"]) and not standin_vae:
        need.append("reference")
    builders = {}
    if CHARACTERS in manifest["components"]:  # character LoRAs: names, rank and alpha from the manifest
        try:
            spec = CharacterSpec.from_json(manifest.get(CHARACTERS))
        except ValueError as e:
            raise CheckpointError(f"checkpoint {checkpoint!r}: {e}") from None
        need.append(CHARACTERS)
        builders[CHARACTERS] = lambda cfg, rngs: CharacterLoRAs(cfg.dit, spec, rngs=rngs)
    if wants_preview(config):  # loaded only when asked: game.decoder=full plays exactly as without it
        if standin_vae or not supports_preview(manifest["components"]):
            raise no_preview_error(checkpoint, config.game.decoder)
        need.append("preview")
    missing = [c for c in need if c not in manifest["components"]]
    if missing:
        raise CheckpointError(f"checkpoint {checkpoint!r} lacks component(s) {missing} (it holds "
                              f"{manifest['components']}); a game needs {need}. Fix: save all of them "
                              f"with save_system")
    try:
        components = load_system(checkpoint, config, mesh=mesh, names=need, verify=None,
                                 builders=builders)
    except CheckpointIntegrityError as e:
        raise CheckpointError(str(e)) from None
    except SystemCheckpointError as e:
        raise CheckpointError(f"checkpoint {checkpoint!r} does not match config {config.name!r}: {e}") from None
    components["dit"] = components.pop(sampler_dit)
    label = f"checkpoint {checkpoint}"
    if sampler_dit != "dit":
        d = config.diffusion
        label += f" (few-step student, {d.num_sampling_steps} step(s), guidance {d.cfg_scale:g})"
    if standin_vae:
        label += " (VAE: random stand-in decoder, NOT the CogVideoX VAE)"
    return RealTurnModel(components, config, label=label, decode_fn=_standin_decode(config) if standin_vae else None,
                         identity=identity, description=str(manifest.get("description") or ""))


def build_random_system(config, seed: int = 0) -> RealTurnModel:
    """The real networks at ``config`` sizes, randomly initialised (untrained), in one jitted init.

    The label says so.
    """

    preview = wants_preview(config)

    @jax.jit
    def init():
        # one compiled init instead of one eager PRNG op per parameter
        names = ("mllm", sampling_component(config), "shot_encoder", "vae") + (("preview",) if preview else ())
        mods = {name: COMPONENT_BUILDERS[name](config, nnx.Rngs(seed + i)) for i, name in enumerate(names)}
        mods["dit"] = mods.pop(sampling_component(config))
        return {k: nnx.split(m) for k, m in mods.items()}

    split = init()
    comps = {k: nnx.merge(g, s) for k, (g, s) in split.items()}
    label = (f"RANDOMLY INITIALISED {config.name} system (untrained MLLM, DiT, E_a and VAE; seed {seed}); "
             f"no trained checkpoint was found")
    return RealTurnModel(comps, config, label=label)


def resolve_system(config, checkpoint: str = "", standin: bool = False, mesh=None,
                   random_fallback: bool = False, standin_vae: bool = False, verify: str = "fast",
                   need_references: bool = False) -> TurnModel:
    """Picks the system a command plays, as its turn model.

    ``standin`` -> the random stand-in; else the checkpoint (argument or ``config.game.checkpoint``);
    with ``random_fallback`` (the demo) a missing checkpoint gives :func:`build_random_system`.

    ``need_references`` (``--character``): a system without reference support is refused before it
    is built (the random fallback has none; the stand-in has one).

    Raises:
      CheckpointError: no checkpoint given (and no fallback), or a bad checkpoint.
    """
    if standin:
        if wants_preview(config):
            raise CheckpointError(f"the random stand-in has no preview decoder, which --config.game.decoder="
                                  f"{config.game.decoder} plays. Fix: play a checkpoint with one (training phase "
                                  f"preview) or use --config.game.decoder=full")
        return StandinTurnModel(config, seed=int(config.seed))
    ckpt = paths.resource(checkpoint or config.game.checkpoint)
    if random_fallback and (not ckpt or not fileio.isdir(ckpt)):
        if need_references:
            raise no_reference_error(f"(none found: {ckpt or 'no --checkpoint'}; the randomly initialised system)")
        return build_random_system(config, seed=int(config.seed))
    if not ckpt:
        raise CheckpointError("no checkpoint: pass --checkpoint DIR (or --config.game.checkpoint=DIR), "
                              "or --standin to play a random, untrained stand-in")
    return load_game_system(ckpt, config, mesh=mesh, standin_vae=standin_vae, verify=verify,
                            need_references=need_references)
