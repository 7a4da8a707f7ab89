"""A random stand-in :class:`~animegamer_jax.inference.turn_model.TurnModel` (NOT the AnimeGamer networks).

Used by the engine tests and by ``play --standin`` when no trained checkpoint is available; its
outputs are labelled ``"random stand-in"`` everywhere. Each stage keeps the data flow the real one
(turn_model.py ``RealTurnModel``) has, so the engine's invariants are testable: the MLLM stand-in embeds the
ids, overwrites the history query slots with projected history representations, runs one attention
layer with the release's mask semantics (causal + the current turn's bidirectional query block,
docs/token_layout.md#masks), reads s_a at ``read_idx`` and the states after ``last_idx``; the
sampler runs N steps from per-row noise conditioned on s_a and the flow value; the decoder
upsamples latents 4x in time (+1 frame) and 8x in space like the CogVideoX VAE. It takes reference
images (``--character``, its one optional capability, ``reference``): a mean-pooled projection
shifts the clip's conditioning.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from animegamer_jax.tokenizers import mllm_tokenizer
from animegamer_jax.inference.turn_model import CachedMLLM, CharacterBank, ChunkedDecode, PreviewDecoder, ReferenceEncoder
from animegamer_jax.models.cogvideox.dit import flow_value


def attention_bias(attention_mask: jax.Array) -> jax.Array:
    """Additive attention bias ``[B, L, L]`` from the release's 1-D mask (docs/token_layout.md#masks).

    Causal; positions with mask 0 are padding; the span from the first to the last ``-1`` is one
    fully visible block.
    """
    b, n = attention_mask.shape
    pos = jnp.arange(n)
    causal = pos[None, :, None] >= pos[None, None, :]
    neg = attention_mask == -1
    first = jnp.where(neg.any(-1), jnp.argmax(neg, -1), n)
    last = jnp.where(neg.any(-1), n - 1 - jnp.argmax(neg[:, ::-1], -1), -1)
    in_block = (pos[None] >= first[:, None]) & (pos[None] <= last[:, None])
    block = in_block[:, :, None] & in_block[:, None, :]
    valid = attention_mask != 0
    allowed = (causal | block) & valid[:, None, :]
    return jnp.where(allowed, 0.0, -1e9)


def hash_noise(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Cheap deterministic pseudo-noise in [-1.7, 1.7] from a uint32[2] key (stand-in only).

    Not ``jax.random``: threefry is slow to compile on a CPU, too slow for tests of a stand-in whose
    noise only has to be a deterministic, key-dependent function.
    """
    n = 1
    for d in shape:
        n *= d
    i = jnp.arange(n, dtype=jnp.float32)
    k = key.astype(jnp.float32)
    x = jnp.sin(i * (12.9898 + k[0] * 1e-9) + k[1] * 1e-6 + 78.233 * jnp.cos(i * 0.618 + k[0] * 1e-7))
    return (jnp.mod(x * 43758.5453, 1.0) * 2.0 - 1.0).reshape(shape) * 1.7


class StandinTurnModel:
    """A random stand-in :class:`~animegamer_jax.inference.turn_model.TurnModel` for ``config``
    (clearly labelled, not the real model); ``reference`` is its one capability."""

    def __init__(self, config, seed: int = 0, width: int = 16):
        self.rep_dim = config.rep.dim
        self.latent_shape = (config.dit.num_latent_frames, config.vae.latent_channels, config.dit.sample_height,
                             config.dit.sample_width)
        self.num_steps = config.diffusion.num_sampling_steps
        self.flow_table = tuple(config.dit.flow_table)
        self.scale = 1.0 / np.sqrt(width)
        self.label = f"random stand-in (seed {seed}; NOT trained, NOT AnimeGamer)"
        self.identity, self.description = "", ""
        self.free_decoding = False
        self.kv_cache: CachedMLLM | None = None
        self.streaming: ChunkedDecode | None = None
        self.reference: ReferenceEncoder | None = self._encode_reference
        self.characters: CharacterBank | None = None
        self.preview: PreviewDecoder | None = None
        d, c = self.rep_dim, self.latent_shape[1]
        rng = np.random.default_rng(seed)  # numpy: no threefry compile for a stand-in
        s = self.scale

        def normal(shape):
            return jnp.asarray(rng.standard_normal(shape), jnp.float32)

        self.params = {
            "embed": normal((mllm_tokenizer.VOCAB_SIZE, width)),
            "in_res": normal((d, width)) / jnp.sqrt(d),
            "qkv": normal((3, width, width)) * s,
            "out_res": normal((width, d)) * s,
            "state_head": normal((4, width, 11)) * s * 3.0,
            "cond": normal((d, c)) / jnp.sqrt(d),
            "rgb": normal((c, 3)),
        }

    def mllm(self, p, batch):
        x = p["embed"][batch["ids"]]  # [B, L, E]
        hist = jnp.einsum("bjqd,de->bjqe", batch["hist_reps"], p["in_res"])
        hist = jnp.where(batch["hist_valid"][:, :, None, None], hist, 0.0)
        bidx = jnp.arange(x.shape[0])[:, None, None]
        pos = jnp.where(batch["hist_valid"][:, :, None], batch["hist_pos"], x.shape[1])  # unused -> dropped
        x = x.at[bidx, pos].set(hist, mode="drop")
        q, k, v = (jnp.einsum("ble,ef->blf", x, p["qkv"][i]) for i in range(3))
        att = jax.nn.softmax(jnp.einsum("blf,bmf->blm", q, k) * self.scale + attention_bias(batch["attention_mask"]),
                             -1)
        hdn = x + jnp.einsum("blm,bmf->blf", att, v)
        read = jnp.take_along_axis(hdn, batch["read_idx"][:, :, None], axis=1)
        rep = jnp.einsum("bqe,ed->bqd", read, p["out_res"])
        last = jnp.take_along_axis(hdn, batch["last_idx"][:, None, None], axis=1)[:, 0]
        logits = jnp.einsum("be,fek->bfk", last, p["state_head"])
        states = jnp.argmax(logits, -1).astype(jnp.int32) + mllm_tokenizer.STRENGTH_MIN
        return states, rep

    def sample(self, p, rep, ml, keys, noise=None, reference=None):
        flow = flow_value(ml, self.flow_table)
        cond = jnp.tanh(jnp.einsum("bqd,dc->bc", rep, p["cond"]) / rep.shape[1])
        if reference is not None:  # the reference's mean latent pulls the clip's colour (stand-in only)
            cond = cond + reference.mean(axis=(1, 3, 4))
        noise = jax.vmap(lambda key: hash_noise(key, self.latent_shape))(keys)
        target = cond[:, None, :, None, None] * (1.0 + jnp.log1p(flow))[:, None, None, None, None]

        def body(i, x):
            return x + 0.2 * (target - x)

        return jax.lax.fori_loop(0, self.num_steps, body, noise)

    def decode(self, p, latents):
        rgb = jnp.einsum("btchw,ck->bthwk", latents, p["rgb"])
        first, rest = rgb[:, :1], jnp.repeat(rgb[:, 1:], 4, axis=1)
        video = jnp.concatenate([first, rest], axis=1)
        video = jnp.repeat(jnp.repeat(video, 8, axis=2), 8, axis=3)
        return jax.nn.sigmoid(video)

    def _encode_reference(self, p, images):
        # 8x8 mean-pooled pixels projected to the latent channels: [B, H, W, 3] -> [B, 1, C, H/8, W/8]
        x = images.astype(jnp.float32) / 255.0 - 0.5
        b, hh, ww, _ = x.shape
        x = x.reshape(b, hh // 8, 8, ww // 8, 8, 3).mean(axis=(2, 4))
        return jnp.einsum("bhwk,ck->bchw", x, p["rgb"])[:, None]
