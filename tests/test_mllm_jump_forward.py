"""Jump-forward decoding of the states (inference/mllm_turn.py ``_decode``): the state grammar's fixed
ids are fed with the chosen id in one forward, and the ids equal one-id-per-step constrained greedy
decoding (the padded step-by-step schedule and the model's own ``greedy_generate``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from animegamer_jax.tokenizers import mllm_tokenizer as tk
from animegamer_jax.inference import mllm_turn
from animegamer_jax.models.mistral import model as mistral

GRAMMAR = tk.AnimeGamerTokenizer.state_grammar()[:mllm_turn.STATE_TOKENS]


def test_jump_schedule_of_the_state_grammar():
    fixed = mllm_turn.jump_schedule(GRAMMAR)
    assert fixed.tolist() == [[tk.ML_END_ID, tk.SC_ID], [tk.SC_END_ID, tk.ET_ID], [tk.ET_END_ID, tk.ST_ID]]
    assert mllm_turn.jump_schedule(GRAMMAR[:1]).shape == (0, 0)
    with pytest.raises(ValueError, match="fixed ids"):
        mllm_turn.jump_schedule(GRAMMAR[:9])  # ends on a fixed id
    with pytest.raises(ValueError, match="fixed ids"):
        mllm_turn.jump_schedule(GRAMMAR[1:])  # starts with a fixed id


def _check(cfg: mistral.MistralConfig, lengths: tuple[int, ...], seed: int, own_loop: bool = True):
    llm = nnx.merge(*jax.jit(lambda: nnx.split(mistral.Mistral(cfg, rngs=nnx.Rngs(seed))))())
    b, n = len(lengths), max(lengths)
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, 32000, (b, n)).astype(np.int32)
    ids[np.arange(b), np.asarray(lengths) - 1] = tk.ML_ID
    x = llm.embed(jnp.asarray(ids))
    last = jnp.asarray(lengths, jnp.int32) - 1
    allowed = mllm_turn._allowed(GRAMMAR, cfg.vocab_size)

    def pick(t, logits, prev):
        return jnp.argmax(jnp.where(allowed[t], logits, -jnp.inf), axis=-1)

    run = jax.jit(lambda x, ids, last, jump: mllm_turn._greedy_pass_a(
        llm, x, ids, last, pick, mllm_turn.jump_schedule(GRAMMAR) if jump else np.zeros((9, 0), np.int32)),
        static_argnums=3)
    jump = np.asarray(run(x, jnp.asarray(ids), last, True))
    step = np.asarray(run(x, jnp.asarray(ids), last, False))
    np.testing.assert_array_equal(jump, step)
    for r, length in enumerate(lengths if own_loop else ()):  # the model's own host loop, unpadded
        ref, _ = mistral.greedy_generate(llm, 10, input_ids=jnp.asarray(ids[r:r + 1, :length]),
                                         allowed_fn=lambda t, _p: allowed[t][None])
        np.testing.assert_array_equal(jump[r], np.asarray(ref)[0])
    assert np.all(jump[:, [1, 2, 4, 5, 7, 8]] == mllm_turn.jump_schedule(GRAMMAR).reshape(-1))
    return jump


def test_jump_forward_ids_equal_step_by_step_tiny():
    cfg = mistral.MistralConfig(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                                head_dim=16, sliding_window=64, dtype="float32", param_dtype="float32")
    jump = _check(cfg, (7, 12, 10), seed=1)
    assert len({tuple(r[[0, 3, 6, 9]]) for r in jump}) > 1  # the rows decode different states


@pytest.mark.paper
def test_jump_forward_ids_equal_step_by_step_paper_width():
    """Paper width and head layout (D 4096, 32 query / 8 KV heads of 128), two layers (fp32: CPU bf16 dots
    are slow)."""
    cfg = mistral.MistralConfig(intermediate_size=1024, num_layers=2, dtype="float32", param_dtype="float32")
    _check(cfg, (9, 6), seed=2, own_loop=False)
