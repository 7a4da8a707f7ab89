"""The programs ``animegamer-aot`` compiles: each train phase's step and each stage of a game turn,
with abstract (sharded ``jax.ShapeDtypeStruct``) parameters, optimizer state and inputs.

Train programs (the phases of ``train.phases``: ``vae``, ``a1``, ``a2``, ``b``, ``c``, ``d``, ``r``,
``preview``) are the train command's own step (``train.model.phase_trainer``)
with the config's settings: precomputed features or not, latents or frames, remat,
``train.global_batch_size`` / ``grad_accum_steps``. Their batches have the shapes of the phase's
batch kind (``data.batches.BatchKind.spec``, :func:`abstract_batch`). Phase ``d``
(the few-step student's distillation against the frozen teacher, docs/training.md) takes a1 / a2's
clip batches; phase ``r`` (the reference adapter) takes them plus ``reference_frame`` uint8 [B, H, W, 3].

Turn programs (``prefill``, ``decode``, ``pass_b``, ``dit``, ``vae_decode``) are play's stages
(animegamer_jax/aot/pieces.py) in play's layouts (``inference.layout.apply_layout``): ``latency`` (one
game over all chips) or ``batch`` (one game per data-parallel slice, as ``generate`` runs). With
``diffusion.sampler = "student"`` the ``dit`` program is the student's N-step loop without a CFG
batch (and the latency layout puts no data axis of 2 on the chips). Outside the turn group:
``preview_decode``, ``dit_reference`` (the ``dit`` program with each game's reference latent and the
phase-r adapter: what play samples for a turn naming a ``--character``) and ``reference_encode``
(the reference image's VAE encode, run once per character per game).

Nothing is allocated; :func:`lower` traces under the program's mesh, so every hardware choice
(attention kernel, VAE tiles) is made for the mesh's devices.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import ml_collections

from animegamer_jax import parallel
from animegamer_jax.aot import pieces
from animegamer_jax.inference.layout import apply_layout
from animegamer_jax.train import model_flops, phases
from animegamer_jax.train.model import phase_trainer

TRAIN_PROGRAMS = tuple(phases.PHASES)
TURN_PROGRAMS = ("prefill", "decode", "pass_b", "dit", "vae_decode")
#: turn programs outside the "turn" group (and the turn's roofline): the preview decoder (game.decoder),
#: the DiT sampling of a turn that names a --character (dit with the reference latent and adapter) and
#: the reference image's VAE encode (once per character per game)
EXTRA_TURN_PROGRAMS = ("preview_decode", "dit_reference", "reference_encode")
#: turn program -> the piece of animegamer_jax/aot/pieces.py
_PIECE = {"prefill": "mllm_prefill", "decode": "mllm_decode", "pass_b": "mllm_pass_b", "dit": "dit_sampling",
          "vae_decode": "vae_decode", "preview_decode": "preview_decode", "dit_reference": "dit_reference",
          "reference_encode": "reference_encode"}


@dataclasses.dataclass
class Program:
    """One program to compile: ``lower()`` returns ``jax.stages.Lowered``; ``runs`` = how often it runs
    per step (train: ``grad_accum_steps`` micro-steps) or per turn (decode: the jump-forward steps, ``pieces.decode_schedule``)."""

    name: str
    kind: str  # "train" or "turn"
    lower: Callable[[], Any]
    note: str
    runs: int = 1
    mesh: Any = None
    layout: str = ""  # turn programs: "latency" or "batch"
    first_chunk: tuple[int, int] = (1, 1)  # vae_decode: (first chunk's, all) latent frames, set when lowered
    model_flops: Callable[[], Any] | None = None  # train: model_flops.ModelFlops of one run, all chips
    compiler_options: dict | None = None  # train: the Trainer's (parallel/xla_flags.py), as the train command compiles
    trainer: Any = None  # train: the train.loop.Trainer whose step it is
    batch: dict | None = None  # train: the abstract micro-batch it is lowered for


def abstract_batch(config: ml_collections.ConfigDict, phase: str, batch: int, mesh: Any, rules: Any) -> dict:
    """ShapeDtypeStructs of one micro-batch of ``batch`` records of ``phase``: its batch kind's shapes
    (``data.batches.BatchKind.spec``, as ``BatchBuilder`` builds them under ``config``), split over the
    data axes.

    Raises:
      ValueError: an unknown phase."""
    shapes = phases.phase(phase).batch.spec(config, batch)
    return {k: jax.ShapeDtypeStruct(s, d, sharding=parallel.batch_sharding(mesh, len(s), rules, shape=s))
            for k, (s, d) in shapes.items()}


def train_program(config: ml_collections.ConfigDict, phase: str, devices: list[Any]) -> Program:
    """The train command's step of ``phase`` (``train.model.phase_trainer``) on a mesh of ``devices``
    (``config.mesh`` resolved for their count), micro-batch ``global_batch_size / grad_accum_steps``;
    the program's ``trainer`` and ``batch`` (abstract) let a caller run the step on real arrays.

    Raises: parallel.ShardingConfigError when the micro-batch does not divide the data axes."""
    config = _with_phase(config, phase)
    t = config.train
    mesh = parallel.mesh_from_config(config, devices=devices)
    rules = parallel.rules_from_config(config)
    accum = int(t.grad_accum_steps)
    micro = int(t.global_batch_size) // accum
    parallel.check_global_batch(micro, mesh, rules)
    trainer = phase_trainer(config, mesh, rules)
    trained, total = trainer.num_trainable()
    batch = abstract_batch(config, phase, micro, mesh, rules)
    rec = phases.phase(phase)
    note = (f"global batch {t.global_batch_size} ({accum} micro-step(s) of {micro}), "
            f"{', '.join(rec.components_for(config))}; {trained / 1e6:.1f} M of {total / 1e6:.1f} M params trained; "
            f"remat {t.remat}; {rec.batch.note(config)}")
    return Program(phase, "train", lambda: trainer.lower(trainer.abstract_state(), batch), note, runs=accum, mesh=mesh,
                   model_flops=lambda: model_flops.train_flops(trainer.model_fn, trainer.loss_fn, trainer.trainable, batch),
                   compiler_options=trainer.compiler_options, trainer=trainer, batch=batch)


def _with_phase(config: ml_collections.ConfigDict, phase: str) -> ml_collections.ConfigDict:
    c = copy.deepcopy(config)
    c.train.phase = phase
    return c


def turn_programs(config: ml_collections.ConfigDict, names: list[str], devices: list[Any],
                  layout: str, games_per_chip: int = 1) -> list[Program]:
    """Play's stages ``names`` (:data:`TURN_PROGRAMS`) in ``layout`` ("latency": one game on all
    ``devices``; "batch": ``config.mesh`` with one game per data-parallel slice, generate's batch).
    ``games_per_chip`` = B multiplies the games of one program (the game engine's ``rows``, the
    web server's and generate's ``--max_batch``): latency: B games batched on all ``devices`` (on one
    chip: B players per chip); batch: B games per data-parallel slice.
    A program's note (layout, games, mesh) gains its piece's note ("4 steps, no CFG batch (student),
    ...") when it is lowered.

    Raises:
      ValueError: an unknown name, or ``games_per_chip`` below 1.
    """
    if int(games_per_chip) < 1:
        raise ValueError(f"games_per_chip must be at least 1, got {games_per_chip}")
    cfg = apply_layout(config, layout, len(devices))
    mesh = parallel.mesh_from_config(cfg, devices=devices)
    rules = parallel.rules_from_config(cfg)
    games = int(games_per_chip) * (1 if layout == "latency" else parallel.data_parallel_size(mesh, rules))
    builder = pieces.Builder(cfg, mesh, abstract=True)
    out = []
    for name in names:
        if name not in _PIECE:
            raise ValueError(f"unknown turn program {name!r}; use one of {TURN_PROGRAMS + EXTRA_TURN_PROGRAMS}")

        runs = pieces.decode_schedule()[1] if name == "decode" else 1
        prog = Program(name, "turn", lambda: None, f"{layout} layout, {games} game(s), mesh {dict(mesh.shape)}",
                       runs=runs, mesh=mesh, layout=layout)

        def lower(name=name, prog=prog):  # the piece's own note (steps, CFG or student, ...) joins the program's
            piece = pieces.make_turn_piece(cfg, builder, _PIECE[name], batch=games)
            prog.note = f"{prog.note}; {piece.note}" if piece.note else prog.note
            prog.first_chunk = piece.first_chunk
            return pieces.lower_piece(piece, builder)

        prog.lower = lower
        out.append(prog)
    return out


__all__ = ["EXTRA_TURN_PROGRAMS", "Program", "TRAIN_PROGRAMS", "TURN_PROGRAMS", "abstract_batch", "train_program", "turn_programs"]
