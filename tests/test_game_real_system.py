"""The engine on the real networks (random tiny init, saved and loaded through save_system / load_system).

Run in child processes with ``JAX_THREEFRY_PARTITIONABLE=0`` (what the game commands set, see
inference/layout.py ``setup_jax``): with it on, every program that draws random numbers (the jitted init,
the sampler) compiles threefry much more slowly on a CPU.
"""

import pytest

from tests.subproc import run_python

pytestmark = pytest.mark.slow  # its tests (or the fixtures they share) take over ~10 s each on a loaded 2-core host

ENV = {"JAX_THREEFRY_PARTITIONABLE": "0"}

PRELUDE = """
import json, os, sys, tempfile
import numpy as np, jax, jax.numpy as jnp
from animegamer_jax.config import load_config
from animegamer_jax.inference.instructions import Game, parse_instruction
from animegamer_jax.inference.mode import apply_mode
from animegamer_jax.game.engine import GameEngine
from animegamer_jax.game import loading
T = ["Character: Bunny; Motion: slowly walk out of the burrow; Background: day meadow.",
     "Character: Bunny; Motion: happily stretch in the sun; Background: day meadow.",
     "Character: Bunny; Motion: quickly chase a butterfly; Background: day forest."]
def game(gid, seed, n=3):
    return Game(gid, tuple(parse_instruction(t) for t in T[:n]), seed)
"""


def test_mllm_turn_on_padded_batch_equals_model_passes():
    """Pass A (KV-cache constrained greedy) and pass B (hybrid mask, query / last read-out) of the
    padded jitted turn equal GameStateMLLM's own unpadded predict_states / forward."""
    out = run_python(PRELUDE + """
from flax import nnx
from animegamer_jax.inference.mllm_turn import mllm_turn
from animegamer_jax.game.run import GameRun
from animegamer_jax.inference.turn_inputs import WindowSpec, encode_instruction, stack_inputs
from animegamer_jax.models.mistral.mllm import GameStateMLLM
cfg = load_config("configs/tiny.py")
mllm = nnx.merge(*jax.jit(lambda: nnx.split(GameStateMLLM.from_config(cfg, rngs=nnx.Rngs(0))))())
# the padded, jitted MLLM turn equals the model's own unpadded passes
turn_fn = jax.jit(lambda b: mllm_turn(mllm, b, 3))
spec_q, spec_l = WindowSpec(3, 24, 48, "query", "own"), WindowSpec(3, 24, 48, "last", "own")
run = GameRun(spec_q, cfg.rep.dim)
rng = np.random.default_rng(0)
for k, text in enumerate(T):
    readout = "last" if k == 1 else "query"
    run.spec = spec_l if readout == "last" else spec_q
    ids = encode_instruction(text, spec_q)
    inp = run.next_input(ids)
    batch = {kk: jnp.asarray(v) for kk, v in stack_inputs([inp]).items()}
    states, rep = turn_fn(batch)
    n = inp.length
    nh = int(inp.hist_valid.sum())
    hist = jnp.asarray(inp.hist_reps[None, :max(nh, 1)]) if nh else None
    cmp = jnp.asarray(inp.cmp_mask[None, :n]) if nh else None
    if k != 1:
        ref_states, _ = mllm.predict_states(jnp.asarray(inp.ids[None, :n]), cmp_mask=cmp, history_reps=hist)
        assert tuple(np.asarray(states)[0]) == tuple(ref_states[0]), (states, ref_states)
    ref = nnx.jit(lambda m, i, g, c, h: m(i, gen_mask=g, cmp_mask=c, history_reps=h, readout=readout,
                                          return_logits=False).rep)(
        mllm, jnp.asarray(inp.ids[None, :n]), jnp.asarray(inp.gen_mask[None, :n]), cmp, hist)
    err = float(jnp.abs(ref - rep).max())
    assert err < 1e-4, (readout, k, err)
    run.finish_turn(ids, tuple(int(v) for v in np.asarray(states)[0]),
                    np.asarray(rep)[0] + rng.normal(size=rep.shape[1:]))
print("ADAPTER_OK")
""", devices=1, env=ENV, timeout=900)
    assert "ADAPTER_OK" in out


@pytest.mark.slow
def test_real_system_from_checkpoint_seeds_and_compile_once():
    out = run_python(PRELUDE + """
from flax import nnx
from animegamer_jax.checkpoint import save_system
cfg = load_config("configs/tiny.py")
ckpt = os.path.join(tempfile.mkdtemp(), "sys")
# random tiny modules (all four components), saved through save_system
from animegamer_jax.models.mistral.mllm import GameStateMLLM
from animegamer_jax.models.shot_encoder.model import ShotEncoder
from animegamer_jax.models.cogvideox.vae import CogVideoXVAE
from animegamer_jax.models.registry import COMPONENT_BUILDERS  # the one builder registry
@jax.jit
def init():
    m = {"mllm": GameStateMLLM.from_config(cfg, rngs=nnx.Rngs(0)),
         "dit": COMPONENT_BUILDERS["dit"](cfg, nnx.Rngs(1)),
         "shot_encoder": ShotEncoder.from_config(cfg, rngs=nnx.Rngs(2)),
         "vae": CogVideoXVAE.from_config(cfg.vae, rngs=nnx.Rngs(3))}
    return {k: nnx.split(v) for k, v in m.items()}
comps = {k: nnx.merge(g, s) for k, (g, s) in init().items()}
partial = os.path.join(tempfile.mkdtemp(), "no_vae")
save_system(partial, {k: v for k, v in comps.items() if k != "vae"}, cfg)
try:
    loading.load_game_system(partial, cfg)
    raise SystemExit("expected a missing-component error")
except loading.CheckpointError as e:
    assert "lacks component(s) ['vae']" in str(e), e
    print("MISSING_OK")
save_system(ckpt, comps, cfg)
sysm = loading.load_game_system(ckpt, cfg)
assert sysm.label == f"checkpoint {ckpt}", sysm.label
eng = GameEngine(cfg, sysm)
a = eng.play([game("a", 1)])[0]
sizes = eng.cache_sizes()
b = eng.play([game("b", 1)])[0]
c = eng.play([game("c", 2)])[0]
assert sizes == eng.cache_sizes() == {"mllm": 1, "sampling": 1, "vae": 1}, eng.cache_sizes()
assert all(v == 1 for v in eng.compiles.values()), eng.compiles
for ta, tb, tc in zip(a["turns"], b["turns"], c["turns"]):
    np.testing.assert_array_equal(ta.frames, tb.frames)
    assert ta.states == tb.states
    assert np.abs(ta.frames - tc.frames).max() > 1e-3
assert a["turns"][0].frames.shape == (17, 64, 96, 3)
print("SEEDS_OK")


""", devices=1, env=ENV, timeout=900)
    assert "MISSING_OK" in out and "SEEDS_OK" in out


@pytest.mark.slow
def test_real_batch_of_4_on_8_devices_equals_one_by_one():
    out = run_python(PRELUDE + """
from animegamer_jax import parallel
cfg = load_config("configs/tiny.py", ["diffusion.num_sampling_steps=4"])
sysm = loading.build_random_system(cfg, seed=0)
games = [game(f"g{i}", 20 + i, n=1 + i % 2) for i in range(4)]
big = GameEngine(cfg, sysm)
assert big.batch_size == 8
batched = big.play(games)
one = GameEngine(cfg, sysm, mesh=parallel.mesh_from_config(cfg, devices=jax.devices()[:1]))
worst = 0.0
for g, rb in zip(games, batched):
    r1 = one.play([g])[0]
    for x, y in zip(r1["turns"], rb["turns"]):
        assert x.states == y.states, (x.states, y.states)
        worst = max(worst, float(np.abs(x.frames - y.frames).max()))
print("WORST", worst)
""", devices=8, env=ENV, timeout=900)
    assert float(out.split("WORST")[1]) < 1e-4
