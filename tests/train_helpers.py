"""Training set-ups the training tests share, each also run in the multi-process workers as source text:
the toy NNX model and its data (``TOY``) with a toy train config and a one-device mesh, and the tiny
config of each phase with fixed synthetic loader batches (``SETUP``)."""

import jax

import numpy as np

from animegamer_jax import parallel
from animegamer_jax.data import batches
from animegamer_jax.train import loop, model, phases
from configs import tiny

# Shared by this process and the subprocesses (8 fake devices, two jax.distributed processes).
TOY = r'''
import grain, jax, jax.numpy as jnp, numpy as np
from flax import nnx

class Toy(nnx.Module):
    """x [B, 8] -> frozen [8, 8] -> w1 [8, 16] (tanh) -> w2 [16, 4]; only w1/w2 train."""
    def __init__(self, rngs):
        init = nnx.initializers.normal(0.5)
        self.frozen = nnx.Param(nnx.with_partitioning(init, ("embed", None))(rngs.params(), (8, 8)))
        self.w1 = nnx.Param(nnx.with_partitioning(init, ("embed", "mlp"))(rngs.params(), (8, 16)))
        self.w2 = nnx.Param(nnx.with_partitioning(init, ("mlp", "embed"))(rngs.params(), (16, 4)))
    def __call__(self, x):
        return jnp.tanh((x @ self.frozen[...]) @ self.w1[...]) @ self.w2[...]

def toy_trainable(path, v):
    return isinstance(v, nnx.Param) and path[-1] in ("w1", "w2")

def toy_loss(model, batch, rng):
    # The noise term makes the loss depend on the per-step key (resume must reproduce it).
    y = model(batch["x"]) + 0.01 * jax.random.normal(rng, batch["y"].shape)
    mse = jnp.mean((y - batch["y"]) ** 2)
    return mse, {"mse": mse}

_rs = np.random.RandomState(0)
TOY_X = _rs.randn(64, 8).astype(np.float32)
TOY_Y = _rs.randn(64, 4).astype(np.float32)

def _example(i):
    return {"x": TOY_X[i], "y": TOY_Y[i]}

def toy_data(batch, seed=0, shard=0, num_shards=1):
    ds = grain.MapDataset.range(64).shuffle(seed=seed).repeat()
    ds = ds[shard::num_shards].map(_example).batch(batch)
    return iter(ds)
'''
exec(TOY)  # noqa: S102  (defines Toy, toy_trainable, toy_loss, toy_data, TOY_X, TOY_Y)


def train_cfg(**kw):
    """configs/tiny.py's train section at lr 1e-2, 2 warm-up steps, 40 steps, with ``kw`` set on it."""
    c = tiny.get_config().train
    c.learning_rate, c.warmup_steps, c.num_steps = 1e-2, 2, 40
    for k, v in kw.items():
        c[k] = v
    return c


def one_device_mesh():
    """A (1, 1, 1, 1) mesh on the first device."""
    return parallel.make_mesh((1, 1, 1, 1), devices=jax.devices()[:1])


# Shared with the two-process workers: the tiny config and fixed synthetic loader batches.
SETUP = r'''
import numpy as np
from configs import tiny

def phase_config(phase):
    cfg = tiny.get_config()
    cfg.train.phase = phase
    cfg.train.precomputed_features = True  # T5 / CLIP features in the batch: keeps compiles small
    cfg.train.encode_latents = False
    cfg.train.max_seq_len = 160
    cfg.train.learning_rate, cfg.train.warmup_steps = 3e-3, 1
    return cfg

def loader_example(cfg, phase, b=2, m=3, t_lat=2, seed=0):
    rs = np.random.RandomState(seed)
    lt, dt = cfg.t5.max_length, cfg.t5.d_model
    p, dv = cfg.rep.num_image_tokens, cfg.clip.vision_width
    lat = (t_lat, cfg.dit.in_channels, cfg.dit.sample_height, cfg.dit.sample_width)
    if phase in ("a1", "a2", "d"):
        return {"action": np.array(["sit", "run"][:b]), "motion_level": np.array([1, 4][:b]),
                "f_md": rs.randn(b, lt, dt).astype(np.float32), "f_v": rs.randn(b, p, dv).astype(np.float32),
                "latents": rs.randn(b, *lat).astype(np.float32)}
    states = np.array([[[2, 1, -1, 0], [3, 0, 2, -2], [5, -5, 1, 1]]] * b, np.int32)[:, :m]
    return {"num_turns": np.array([3, 2], np.int32)[:b], "states": states,
            "instruction": np.array([["Motion: sit.", "Motion: run.", "Motion: jump."][:m]] * b),
            "turn_f_md": rs.randn(b, m, lt, dt).astype(np.float32),
            "turn_f_v": rs.randn(b, m, p, dv).astype(np.float32),
            "latents": rs.randn(b, m, *lat).astype(np.float32)}
'''
exec(SETUP)  # noqa: S102  (defines phase_config, loader_example)


def phase_batch(cfg, phase):
    """The model batch ``data.batches.BatchBuilder`` makes of :func:`loader_example` for ``phase``."""
    return batches.BatchBuilder(cfg, phases.phase(phase).batch)(loader_example(cfg, phase))


def train_phase(cfg, batch, workdir, num_steps=2):
    """``num_steps`` steps of ``cfg``'s phase (``train.model.phase_trainer``, one device, fast CPU
    compiles) on the fixed ``batch`` of 2: ``(FitResult, the parameter paths whose values changed)``."""
    tr = model.phase_trainer(cfg, one_device_mesh(), compiler_options={"xla_backend_optimization_level": 0})
    res = loop.fit(tr, iter(lambda: batch, None), workdir=str(workdir), num_steps=num_steps, global_batch_size=2,
                   checkpoint_every=100, log_every=100, progress=False)

    def flat(state):
        return {"/".join(str(getattr(k, "key", k)) for k in p): np.asarray(v) for p, v in
                jax.tree_util.tree_flatten_with_path(state.to_pure_dict())[0]}

    final, init = flat(res.state[0]), flat(tr.init()[0])
    return res, {k for k in final if not np.array_equal(final[k], init[k])}
