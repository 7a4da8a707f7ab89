"""The compute of one AnimeGamer game turn, as pure jit-able functions.

Compiled ahead of time by ``python -m animegamer_jax.commands.aot`` (the ``prefill`` ... ``vae_decode``
programs) and run by the speed benchmarks (benchmarks/gpu_bench.py). Each piece is ``(fn, args)``
where ``fn`` is a pure function of ``(params_state, *inputs)`` and ``args`` are either real arrays
(``abstract=False``: random weights, random inputs) or ``jax.ShapeDtypeStruct`` with shardings
(``abstract=True``: nothing allocated, for ahead-of-time lowering). Pieces use bf16
weights with LoRA merged (``lora_rank=0``), as play does (``dit_sampling`` is play's own
``inference.clip_sampler.dit_sampler`` on ``prepare_for_inference`` weights). The train steps are
the train command's own (``aot.programs.train_program``).

Turn pieces (docs/overview.md#one-turn):
  mllm_prefill  pass A prompt: Mistral over the turn sequence with a KV cache (L from the window)
  mllm_decode   pass A: one jump-forward step on the cache: a chosen id + the state grammar's fixed ids
                (3 tokens, run 3 times per turn: the ten state ids, inference/mllm_turn.py)
  mllm_pass_b   pass B: one forward without logits (the 226-query read-out)
  dit_sampling  play's sampler: num_sampling_steps with CFG (batch 2 per game) through the DiT; with
                diffusion.sampler = "student", the distilled student's (models/registry.py
                build_student) num_sampling_steps calls, batch 1 per game (no CFG batch)
  vae_decode    latents [1, 5, 16, 60, 90] -> 17 frames 480x720 (play's chunks / tiles, inference.vae_decode.vae_decoder)
  preview_decode  the same latents -> 17 frames through the preview decoder (game.decoder preview modes,
                models/cogvideox/preview.py), as inference/turn_model.py runs it
  dit_reference   dit_sampling with a reference latent [B, 1, 16, 60, 90] and the reference adapter
                (training phase r): play's sampler for a turn that names a ``--character``; the
                reference's 1350 tokens join every DiT call (models/cogvideox/reference.py)
  reference_encode  one --character image uint8 [B, 480, 720, 3] -> its reference latent through the
                VAE encoder (once per character per game, game/engine.py reference_latents)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from animegamer_jax import parallel

from animegamer_jax.io import media
from animegamer_jax.diffusion import samplers
from animegamer_jax.inference.clip_sampler import dit_sampler, sampling_component
from animegamer_jax.inference import mllm_turn
from animegamer_jax.inference.mode import apply_mode
from animegamer_jax.inference.vae_decode import vae_decoder
from animegamer_jax.models import registry
from animegamer_jax.models.cogvideox.dit import CogVideoXDiT, DiTConfig, prepare_for_inference
from animegamer_jax.models.cogvideox.reference import encode_reference
from animegamer_jax.models.cogvideox.vae import CogVideoXVAE, VAEConfig
from animegamer_jax.models.mistral import model as mistral
from animegamer_jax.tokenizers.mllm_tokenizer import AnimeGamerTokenizer
from animegamer_jax.models.layers import quantize_int8
from animegamer_jax.models.mistral.mllm import num_queries


def turn_length(cfg, text_tokens: int = 25) -> int:
    """MLLM sequence length of a turn with a full window (history turns 1+text+230+14, current 1+text+230+1, BOS)."""
    q = num_queries(cfg)
    w = max(1, int(cfg.mllm.history_window))
    return 1 + (w - 1) * (1 + text_tokens + q + 4 + 14) + (1 + text_tokens + q + 4 + 1)


# ---------------------------------------------------------------- module builders

def dit_module_config(cfg, inference: bool):
    dc = DiTConfig.from_config(cfg.dit, text_length=num_queries(cfg))
    if inference:
        dc = dataclasses.replace(dc, lora_rank=0, param_dtype=cfg.dit.dtype, remat="none")
    return dc


def build_dit(cfg, inference: bool, seed: int = 0):
    return CogVideoXDiT(dit_module_config(cfg, inference), rngs=nnx.Rngs(seed))


def build_vae(cfg, seed: int = 0):
    return CogVideoXVAE.from_config(cfg.vae, rngs=nnx.Rngs(seed))


def build_mistral(cfg, inference: bool, seed: int = 0):
    """The Mistral decoder; ``inference``: LoRA merged (rank 0) and ``mllm.quantize`` applied."""
    over = {"lora_rank": 0} if inference else {"remat": "full"}
    m = mistral.Mistral.from_config(cfg.mllm, rngs=nnx.Rngs(seed), **over)
    if inference and cfg.mllm.get("quantize", "none") == "int8":
        quantize_int8(m.layers)
    return m


def decode_schedule() -> tuple[int, int]:
    """(tokens per decode step k, decode steps per turn) of play's constrained jump-forward pass A."""
    fixed = mllm_turn.jump_schedule(AnimeGamerTokenizer.state_grammar()[:mllm_turn.STATE_TOKENS])
    return fixed.shape[1] + 1, fixed.shape[0]


# ---------------------------------------------------------------- abstract / concrete helpers

@dataclasses.dataclass
class Piece:
    """A pure function and its arguments (concrete arrays or sharded ShapeDtypeStructs)."""

    name: str
    fn: Any
    args: tuple
    donate: tuple[int, ...] = ()
    note: str = ""
    #: vae_decode: latent frames of the decode's first chunk / all latent frames (play's chunk plan)
    first_chunk: tuple[int, int] = (1, 1)


class Builder:
    """Makes module states and inputs either real (random) or abstract (sharded shapes) on a mesh."""

    def __init__(self, cfg, mesh, abstract: bool, seed: int = 0):
        self.cfg, self.mesh, self.abstract = cfg, mesh, abstract
        self.rules = parallel.rules_from_config(cfg)
        self.key = jax.random.PRNGKey(seed)
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self.modules: dict[str, Any] = {}

    def module(self, make):
        """(graphdef, state) of ``make()``; abstract: sharded ShapeDtypeStructs, nothing allocated."""
        with parallel.sharding_context(self.mesh, self.rules):
            abs_mod = nnx.eval_shape(make)
        graphdef, abs_state = nnx.split(abs_mod)
        shardings = parallel.param_shardings(abs_state, self.mesh, self.rules)
        if self.abstract:
            def sds(x, s):  # same helper as train/loop.py: keep the Variable, swap in a sharded shape
                if isinstance(x, nnx.Variable):
                    raw = x.get_raw_value()
                    return x.replace(jax.ShapeDtypeStruct(raw.shape, raw.dtype, sharding=s))
                return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)

            state = jax.tree.map(sds, abs_state, shardings, is_leaf=lambda x: isinstance(x, nnx.Variable))
            return graphdef, state
        init = jax.jit(lambda: nnx.split(make())[1], out_shardings=shardings)
        with parallel.sharding_context(self.mesh, self.rules):
            return graphdef, init()

    def array(self, shape, dtype, batch_axis: bool = True, kind: str = "normal"):
        """An input: batch-sharded over the data axes (``act_batch``) when ``batch_axis``."""
        sharding = (parallel.batch_sharding(self.mesh, len(shape), self.rules, shape=shape)
                    if batch_axis and len(shape) else self.replicated)
        if self.abstract:
            return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sharding)
        self.key, k = jax.random.split(self.key)
        if kind == "ids":
            x = jax.random.randint(k, shape, 3, 32000, jnp.int32)
        elif kind == "pixels":
            x = jax.random.randint(k, shape, 0, 256, jnp.int32).astype(dtype)
        elif kind == "timesteps":
            x = jax.random.randint(k, shape, 0, 1000, jnp.int32)
        else:
            x = jax.random.normal(k, shape, jnp.float32).astype(dtype)
        return jax.device_put(x, sharding)


# ---------------------------------------------------------------- turn pieces

TURN_PIECES = ("mllm_prefill", "mllm_decode", "mllm_pass_b", "dit_sampling", "vae_decode", "preview_decode",
               "dit_reference", "reference_encode")


def reference_tokens(cfg) -> int:
    """Tokens a reference latent adds to every DiT call: one latent frame, patchified
    (``(sample_height / patch_size) * (sample_width / patch_size)``; 1350 at 60 x 90, patch 2)."""
    p = int(cfg.dit.patch_size)
    return (int(cfg.dit.sample_height) // p) * (int(cfg.dit.sample_width) // p)


def _cached(b: Builder, key: str, make):
    if key not in b.modules:
        b.modules[key] = b.module(make)
    return b.modules[key]


def _per_device_bytes(state) -> float:
    """Bytes of one device's shards of an abstract (sharded ``ShapeDtypeStruct``) state."""
    total = 0.0
    for x in jax.tree.leaves(state):
        shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
        total += float(np.prod(shape)) * jnp.dtype(x.dtype).itemsize
    return total


def _sampling_dit(cfg, b: Builder):
    """(graphdef, state) of the DiT play samples with, prepared as play prepares it (LoRA merged, cast
    to the activation dtype): the student for ``diffusion.sampler="student"``, else the teacher."""
    if sampling_component(apply_mode(cfg)) == "student":
        return _cached(b, "student_inference", lambda: prepare_for_inference(registry.build_student(cfg, nnx.Rngs(0))))
    return _cached(b, "dit_inference", lambda: prepare_for_inference(build_dit(cfg, inference=False)))


def _turn_weight_bytes(cfg, b: Builder) -> float:
    """Per-device bytes of the weights play holds through a turn (abstract): the MLLM as play loads it
    (LoRA merged, ``mllm.quantize``), the sampling DiT (teacher or student) and the VAE."""
    _, m = _cached(b, "mistral_inference", lambda: build_mistral(cfg, inference=True))
    _, d = _sampling_dit(cfg, b)
    _, v = _cached(b, "vae", lambda: build_vae(cfg))
    return sum(_per_device_bytes(s) for s in (m, d, v))


def make_turn_piece(cfg, b: Builder, name: str, batch: int = 1, text_tokens: int = 25) -> Piece:
    """One inference piece of a turn for ``batch`` games (modules are built once per Builder).

    Raises:
      KeyError: unknown piece name (see TURN_PIECES).
    """
    q, d = num_queries(cfg), int(cfg.rep.dim)
    if name.startswith("mllm_"):
        m_graph, m_state = _cached(b, "mistral_inference", lambda: build_mistral(cfg, inference=True))
        length = turn_length(cfg, text_tokens)
        new = int(cfg.mllm.max_new_tokens)
        mcfg = mistral.MistralConfig.from_config(cfg.mllm, lora_rank=0)
        cache_len = length + new
        shape = (mcfg.num_layers, batch, cache_len, mcfg.num_kv_heads, mcfg.head_dim)
        dt = jnp.dtype(mcfg.dtype)
        if b.abstract:
            # the cache is laid out like activations: batch over the data axes
            s = NamedSharding(b.mesh, parallel.logical_to_spec((None, "act_batch", None, None, None), b.rules,
                                                               shape=shape, mesh=b.mesh))
            cache = mistral.KVCache(jax.ShapeDtypeStruct(shape, dt, sharding=s),
                                    jax.ShapeDtypeStruct(shape, dt, sharding=s),
                                    jax.ShapeDtypeStruct((), jnp.int32, sharding=b.replicated))
        else:
            cache = mistral.KVCache.init(mcfg, batch, cache_len, dt)
        ids = b.array((batch, length), jnp.int32, kind="ids")
        if name == "mllm_prefill":
            def prefill(state, ids, cache):
                out = nnx.merge(m_graph, state)(ids, cache=cache)
                return jnp.argmax(out.logits[:, -1], -1).astype(jnp.int32), out.cache

            return Piece(name, prefill, (m_state, ids, cache), donate=(2,), note=f"L={length}, cache {cache_len}")
        if name == "mllm_decode":
            k, steps = decode_schedule()

            def decode(state, toks, cache):
                out = nnx.merge(m_graph, state)(toks, cache=cache)
                return jnp.argmax(out.logits[:, -1], -1).astype(jnp.int32), out.cache

            return Piece(name, decode, (m_state, b.array((batch, k), jnp.int32, kind="ids"), cache), donate=(2,),
                         note=f"{k} tokens x{steps} per turn (jump-forward), cache {cache_len}")
        if name == "mllm_pass_b":
            def pass_b(state, ids):
                return nnx.merge(m_graph, state)(ids, return_logits=False).hidden[:, -q:]

            return Piece(name, pass_b, (m_state, ids), note=f"L={length}, no logits")
    lat_shape = (batch, int(cfg.dit.num_latent_frames), int(cfg.dit.in_channels), int(cfg.dit.sample_height),
                 int(cfg.dit.sample_width))
    if name in ("dit_sampling", "dit_reference"):
        # exactly play's program: inference/turn_model.py RealTurnModel prepares the weights once (LoRA merged, cast to the
        # activation dtype) and samples with dit_sampler (noise from each game's key, CFG; the student:
        # its own weights, guidance scale as an input, no CFG batch); dit_reference: the same sampler
        # built with the reference adapter's graph, called with each game's reference latent, as play
        # samples a turn that names a --character (game/engine.py _sample_refs)
        play_cfg = apply_mode(cfg)
        with_reference = name == "dit_reference"
        d_graph, d_state = _sampling_dit(cfg, b)
        if sampling_component(play_cfg) == "student":
            what = f"{int(play_cfg.diffusion.num_sampling_steps)} steps, no CFG batch (student)"
        else:
            what = f"{samplers.plan_from_config(play_cfg.diffusion).num_steps} steps x CFG batch 2"
        g_ref = None
        if with_reference:  # the adapter as play holds it (turn_model.py: the component, uncast)
            g_ref, s_ref = _cached(b, "reference", lambda: registry.build_reference(cfg, nnx.Rngs(0)))
        sample = dit_sampler(d_graph, play_cfg, g_ref)

        def sampling(state, rep, uncond, ml, keys):
            return sample({"dit": state, "uncond": uncond}, rep, ml, keys)

        def sampling_reference(state, rep, uncond, ml, keys, ref_state, reference):
            return sample({"dit": state, "uncond": uncond, "reference": ref_state}, rep, ml, keys, reference=reference)

        bsh = parallel.batch_sharding(b.mesh, 1, b.rules, shape=(batch,))
        ksh = parallel.batch_sharding(b.mesh, 2, b.rules, shape=(batch, 2))
        if b.abstract:
            keys = jax.ShapeDtypeStruct((batch, 2), jnp.uint32, sharding=ksh)
            ml = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=bsh)
            uncond = jax.ShapeDtypeStruct((q, d), jnp.float32, sharding=b.replicated)
        else:
            keys = jax.device_put(jax.random.split(jax.random.PRNGKey(1), batch), ksh)
            ml = jax.device_put(jnp.full((batch,), 3, jnp.int32), bsh)
            uncond = b.array((q, d), jnp.float32, batch_axis=False)
        args = (d_state, b.array((batch, q, d), jnp.float32), uncond, ml, keys)
        if with_reference:
            ref = b.array((batch, 1, int(cfg.dit.in_channels), int(cfg.dit.sample_height), int(cfg.dit.sample_width)),
                          jnp.float32)
            return Piece(name, sampling_reference, args + (s_ref, ref),
                         note=f"{what}, {batch} game(s), play's program with a reference latent "
                              f"(+{reference_tokens(cfg)} tokens per DiT call)")
        return Piece(name, sampling, args, note=f"{what}, {batch} game(s), play's program")
    if name == "reference_encode":
        # play's reference encode (inference/turn_model.py RealTurnModel.reference via game/engine.py reference_latents):
        # one --character image, fitted to the clip's size, VAE-encoded to one latent frame; once per
        # character per game, not per turn
        v_graph, v_state = _cached(b, "vae", lambda: build_vae(cfg))
        scale = float(cfg.vae.scaling_factor)

        def reference_encode(state, images):
            return encode_reference(nnx.merge(v_graph, state), images, scale)

        sf = 2 ** (len(tuple(cfg.vae.block_out_channels)) - 1)
        hw = (sf * int(cfg.dit.sample_height), sf * int(cfg.dit.sample_width))
        return Piece(name, reference_encode, (v_state, b.array((batch, *hw, 3), jnp.uint8, kind="pixels")),
                     note=f"{batch} image(s) {hw[0]}x{hw[1]} -> [{batch}, 1, {int(cfg.dit.in_channels)}, "
                          f"{int(cfg.dit.sample_height)}, {int(cfg.dit.sample_width)}], once per character per game")
    if name == "vae_decode":
        # exactly play's VAE stage (inference/vae_decode.py vae_decoder: tiling / chunks as play resolves them)
        v_graph, v_state = _cached(b, "vae", lambda: build_vae(cfg))
        # decode_devices: decide tiling as on that many devices (a 1-device compile of the same program)
        n_dev = getattr(b, "decode_devices", 0) or b.mesh.size
        # a compile-only chip reports no memory stats: the decode budget is its HBM less the turn's
        # other weights, as play's memory_stats would show them (vae_tiling.device_decode_budget)
        resident = _turn_weight_bytes(cfg, b) if b.abstract else 0.0
        decode, _, plan = vae_decoder(v_graph, VAEConfig.from_config(cfg.vae), cfg, num_devices=n_dev,
                                      device=b.mesh.devices.flat[0], resident_bytes=resident)
        first = (int(plan[0]), int(sum(plan))) if plan else (int(cfg.dit.num_latent_frames),) * 2

        def vae_decode(state, latents):
            return decode({"vae": state}, latents)

        return Piece(name, vae_decode, (v_state, b.array(lat_shape, jnp.float32)), note=f"play's decode; {decode.why}", first_chunk=first)
    if name == "preview_decode":
        # play's preview stage (inference/turn_model.py RealTurnModel.preview): frames in [0, 1] from the preview decoder
        p_graph, p_state = _cached(b, "preview", lambda: registry.build_preview(cfg, nnx.Rngs(0)))

        def preview_decode(state, latents):
            return media.to_unit(nnx.merge(p_graph, state)(latents), media.VAE_RANGE)

        return Piece(name, preview_decode, (p_state, b.array(lat_shape, jnp.float32)),
                     note=f"preview decoder, channels {tuple(cfg.preview.channels)}")
    raise KeyError(f"unknown turn piece {name!r}; known: {TURN_PIECES}")


# ---------------------------------------------------------------- running

def jit_piece(p: Piece):
    return jax.jit(p.fn, donate_argnums=p.donate)


def lower_piece(p: Piece, b: Builder):
    """``jax.jit(fn).lower(*args)`` under the mesh and logical rules (activation constraints apply)."""
    with parallel.sharding_context(b.mesh, b.rules):
        return jit_piece(p).lower(*p.args)


def count_bytes(tree) -> int:
    return int(sum(np.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)
                   if hasattr(x, "shape")))
