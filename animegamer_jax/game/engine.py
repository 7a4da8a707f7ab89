"""The game engine: a batch of games advanced turn by turn through three jitted stages.

One turn (docs/overview.md#one-turn, paper §3.2 "Inference"):

1. **MLLM** (``model.mllm``): token layout of the last W turns (inference/turn_inputs.py) + history
   representations -> predicted states ``[ML, SC, ET, ST]`` (constrained greedy decoding) and the
   representation s_a ``[Q, rep_dim]``.
2. **Sampling** (``model.sample``): ML -> flow value (``config.dit.flow_table``,
   docs/dit.md#motion-level-to-flow) -> DPM++ 2M with dynamic CFG (uncond = E_a's unconditional
   embedding, docs/encoders.md#unconditional-embedding, docs/diffusion.md#guidance) -> latents.
3. **VAE** (``model.decode``): latents -> frames float ``[T, 8h, 8w, 3]`` in [0, 1]
   (docs/diffusion.md#latent-scale).
4. **Writing** (game/folder/): per-turn MP4/GIF with the meters HUD, game video, game.json, gallery.

The three stages are ``jax.jit`` functions of (params, inputs) whose input shapes depend only on
the game shape (batch B = the mesh's data-parallel size, padded sequence length L, Q, D), so each
compiles once; compilation time is measured from JAX's own compile events and reported apart from
run time. Every stage is traced and run inside the engine's mesh and logical rules
(``parallel.sharding_context``), so the models' sharding constraints are active.

Two layouts (``config.game.play_layout``, inference/layout.py ``apply_layout``):

* ``batch`` (generate, and play with ``--config.game.play_layout=batch``): the config's mesh; one
  game per data-parallel slice (``rows`` of them with the web server's ``--max_batch``), B = rows x
  data-parallel size (a short batch is padded with filler rows).
* ``latency`` (play's default): ONE game on every device, B = 1 and no filler rows. The mesh is
  ``latency_mesh_shape`` (CFG halves on ``data``, the DiT's joint sequence on ``context``:
  cfg 2 x context n/2); weights are sharded over every device (``embed`` on data, fsdp and
  context, ZeRO-3 style, all-gathered per layer) and the VAE's frames over height (``context``) and
  width (``data``); ``game.latency_weights = "replicated"`` keeps the weights whole on each device
  instead. Compiled per-chip memory and FLOPs: ``python -m animegamer_jax.commands.aot --program=turn``.

Games in a batch are independent rows: their noise comes from their own keys, so a game gives the
same output alone or in a batch. Turn k of a game samples with the key ``turn_key(game_seed, k)``
(inference/clip_sampler.py).

The engine plays any :class:`~animegamer_jax.inference.turn_model.TurnModel`: the real networks
(inference/turn_model.py ``RealTurnModel``) loaded from a system checkpoint (game/loading.py), or the
random stand-in of the tests (inference/standin_model.py). Its optional capabilities (the KV cache,
the streaming decode, reference images, character LoRAs, the preview decoder) are asked about once,
here in ``__init__``, and at the turn's few forks.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from animegamer_jax import parallel

from animegamer_jax.tokenizers import mllm_tokenizer
from animegamer_jax.game.characters import fit_image
from animegamer_jax.game.run import GameRun, Meters, TurnResult
from animegamer_jax.inference import executables
from animegamer_jax.inference.clip_sampler import turn_key
from animegamer_jax.inference.instructions import Game
from animegamer_jax.inference.mode import apply_mode
from animegamer_jax.inference.release_decoding import states_from_generated
from animegamer_jax.inference.turn_model import STAGES, TurnModel, check_capabilities
from animegamer_jax.inference.turn_inputs import (TurnKVCache, WindowSpec, build_cached_turn_input, encode_instruction,
                                                  stack_cached_inputs, stack_inputs)

class _CompileTimer:
    """Sums JAX compile-event durations (trace + lower + backend compile) seen on this thread."""

    _lock = threading.Lock()
    _installed = False
    _active: list["_CompileTimer"] = []

    def __init__(self) -> None:
        self.seconds = 0.0
        self.count = 0

    @classmethod
    def _listener(cls, name: str, secs: float, **_: Any) -> None:
        if not name.startswith("/jax/core/compile/"):
            return
        for t in list(cls._active):
            t.seconds += secs
            if name.endswith("backend_compile_duration"):
                t.count += 1

    @contextlib.contextmanager
    def measure(self):
        with _CompileTimer._lock:
            if not _CompileTimer._installed:
                jax.monitoring.register_event_duration_secs_listener(_CompileTimer._listener)
                _CompileTimer._installed = True
        _CompileTimer._active.append(self)
        try:
            yield self
        finally:
            _CompileTimer._active.remove(self)


def _ignore(*_: Any) -> None:
    """A callback that does nothing (:meth:`GameEngine.play`'s default ``on_turn``)."""


class GameEngine:
    """Plays batches of games with a :class:`~animegamer_jax.inference.turn_model.TurnModel` on a mesh.

    Args:
      config: the run config (``game.mode`` already applied or not: applied here; the layout's
        mesh and rules already applied, inference/layout.py ``apply_layout``).
      model: the turn's stages and their params.
      mesh: the device mesh; the batch is split over its data axes (default: from config).
      latency: one game on the whole mesh (batch 1, no filler rows; inputs replicated, the work
        split by the models' sharding constraints); False: ``batch`` layout (module docstring).
      rows: games per data-parallel slice in the ``batch`` layout (the web server's ``--max_batch``):
        ``batch_size = rows x data-parallel size``; ignored by the latency layout.

    Raises:
      ValueError: ``rows`` below 1, or a config asking the model for a capability it lacks
        (inference/turn_model.py ``check_capabilities``).
    """

    def __init__(self, config, model: TurnModel, mesh=None, latency: bool = False, rows: int = 1):
        if int(rows) < 1:
            raise ValueError(f"rows must be at least 1, got {rows}")
        self.config = apply_mode(config)
        check_capabilities(model, self.config)
        self.model = model
        self.mesh = mesh if mesh is not None else parallel.mesh_from_config(self.config)
        self.rules = parallel.rules_from_config(self.config)
        self.spec = WindowSpec.from_config(self.config)
        self.rep_dim = self.config.rep.dim
        self.latency = bool(latency)
        self.batch_size = 1 if self.latency else int(rows) * parallel.data_parallel_size(self.mesh, self.rules)
        self.tok = mllm_tokenizer.get_tokenizer()
        self._replicated = replicated = NamedSharding(self.mesh, PartitionSpec())

        def place(x):
            # keep arrays already laid out on this mesh (e.g. FSDP-sharded checkpoint weights)
            if isinstance(getattr(x, "sharding", None), NamedSharding) and x.sharding.mesh == self.mesh:
                return x
            return jax.device_put(x, replicated)

        def place_component(v):
            # NNX states go where their logical annotations and the rules say; the rest replicated
            if isinstance(v, nnx.State):
                return jax.device_put(v, parallel.param_shardings(v, self.mesh, self.rules))
            return jax.tree.map(place, v)

        if isinstance(model.params, dict):
            self.params = {k: place_component(v) for k, v in model.params.items()}
        else:
            self.params = jax.tree.map(place, model.params)
        # each stage's jit loads a saved executable when a folder is in use (--executables, inference/executables.py)
        executables.select(self.config, list(self.mesh.devices.flat))
        self.mllm_fn = executables.StageJit("mllm", model.mllm)
        self.sample_fn = executables.StageJit("sampling", model.sample)
        self.decode_fn = executables.StageJit("vae", model.decode)
        self.decode_chunk_fn = (executables.StageJit("vae_chunk", model.streaming.chunk)
                                if model.streaming is not None else None)
        # game.decoder: "full" (the VAE), "preview" (the preview decoder's frames are the clip) or
        # "preview_then_full" (its frames reported first, then the VAE's, which are the clip)
        self.decoder = str(self.config.game.get("decoder", "full"))
        self.preview_fn = executables.StageJit("preview", model.preview) if self.decoder != "full" else None
        #: whether the model plays characters from a reference image (``--character``)
        self.supports_references = model.reference is not None
        self.encode_reference_fn = jax.jit(model.reference) if self.supports_references else None
        #: the stored character LoRAs' names, in their order (() for a model without them)
        self.character_names = () if model.characters is None else model.characters.names
        self._select_fn = jax.jit(lambda m, a, b: jax.numpy.where(m[:, None, None, None, None], a, b))
        self._character_params: dict[int | None, Any] = {None: self.params}  # made once per character
        self.compile_s = dict.fromkeys(STAGES, 0.0)
        self.compiles = dict.fromkeys(STAGES, 0)
        self.cache_rebuilds = 0  # games whose MLLM cache was rebuilt by recompute (turn_window)
        self.persistent_cache = self.spec.history_attention == "turn_window"
        if self.persistent_cache:  # check_capabilities: the model has a kv_cache
            self.mllm_cached_fn = executables.StageJit("mllm_cached", model.kv_cache.turn)
            self.mllm_prefill_fn = executables.StageJit("mllm_prefill", model.kv_cache.prefill)

    def cache_sizes(self) -> dict[str, int]:
        """Compiled executables held by each stage's jit (1 each once warmed up on one game shape)."""
        return {"mllm": self.mllm_fn._cache_size(), "sampling": self.sample_fn._cache_size(),
                "vae": self.decode_fn._cache_size()}

    @functools.cached_property
    def frame_size(self) -> tuple[int, int]:
        """The clip's (height, width) in pixels, from the decoder's output shape (traced, not run)."""
        c = self.config
        z = jax.ShapeDtypeStruct((1, c.dit.num_latent_frames, c.vae.latent_channels, c.dit.sample_height,
                                  c.dit.sample_width), np.float32)
        out = jax.eval_shape(self.model.decode, self.params, z)
        return int(out.shape[2]), int(out.shape[3])

    def reference_latents(self, characters) -> dict[str, np.ndarray]:
        """Each character's reference latent (game/characters.py): its image fitted to the clip size
        and VAE-encoded alone (batch 1, so a latent never depends on the other characters), float32
        ``[1, C, h, w]``, keyed by the casefolded name. Called once per game; {} for no characters.

        Raises:
          ValueError: characters given to a system without reference support.
        """
        if not characters:
            return {}
        if not self.supports_references:
            raise ValueError(f"system {self.model.label!r} has no reference adapter")
        h, w = self.frame_size
        out = {}
        for c in characters:
            img = jax.device_put(fit_image(c.pixels(), h, w)[None], self._replicated)
            out[c.name.casefold()] = np.asarray(jax.device_get(self.encode_reference_fn(self.params, img)))[0]
        return out

    def character_index(self, character_field: str) -> int | None:
        """The stored character LoRA a turn's Character field names (case-insensitive), else None."""
        key = character_field.strip().casefold()
        return next((i for i, n in enumerate(self.character_names) if n.casefold() == key), None)

    def _params_for(self, character: int | None):
        """The sampling params of turns naming stored character ``character`` (its LoRA folded into the
        DiT, made once per character and kept, laid out as the DiT's own), or the model's (None)."""
        if character not in self._character_params:
            dit = self.params["dit"]
            fn = jax.jit(self.model.characters.apply, static_argnums=1,
                         out_shardings=jax.tree.map(lambda x: x.sharding, dit))
            with parallel.sharding_context(self.mesh, self.rules):
                self._character_params[character] = {**self.params, "dit": fn(self.params, character)}
        return self._character_params[character]

    def _sample(self, rep, ml, keys, references: Sequence, characters: Sequence) -> tuple[Any, float]:
        """The sampling stage: one call per stored character LoRA the rows name (``characters``: per
        row an index into :attr:`character_names` or None), each with that character's params
        (:meth:`_params_for`), every row taking its own call's latents; rows naming none run with the
        model's params exactly as without character LoRAs."""
        first, *others = dict.fromkeys(characters)
        out, total = self._sample_refs(self._params_for(first), rep, ml, keys, references)
        for c in others:
            latents, t = self._sample_refs(self._params_for(c), rep, ml, keys, references)
            total += t
            mask = self._shard(np.asarray([x == c for x in characters]))
            with parallel.sharding_context(self.mesh, self.rules):
                out = self._select_fn(mask, latents, out)
        return out, total

    def _sample_refs(self, params, rep, ml, keys, references: Sequence) -> tuple[Any, float]:
        """The sampling stage: today's call when no row has a reference; else the call with each
        row's reference latent (rows without one get a copy of another row's, output dropped) and,
        when some rows have none, today's call too, each row taking its own call's latents. Every row
        runs the program it runs alone, so its output does not depend on the batch."""
        has = [r is not None for r in references]
        if not any(has):
            latents, t, _ = self._timed("sampling", self.sample_fn, params, rep, ml, keys)
            return latents, t
        fill = references[has.index(True)]
        ref = self._shard(np.stack([r if h else fill for r, h in zip(references, has)]).astype(np.float32))
        with_ref, t_ref, _ = self._timed("sampling", self.sample_fn, params, rep, ml, keys, None, reference=ref)
        if all(has):
            return with_ref, t_ref
        plain, t_plain, _ = self._timed("sampling", self.sample_fn, params, rep, ml, keys)
        mask = self._shard(np.asarray(has))
        with parallel.sharding_context(self.mesh, self.rules):
            return self._select_fn(mask, with_ref, plain), t_ref + t_plain

    def _timed(self, stage: str, fn, *args, **kwargs):
        timer = _CompileTimer()
        t0 = time.perf_counter()
        with timer.measure(), parallel.sharding_context(self.mesh, self.rules):
            out = fn(*args, **kwargs)
            out = jax.block_until_ready(out)
        wall = time.perf_counter() - t0
        self.compile_s[stage] += timer.seconds
        self.compiles[stage] += timer.count
        return out, max(0.0, wall - timer.seconds), timer.seconds

    def _shard(self, tree):
        if self.latency:  # one game: every device sees the whole (tiny) input
            return jax.tree.map(lambda x: jax.device_put(np.asarray(x), self._replicated), tree)
        return parallel.shard_batch(tree, self.mesh, self.rules)

    def game_seed(self, game: Game) -> int:
        return int(game.seed) if game.seed is not None else int(self.config.game.seed)

    def new_run(self) -> GameRun:
        """The empty running state of one game (meters at ``game.meter_start``)."""
        return GameRun(self.spec, self.rep_dim, Meters(*(int(self.config.game.meter_start),) * 3))

    def step(self, runs: Sequence[GameRun], seeds: Sequence[int], current_ids: Sequence[Sequence[int]],
             turn_index: Sequence[int], on_frames: Callable[[int, np.ndarray], None] | None = None,
             references: Sequence[np.ndarray | None] = (),
             characters: Sequence[int | None] = ()) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
        """Runs one turn for ``batch_size`` rows (does not record it in ``runs``).

        Args:
          runs: per row, the game's running state (its window supplies the history).
          seeds: per row, the game seed.
          current_ids: per row, the current instruction ids.
          turn_index: per row, the turn number k (selects the PRNG key).
          on_frames: optional ``(first_frame, frames float32 [B, f, H, W, 3])``, called as frames
            are decoded: once per VAE chunk when the model has the ``streaming`` capability, else once
            with the whole clip. Its own time is not counted in the stage timings. With
            ``game.decoder=preview_then_full`` the first call is the preview decoder's whole clip and
            the VAE's calls then start again at frame 0: a call replaces the frames from its
            ``first_frame`` on. With ``game.decoder=preview``: one call, the preview's clip.
          references: optional, per row, the reference latent ``[1, C, h, w]`` of the character the
            row's turn names (:meth:`reference_latents`) or None (decoded as without references);
            empty: none for every row.
          characters: optional, per row, the stored character LoRA the row's turn names
            (:meth:`character_index`) or None (decoded with the model's DiT as it is); empty: none
            for every row.

        Returns:
          states int ``[B, 4]``, rep float32 ``[B, Q, rep_dim]``, frames float32 ``[B, T, 8h, 8w, 3]``,
          and timings: stage run times ``{"mllm_s", "sampling_s", "vae_s"}`` (compile excluded; the
          preview decode counts in ``vae_s`` and, with a preview mode, also alone as ``preview_s``), and
          wall times from the turn's start, compiles included: ``ttff_s`` until the first decoded
          frames are on the host (the first ``on_frames`` call; without ``on_frames``, when the
          clip is decoded) and ``turn_s`` until the turn's outputs are.
        """
        t_start = time.perf_counter()
        first: list[float] = []
        streaming = on_frames is not None and self.decode_chunk_fn is not None
        report = on_frames or _ignore

        def frames_ready(start: int, chunk: np.ndarray) -> None:
            if not first:
                first.append(time.perf_counter() - t_start)
            report(start, chunk)

        if self.persistent_cache:
            states, rep, t_mllm = self._mllm_cached(runs, current_ids)
        else:
            inputs = [run.next_input(ids) for run, ids in zip(runs, current_ids)]
            batch = self._shard(stack_inputs(inputs))
            (states, rep), t_mllm, _ = self._timed("mllm", self.mllm_fn, self.params, batch)
        if self.model.free_decoding:  # generated ids -> states on the host (the release's parser)
            states = self._shard(states_from_generated(np.asarray(jax.device_get(states))))
        keys = self._shard(np.stack([turn_key(s, k) for s, k in zip(seeds, turn_index)]))
        latents, t_samp = self._sample(rep, states[:, 0], keys, references or [None] * len(runs),
                                       characters or [None] * len(runs))
        t_prev = 0.0
        if self.decoder != "full":
            frames, t_prev, _ = self._timed("vae", self.preview_fn, self.params, latents)
            frames_ready(0, np.asarray(jax.device_get(frames)))
        if self.decoder == "preview":
            t_vae = t_prev
        elif streaming:
            frames, t_vae = self._decode_streaming(latents, frames_ready)
            t_vae += t_prev
        else:
            frames, t_vae, _ = self._timed("vae", self.decode_fn, self.params, latents)
            frames_ready(0, np.asarray(jax.device_get(frames)))
            t_vae += t_prev
        states_np, rep_np, frames_np = (np.asarray(jax.device_get(x)) for x in (states, rep, frames))
        timing = {"mllm_s": t_mllm, "sampling_s": t_samp, "vae_s": t_vae, "ttff_s": first[0],
                  "turn_s": time.perf_counter() - t_start}
        if self.decoder != "full":  # only in the preview modes: "full" keeps its timing keys
            timing["preview_s"] = t_prev
        return states_np, rep_np, frames_np, timing

    def _synced_cache(self, run: GameRun):
        """``run``'s MLLM cache for its finished turns, rebuilt by recompute when it has none that
        matches (a new, undone or resumed game): the shared prefill of every finished turn in order,
        from that turn's stored states and s_a. Returns the batch-1 cache."""
        if run.cache_matches():
            return run.kv_cache
        plan = self.model.kv_cache.plan
        cache = jax.device_put(self.model.kv_cache.init(1), self._replicated)  # the jit outputs' sharding
        if run.history:
            self.cache_rebuilds += 1
        for t, rec in enumerate(run.history):
            inp = build_cached_turn_input(run.history[:t], rec.text_ids, run.spec, run.rep_dim, plan)
            cache, _, _ = self._timed("mllm", self.mllm_prefill_fn, self.params, cache,
                                      jax.device_put(stack_cached_inputs([inp]), self._replicated))
        run.kv_cache, run.kv_records = cache, tuple(run.history)
        return cache

    def _mllm_cached(self, runs: Sequence[GameRun], current_ids: Sequence[Sequence[int]]):
        """The MLLM stage on the games' persistent caches; each run's updated cache is left in
        ``run.kv_pending`` (adopted by ``finish_turn``). Returns (states, rep, run seconds)."""
        t0 = time.perf_counter()
        compile0 = self.compile_s["mllm"]
        caches = [self._synced_cache(run) for run in runs]
        plan = self.model.kv_cache.plan
        rows = [run.next_cached_input(ids, plan) for run, ids in zip(runs, current_ids)]
        cache = TurnKVCache.concat(caches)
        batch = jax.device_put(stack_cached_inputs(rows), self._replicated)
        (states, rep, new_cache), _, _ = self._timed("mllm", self.mllm_cached_fn, self.params, cache, batch)
        for b, run in enumerate(runs):
            run.kv_pending = (tuple(run.history), new_cache if len(runs) == 1 else new_cache.rows(b, b + 1))
        wall = time.perf_counter() - t0 - (self.compile_s["mllm"] - compile0)
        return states, rep, max(0.0, wall)

    def _decode_streaming(self, latents, on_frames) -> tuple[np.ndarray, float]:
        """``decode`` run one chunk of the model's ``streaming.plan`` at a time, the causal cache carried
        between calls; ``on_frames`` gets each chunk's frames. Returns (frames [B, T, 8h, 8w, 3], s)."""
        plan = tuple(int(n) for n in self.model.streaming.plan)
        if not plan or sum(plan) != latents.shape[1]:
            raise ValueError(f"decode_plan {plan} does not split {latents.shape[1]} latent frames")
        cache, chunks, start, total = None, [], 0, 0.0
        for n in plan:
            z = jax.lax.slice_in_dim(latents, start, start + n, axis=1)
            (out, cache), secs, _ = self._timed("vae", self.decode_chunk_fn, self.params, z, cache)
            total += secs
            chunk = np.asarray(jax.device_get(out))
            on_frames(sum(c.shape[1] for c in chunks), chunk)
            chunks.append(chunk)
            start += n
        return np.concatenate(chunks, axis=1), total

    def play(self, games: Sequence[Game], on_turn: Callable[[int, list], None] = _ignore) -> list[dict]:
        """Plays up to ``batch_size`` games together; returns one result dict per game.

        Each result: ``{"game": Game, "seed": int, "turns": [TurnResult...], "timings": {...},
        "text_ids": [ids per turn]}`` with per-turn stage timings (seconds, wall of the batched call,
        compile excluded), each turn's instruction ids and the compile seconds of this call.

        Raises:
          ValueError: more games than the batch size, or no game.
          InstructionTooLongError: an instruction over ``game.max_instruction_tokens``.
        """
        if not games or len(games) > self.batch_size:
            raise ValueError(f"play takes 1..{self.batch_size} games, got {len(games)}"
                             + (" (latency layout: one game on all devices)" if self.latency else ""))
        # batch layout: a short batch is padded with copies of game 0 (outputs dropped); the
        # latency layout has batch 1, so never pads
        rows = list(games) + [games[0]] * (self.batch_size - len(games))
        text_ids = [[encode_instruction(t.text, self.spec, self.tok) for t in g.turns] for g in rows]
        runs = [self.new_run() for _ in rows]
        seeds = [self.game_seed(g) for g in rows]
        results = [{"game": g, "seed": s, "turns": [], "timings": [], "text_ids": [tuple(i) for i in ids]}
                   for g, s, ids in zip(games, seeds, text_ids)]
        n_turns = max(len(g.turns) for g in games)
        ref_latents = [self.reference_latents(g.characters) for g in games]  # once per game
        ref_latents += [ref_latents[0]] * (len(rows) - len(games))
        compile_before = dict(self.compile_s)
        for k in range(n_turns):
            # A finished game repeats its last turn as a filler row; its outputs are dropped.
            ks = [min(k, len(ids) - 1) for ids in text_ids]
            cur = [ids[kk] for ids, kk in zip(text_ids, ks)]
            refs = [lat.get(g.turns[kk].character.strip().casefold()) for lat, g, kk in zip(ref_latents, rows, ks)]
            chars = [self.character_index(g.turns[kk].character) for g, kk in zip(rows, ks)]
            states_np, rep_np, frames_np, timing = self.step(runs, seeds, cur, ks, references=refs, characters=chars)
            timing["batch"] = len(games)
            for b, g in enumerate(games):
                if k >= len(g.turns):
                    continue
                st = tuple(int(v) for v in states_np[b])
                meters = runs[b].finish_turn(text_ids[b][k], st, rep_np[b], int(self.config.game.meter_step))
                results[b]["turns"].append(TurnResult(st, rep_np[b], frames_np[b], meters.as_dict()))
                results[b]["timings"].append(dict(timing))
            on_turn(k, results)
        compile_now = {s: self.compile_s[s] - compile_before[s] for s in STAGES}
        for r in results:
            r["compile_s"] = compile_now
        return results


def batches(games: Sequence[Game], size: int) -> list[list[Game]]:
    """Groups games with equal turn counts (stable order), ``size`` at a time: the batches
    :meth:`GameEngine.play` takes (``size`` = ``GameEngine.batch_size``)."""
    order = sorted(range(len(games)), key=lambda i: (len(games[i].turns), i))
    ordered = [games[i] for i in order]
    out: list[list[Game]] = []
    for g in ordered:
        if out and len(out[-1]) < size and len(out[-1][0].turns) == len(g.turns):
            out[-1].append(g)
        else:
            out.append([g])
    return out

