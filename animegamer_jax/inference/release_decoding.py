"""The release's decoding quirks (``reference`` mode): what its inference scripts do, for output parity.

Each function reproduces one documented behaviour of the released TencentARC/AnimeGamer inference
code (``inference_MLLM.py``, ``inference_Decoder.py``; docs/release_quirks.md,
docs/token_layout.md#state-fields, docs/mllm.md#logits-processor, docs/diffusion.md#sampler,
docs/vae.md#chunked-decoding; the fixture README "Release behaviour a reimplementation must
reproduce"):

* :func:`video_token_logits`: ``AutoVideoTokenGenerationProcessor(num_vid_gen_tokens=100)``.
* :func:`release_text` / :func:`parse_release_states`: the slow-tokenizer decode of pass A and the
  release's ``text.split(' ')`` parser (zeros on any failure).
* :func:`release_step_noise`: which of the release sampler's ``randn_like`` draws each step uses.
* :func:`release_uint8`: the truncating uint8 conversion of ``save_video_as_grid_and_mp4``.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from animegamer_jax.tokenizers import mllm_tokenizer

#: ``AutoVideoTokenGenerationProcessor`` default
NUM_VID_GEN_TOKENS = 100


def video_token_chain(num_vid_gen_tokens: int = NUM_VID_GEN_TOKENS) -> np.ndarray:
    """``[<frame>, <frame_00000> .. <frame_{n-1}>, </frame>]`` ids (int32 [n + 2])."""
    first = mllm_tokenizer.FRAME_BASE_ID
    return np.asarray([mllm_tokenizer.FRAME_ID, *range(first, first + num_vid_gen_tokens), mllm_tokenizer.FRAME_END_ID],
                      np.int32)


def video_token_logits(prev: jax.Array, logits: jax.Array,
                       num_vid_gen_tokens: int = NUM_VID_GEN_TOKENS) -> jax.Array:
    """The release's logits processor (docs/mllm.md#logits-processor), applied before the greedy argmax.

    If the previous token is in the chain ``[<frame>, <frame_0..n-1>]`` the next chain id gets
    ``max(logits) + 10`` (forced); otherwise the logits of ``<frame_00000..n-1>`` and ``</frame>``
    are set to **0.0** (not -inf: they win when every other logit is negative).

    Args:
      prev: int [B] previous token (the prompt's last token at the first step).
      logits: float32 [B, V].

    Returns:
      float32 [B, V].
    """
    chain = jnp.asarray(video_token_chain(num_vid_gen_tokens))
    hit = prev[:, None] == chain[None, :-1]  # [B, n+1]
    in_chain = hit.any(axis=-1)
    nxt = chain[1:][jnp.argmax(hit, axis=-1)]  # [B]
    vocab = jnp.arange(logits.shape[-1])
    forced = jnp.where(vocab[None, :] == nxt[:, None], logits.max(axis=-1, keepdims=True) + 10.0, logits)
    zeroed_ids = (vocab >= mllm_tokenizer.FRAME_BASE_ID) & (vocab < mllm_tokenizer.FRAME_BASE_ID + num_vid_gen_tokens)
    zeroed_ids = zeroed_ids | (vocab == mllm_tokenizer.FRAME_END_ID)
    zeroed = jnp.where(zeroed_ids[None, :], 0.0, logits)
    return jnp.where(in_chain[:, None], forced, zeroed)


def trim_at_eos(ids: Sequence[int]) -> list[int]:
    """Generated ids up to and including the first ``</s>`` (HF ``generate`` stops there)."""
    out = []
    for i in ids:
        out.append(int(i))
        if int(i) == mllm_tokenizer.EOS_ID:
            break
    return out


def release_text(ids: Sequence[int], tok: mllm_tokenizer.AnimeGamerTokenizer | None = None) -> str:
    """Pass-A text as the release gets it: slow ``LlamaTokenizer.decode(skip_special_tokens=False)``,
    which joins added / special tokens and runs of plain pieces with single spaces, then
    ``<frame>`` removed (``inference_MLLM.py``).
    """
    tok = tok or mllm_tokenizer.get_tokenizer()
    parts: list[str] = []
    run: list[int] = []
    special = (mllm_tokenizer.BOS_ID, mllm_tokenizer.EOS_ID, mllm_tokenizer.UNK_ID)
    for t in (int(i) for i in ids):
        if t >= mllm_tokenizer.BASE_VOCAB_SIZE or t in special:
            if run:
                parts.append(tok.sp.decode(run))
                run = []
            parts.append(tok.id_to_token(t))
        else:
            run.append(t)
    if run:
        parts.append(tok.sp.decode(run))
    return " ".join(parts).replace("<frame>", "")


def parse_release_states(text: str) -> tuple[int, int, int, int]:
    """The release parser: ``text.split(' ')``, ``int(part[10:-1])`` of parts 0, 3, 6, 9 as
    [ML, SC, ET, ST]; any exception gives ``(0, 0, 0, 0)`` (docs/token_layout.md#state-fields)."""
    try:
        parts = text.split(" ")
        return tuple(int(parts[i][10:-1]) for i in (0, 3, 6, 9))  # type: ignore[return-value]
    except Exception:  # noqa: BLE001 - the release catches everything
        return (0, 0, 0, 0)


def states_from_generated(tokens: np.ndarray,
                          tok: mllm_tokenizer.AnimeGamerTokenizer | None = None) -> np.ndarray:
    """int [B, max_new_tokens] free-decoded ids -> int32 [B, 4] states through the release's decode + parser."""
    return np.asarray([parse_release_states(release_text(trim_at_eos(row), tok)) for row in np.asarray(tokens)],
                      np.int32)


def release_step_noise(draws: np.ndarray, num_steps: int) -> np.ndarray:
    """The per-step SDE noise the release's ``VPSDEDPMPP2MSampler`` uses, from its draws in call order.

    The release draws once at step 0 (used), twice at steps 1..n-2 (the first, for a discarded
    first-order update, is unused; the second is used) and not at step n-1, which returns the
    denoised value: ``1 + 2 (n - 2)`` draws (97 for 50 steps).

    Args:
      draws: float [1 + 2 (n - 2), ...] every ``randn_like`` of one sampling run, in call order.
      num_steps: n.

    Returns:
      float32 [n, ...]: step i's noise (zeros at the last step, whose noise scale is 0), for
      ``samplers.sample(step_noise=...)``.

    Raises:
      ValueError: a draw count other than ``1 + 2 (n - 2)``.
    """
    draws = np.asarray(draws, np.float32)
    want = 1 + 2 * (num_steps - 2)
    if draws.shape[0] != want:
        raise ValueError(f"{num_steps} release steps draw {want} noise samples, got {draws.shape[0]}")
    idx = [0] + [2 * i for i in range(1, num_steps - 1)]
    return np.concatenate([draws[idx], np.zeros_like(draws[:1])], axis=0)


def release_uint8(frames: np.ndarray) -> np.ndarray:
    """float frames in [0, 1] -> uint8 by truncation, ``(255 * x).astype(uint8)`` as the release's
    ``save_video_as_grid_and_mp4`` (``media.to_uint8``, used for game outputs, rounds instead)."""
    return (255.0 * np.clip(np.asarray(frames, np.float32), 0.0, 1.0)).astype(np.uint8)
