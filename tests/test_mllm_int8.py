"""Weight-only int8 of the MLLM's Mistral linear weights (``mllm.quantize = "int8"``,
models/mistral/mllm.py ``quantize_weights``): what it changes on the tiny system and at paper width."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from animegamer_jax.config import ConfigError, load_config, validate
from animegamer_jax.inference.mllm_turn import mllm_turn
from animegamer_jax.inference.mode import apply_mode
from animegamer_jax.inference.turn_inputs import WindowSpec, encode_instruction, stack_inputs
from animegamer_jax.models.mistral import model as mistral
from animegamer_jax.models.mistral.mllm import GameStateMLLM, quantize_weights

T = ["Character: Bunny; Motion: slowly walk out of the burrow; Background: day meadow.",
     "Character: Bunny; Motion: happily stretch in the sun; Background: day meadow.",
     "Character: Bunny; Motion: quickly chase a butterfly; Background: day forest."]


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_int8_tiny_states_unchanged_rep_close():
    cfg = load_config("configs/tiny.py")
    mllm = nnx.merge(*jax.jit(lambda: nnx.split(GameStateMLLM.from_config(cfg, rngs=nnx.Rngs(0))))())
    q = quantize_weights(mllm, "int8")
    assert q.llm.layers.q_proj.kernel[...].dtype == jnp.int8 and mllm.llm.layers.q_proj.kernel[...].dtype != jnp.int8
    assert q.llm.layers.down_proj.kernel_scale[...].shape == (cfg.mllm.num_layers, cfg.mllm.hidden_size)
    spec = WindowSpec(1, 24, 48, "query", "own")
    batch = {k: jnp.asarray(v) for k, v in stack_inputs([
        _first_input(spec, t) for t in T]).items()}
    s0, r0 = jax.jit(lambda b: mllm_turn(mllm, b, 1))(batch)
    s1, r1 = jax.jit(lambda b: mllm_turn(q, b, 1))(batch)
    np.testing.assert_array_equal(np.asarray(s1), np.asarray(s0))
    assert 0 < _rel(r1, r0) < 0.02, _rel(r1, r0)
    with pytest.raises(ValueError, match="int8"):
        quantize_weights(mllm, "int4")
    assert quantize_weights(mllm, "none") is mllm


def _first_input(spec, text):
    from animegamer_jax.game.run import GameRun
    return GameRun(spec, 8).next_input(encode_instruction(text, spec))


def test_quantize_config_key():
    """``mllm.quantize`` is a key of every config ("int8" at paper size, "none" in the tiny ones), set by an
    override, other values refused; reference mode plays bf16 whatever the config says."""
    for path, want in (("configs/tiny.py", "none"), ("configs/release_tiny.py", "none"),
                       ("configs/animegamer_2b_7b.py", "int8")):
        assert load_config(path).mllm.quantize == want
    paper = load_config("configs/animegamer_2b_7b.py")
    paper.game.mode = "reference"
    assert apply_mode(paper).mllm.quantize == "none"
    assert load_config("configs/animegamer_2b_7b.py", ["mllm.quantize=none"]).mllm.quantize == "none"
    cfg = load_config("configs/tiny.py", ["mllm.quantize=int8"])
    validate(cfg)
    assert cfg.mllm.quantize == "int8"
    cfg.mllm.quantize = "int4"
    with pytest.raises(ConfigError, match=r"mllm.quantize='int4'.*--config.mllm.quantize=none or =int8"):
        validate(cfg)


def test_quantize_override_on_older_checkpoint_config(tmp_path):
    """A checkpoint saved before the key existed: play's saved config gains ``mllm.quantize = "none"``,
    so ``--config.mllm.quantize=int8`` overrides it."""
    from animegamer_jax.config import apply_overrides, fill_added_keys
    cfg = load_config("configs/tiny.py")
    del cfg.mllm["quantize"]
    with pytest.raises(ConfigError, match="unknown config key"):
        apply_overrides(cfg.copy_and_resolve_references(), ["mllm.quantize=int8"])
    fill_added_keys(cfg)
    assert cfg.mllm.quantize == "none"
    assert apply_overrides(cfg, ["mllm.quantize=int8"]).mllm.quantize == "int8"


def test_reference_mode_stays_bf16():
    cfg = load_config("configs/tiny.py")
    cfg.mllm.quantize = "int8"
    cfg.game.mode = "reference"
    assert apply_mode(cfg).mllm.quantize == "none"


@pytest.mark.paper
def test_int8_paper_width_hidden_within_tolerance():
    """D 4096, 32/8 heads of 128, F 14336, two layers, bf16, random weights: the last hidden states
    (what pass B reads) within 3 % relative error."""
    cfg = mistral.MistralConfig(num_layers=2)
    llm = nnx.merge(*jax.jit(lambda: nnx.split(mistral.Mistral(cfg, rngs=nnx.Rngs(0))))())
    ids = jnp.asarray(np.random.default_rng(0).integers(3, 32000, (1, 32)), jnp.int32)
    h0 = jax.jit(lambda m, i: m(i, return_logits=False).hidden)(llm, ids)
    from animegamer_jax.models.layers import quantize_int8
    g, s = nnx.split(llm)
    q = nnx.merge(g, jax.tree.map(lambda a: a, s))
    quantize_int8(q.layers)
    h1 = jax.jit(lambda m, i: m(i, return_logits=False).hidden)(q, ids)
    err = _rel(h1, h0)
    print("paper-width int8 relative error", err)
    assert 0 < err < 0.03, err
