"""The programs ``animegamer-aot`` compiles: each train phase's step and each stage of a game turn,
with abstract (sharded ``jax.ShapeDtypeStruct``) parameters, optimizer state and inputs.

Train programs (the phases of ``train.phases``: ``vae``, ``a1``, ``a2``, ``b``, ``c``, ``d``, ``r``,
``preview``) are the train command's own step (``train.loop.Trainer`` on ``train.model.phase_spec``)
with the config's settings: precomputed features or not, latents or frames, remat,
``train.global_batch_size`` / ``grad_accum_steps``. Their batches have the shapes
``data.batches.BatchBuilder`` makes of the phase's batch kind (:func:`abstract_batch`). Phase ``d``
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
import jax.numpy as jnp
import ml_collections

from animegamer_jax import parallel
from animegamer_jax.aot import pieces
from animegamer_jax.inference.layout import apply_layout
from animegamer_jax.parallel import xla_flags
from animegamer_jax.train import loop, model_flops, optim, phases
from animegamer_jax.train.model import phase_spec

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


def abstract_batch(config: ml_collections.ConfigDict, phase: str, batch: int, mesh: Any, rules: Any) -> dict:
    """ShapeDtypeStructs of one micro-batch of ``phase`` as ``data.batches.BatchBuilder`` builds its batch
    kind (``train.phases``), split over the data axes. Decoder phases (a1, a2, d) carry ``f_md`` / ``f_v`` with
    ``train.precomputed_features`` (else ``t5_ids`` / ``first_frame``) and ``latents`` without
    ``train.encode_latents`` (else ``frames``);
    "vae" carries the curriculum's last (largest) stage, ``vae_windows_per_clip`` windows per clip.

    Raises:
      ValueError: an unknown phase."""
    kind = phases.phase(phase).batch
    f32, i32, b_ = jnp.float32, jnp.int32, jnp.bool_
    t_lat, c_lat = int(config.dit.num_latent_frames), int(config.dit.in_channels)
    h_lat, w_lat = int(config.dit.sample_height), int(config.dit.sample_width)
    sf = 2 ** (len(tuple(config.vae.block_out_channels)) - 1)
    # as the loader stores clips (data.num_frames x data.height x data.width) and BatchBuilder tokenizes
    # actions (t5.max_length)
    frames = (int(config.data.get("num_frames", 1 + 4 * (t_lat - 1))), int(config.data.get("height", sf * h_lat)),
              int(config.data.get("width", sf * w_lat)), 3)
    lt, dt = int(config.t5.max_length), int(config.t5.d_model)
    p, dv = int(config.rep.num_image_tokens), int(config.clip.vision_width)
    pre, enc = bool(config.train.precomputed_features), bool(config.train.encode_latents)
    shapes: dict[str, tuple[tuple[int, ...], Any]] = {}
    if kind == "vae":
        _, t, h, w = tuple(config.train.vae_curriculum)[-1]
        n = max(1, min(int(config.train.vae_windows_per_clip), frames[0] // int(t)))
        shapes["frames"] = ((batch * n, int(t), int(h), int(w), 3), f32)
    elif kind == "frames":  # the clips' frames
        shapes["frames"] = ((batch,) + frames, f32)
    elif kind in ("decoder", "reference"):
        shapes["flow"] = ((batch,), f32)
        if pre:
            shapes.update(f_md=((batch, lt, dt), f32), f_v=((batch, p, dv), f32))
        else:
            shapes.update(t5_ids=((batch, lt), i32), first_frame=((batch,) + frames[1:], f32))
        shapes["frames" if enc else "latents"] = (((batch,) + frames, f32) if enc
                                                  else ((batch, t_lat, c_lat, h_lat, w_lat), f32))
        if kind == "reference":  # each clip's reference image, VAE-encoded in the step
            shapes["reference_frame"] = ((batch,) + frames[1:], jnp.uint8)
    else:  # "turns", "turns_clip"
        length, m, w = int(config.train.max_seq_len), int(config.data.max_turns), int(config.mllm.history_window)
        shapes.update(input_ids=((batch, length), i32), cmp_mask=((batch, length), b_), gen_mask=((batch, length), b_),
                      labels=((batch, length), i32), padding_mask=((batch, length), b_),
                      turn_ids=((batch, length), i32), target_turn=((batch,), i32),
                      history_turns=((batch, max(w - 1, 1)), i32))
        if pre:
            shapes.update(turn_f_md=((batch, m, lt, dt), f32), turn_f_v=((batch, m, p, dv), f32))
        else:
            shapes.update(turn_t5_ids=((batch, m, lt), i32), turn_first_frame=((batch, m) + frames[1:], f32))
        if kind == "turns_clip":
            shapes["flow"] = ((batch,), f32)
            shapes["frames" if enc else "latents"] = (((batch,) + frames, f32) if enc
                                                      else ((batch, t_lat, c_lat, h_lat, w_lat), f32))
    return {k: jax.ShapeDtypeStruct(s, d, sharding=parallel.batch_sharding(mesh, len(s), rules, shape=s))
            for k, (s, d) in shapes.items()}


def train_program(config: ml_collections.ConfigDict, phase: str, devices: list[Any]) -> Program:
    """The train command's step of ``phase`` on a mesh of ``devices`` (``config.mesh`` resolved for their
    count), micro-batch ``global_batch_size / grad_accum_steps``.

    Raises: parallel.ShardingConfigError when the micro-batch does not divide the data axes."""
    config = _with_phase(config, phase)
    t = config.train
    mesh = parallel.mesh_from_config(config, devices=devices)
    rules = parallel.rules_from_config(config)
    accum = int(t.grad_accum_steps)
    micro = int(t.global_batch_size) // accum
    parallel.check_global_batch(micro, mesh, rules)
    spec = phase_spec(config, phase)
    tx, sched = optim.make_optimizer(t)
    trainer = loop.Trainer(spec.model_fn, spec.loss_fn, tx, spec.trainable, mesh, rules, schedule=sched,
                           grad_accum_steps=accum, seed=int(config.seed),
                           compiler_options=xla_flags.train_compile_options(config, mesh))
    trained, total = trainer.num_trainable()
    batch = abstract_batch(config, phase, micro, mesh, rules)
    kind = phases.phase(phase).batch
    inputs = ("frames" if kind in ("vae", "frames") else
              ("T5/CLIP features precomputed" if t.precomputed_features else "T5/CLIP in the step") +
              ("" if kind == "turns" else ", VAE-encoded frames" if t.encode_latents else ", latents"))
    note = (f"global batch {t.global_batch_size} ({accum} micro-step(s) of {micro}), {', '.join(spec.components)}; "
            f"{trained / 1e6:.1f} M of {total / 1e6:.1f} M params trained; remat {t.remat}; {inputs}")
    return Program(phase, "train", lambda: trainer.lower(trainer.abstract_state(), batch), note, runs=accum, mesh=mesh,
                   model_flops=lambda: model_flops.train_flops(spec.model_fn, spec.loss_fn, spec.trainable, batch),
                   compiler_options=trainer.compiler_options)


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
