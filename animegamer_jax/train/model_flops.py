"""Model FLOPs of a train step, counted on the loss's jaxpr: the work the model needs, not what XLA compiles.

A train step's compiled FLOPs (:mod:`animegamer_jax.aot.hlo_cost`) include recomputation (remat), tile
padding and the forwards of frozen encoders that could run once in data preparation. Model FLOPs, as
maxtext reports them for MFU, count each matmul once. :func:`count` walks the jaxpr of
``loss(trainable, frozen, batch, rng)`` (no compile, nothing allocated) and labels every value by what it
depends on: **T** (a trainable parameter) and **R** (the step's random key: noise, timesteps, dropout).
For every ``dot_general`` / ``conv_general_dilated`` of forward FLOPs F (2 x output elements x
contracted size; a convolution's contracted size is its kernel's input features x window):

* neither operand T nor R: ``frozen`` (T5, CLIP, the VAE encode, a frozen MLLM's forward on the batch:
  the same every step, computable once in data preparation), forward only;
* otherwise ``forward`` F, and ``backward`` F for each operand that depends on a trainable parameter
  (its gradient is needed: an activation's to pass gradients back, a trained weight's to update it),
  when a gradient flows back from its output to the loss (none through ``stop_gradient``: a distillation
  target's forward has no backward).

``model = forward + backward`` is the numerator of MFU (docs/sharding.md). Loops: a ``scan`` counts its
body ``length`` times, step by step while the carry's labels grow (layer 1 of a scan takes data, layer 2
on activations that carry gradients), a ``while`` of unknown trip count once (``unknown_loops``), ``cond``
its largest branch; ``checkpoint`` (remat) once, so recomputation is
not model work. Attention is traced for a CPU device (its XLA form: Q K^T and P V as matmuls, whatever
the accelerator's kernel); a causal mask's skipped half is counted.
Elementwise ops, reductions and the optimizer update are not counted (maxtext's convention).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from animegamer_jax import parallel

_T, _R = 1, 2  # labels: depends on a trainable parameter / on the step's random key


@dataclasses.dataclass(frozen=True)
class ModelFlops:
    """FLOPs of one run of the traced function (all chips together): ``forward`` and ``backward`` of the
    step's model work, ``frozen`` forwards computable once per example, ``unknown_loops`` whiles counted
    once."""

    forward: float = 0.0
    backward: float = 0.0
    frozen: float = 0.0
    unknown_loops: int = 0

    @property
    def model(self) -> float:
        return self.forward + self.backward

    def __add__(self, o: ModelFlops) -> ModelFlops:
        return ModelFlops(self.forward + o.forward, self.backward + o.backward, self.frozen + o.frozen,
                          self.unknown_loops + o.unknown_loops)

    def scaled(self, k: float) -> ModelFlops:
        return ModelFlops(self.forward * k, self.backward * k, self.frozen * k, self.unknown_loops)


def _dot_flops(eqn) -> float:
    (lc, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval.shape
    return 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in lc)


def _conv_flops(eqn) -> float:
    rhs = eqn.invars[1].aval.shape
    out_feature_dim = eqn.params["dimension_numbers"].rhs_spec[0]
    return 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(rhs) / rhs[out_feature_dim]


def _jaxprs(params: dict) -> list:
    """(name, Jaxpr) of every jaxpr-valued parameter of an equation."""
    out = []
    for k, v in params.items():
        for j in (v if isinstance(v, (tuple, list)) else (v,)):
            inner = getattr(j, "jaxpr", j)
            if hasattr(inner, "eqns") and hasattr(inner, "invars"):
                out.append((k, inner))
    return out


class _Counter:
    def __init__(self):
        self.unknown: set[int] = set()

    def label(self, env: dict, v) -> int:
        return env.get(v, 0) if not hasattr(v, "val") else 0  # a Literal depends on nothing

    def run(self, jaxpr, in_labels: list[int], mult: float, count: bool = True,
            live_out: list[bool] | None = None) -> tuple[list[int], ModelFlops]:
        """(labels of ``jaxpr``'s outputs, FLOPs x ``mult``) for inputs labelled ``in_labels``; ``live_out``:
        which outputs a gradient flows back from (default all)."""
        env = dict(zip(jaxpr.invars, in_labels))
        total = ModelFlops()
        live = {v for v, keep in zip(jaxpr.outvars, live_out or [True] * len(jaxpr.outvars))
                if keep and not hasattr(v, "val")}
        for eqn in reversed(jaxpr.eqns):  # values a gradient reaches: not through stop_gradient
            if eqn.primitive.name != "stop_gradient" and any(v in live for v in eqn.outvars):
                live.update(v for v in eqn.invars if not hasattr(v, "val"))
        for eqn in jaxpr.eqns:
            outs_live = [v in live for v in eqn.outvars]
            some_live = any(outs_live)
            ins = [self.label(env, v) for v in eqn.invars]
            union = 0
            for lab in ins:
                union |= lab
            name = eqn.primitive.name
            outs = [union] * len(eqn.outvars)
            if name in ("dot_general", "conv_general_dilated"):
                f = mult * (_dot_flops(eqn) if name == "dot_general" else _conv_flops(eqn))
                if count:
                    if union == 0:
                        total += ModelFlops(frozen=f)
                    else:  # a gradient per trained-dependent operand, if one flows back from the output
                        grads = sum(bool(lab & _T) for lab in ins[:2]) if some_live else 0
                        total += ModelFlops(forward=f, backward=f * grads)
            elif name == "scan":
                outs, sub = self._scan(eqn, ins, mult, count, some_live)
                total += sub
            elif name == "while":
                outs, sub = self._while(eqn, ins, mult, count, some_live)
                total += sub
            elif name == "cond":
                best, outs = None, [0] * len(eqn.outvars)
                for br in eqn.params["branches"]:
                    o, sub = self.run(br.jaxpr, ins[1:], mult, count, [some_live] * len(br.jaxpr.outvars))
                    outs = [a | b for a, b in zip(outs, o)]
                    best = sub if best is None or sub.model + sub.frozen > best.model + best.frozen else best
                total += best or ModelFlops()
            else:
                subs = _jaxprs(eqn.params)
                k = mult
                mesh = eqn.params.get("mesh")
                if name == "shard_map" and mesh is not None:  # the body sees one shard's shapes
                    k = mult * math.prod(getattr(mesh, "shape", {}).values() or [1])
                for _, sub_jaxpr in subs[:1]:  # pjit / checkpoint / custom_jvp / custom_vjp: the primal body
                    sub_in = ins if len(sub_jaxpr.invars) == len(ins) else [union] * len(sub_jaxpr.invars)
                    sub_live = outs_live if len(sub_jaxpr.outvars) == len(outs_live) else \
                        [some_live] * len(sub_jaxpr.outvars)
                    o, sub = self.run(sub_jaxpr, sub_in, k, count, sub_live)
                    total += sub
                    if len(o) == len(eqn.outvars):
                        outs = o
            for v, lab in zip(eqn.outvars, outs):
                env[v] = lab
        return [self.label(env, v) for v in jaxpr.outvars], total

    def _scan(self, eqn, ins, mult, count, live):
        p = eqn.params
        body, nc, ncarry = p["jaxpr"].jaxpr, p["num_consts"], p["num_carry"]
        consts, carry, xs = ins[:nc], list(ins[nc:nc + ncarry]), ins[nc + ncarry:]
        total, length, ys = ModelFlops(), int(p["length"]), [0] * (len(body.outvars) - ncarry)
        while length > 0:  # step by step while the carry's labels grow (at most len(carry) + 1 steps)
            out, sub = self.run(body, consts + carry + xs, mult, count, [live] * len(body.outvars))
            new = [a | b for a, b in zip(carry, out[:ncarry])]
            ys = [a | b for a, b in zip(ys, out[ncarry:])]
            if new == carry:  # a fixed point: the remaining steps all see these labels
                total += sub.scaled(length)
                break
            total, carry, length = total + sub, new, length - 1
        return carry + ys, total

    def _while(self, eqn, ins, mult, count, live):
        p = eqn.params
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        bconsts, carry = ins[cn:cn + bn], list(ins[cn + bn:])
        body = p["body_jaxpr"].jaxpr
        for _ in range(len(carry) + 1):
            out, _ = self.run(body, bconsts + carry, 1.0, count=False)
            new = [a | b for a, b in zip(carry, out)]
            if new == carry:
                break
            carry = new
        _, sub = self.run(body, bconsts + carry, mult, count, [live] * len(body.outvars))
        if count:  # once per while equation, however often a scan's steps or branches reach it
            self.unknown.add(id(eqn))
        return carry, sub


def count(fn: Any, trainable: Any, frozen: Any, *args: Any, rng: Any = None) -> ModelFlops:
    """Model FLOPs of ``fn(trainable, frozen, *args, rng)`` (module docstring): leaves of ``trainable`` are
    labelled T, ``rng`` R, the rest nothing. Arguments may be ``jax.ShapeDtypeStruct`` trees; nothing runs."""
    closed = jax.make_jaxpr(fn)(trainable, frozen, *args, rng)
    n_t = len(jax.tree.leaves(trainable))
    n_rest = len(jax.tree.leaves((frozen, *args)))
    n_rng = len(closed.jaxpr.invars) - n_t - n_rest
    labels = [_T] * n_t + [0] * n_rest + [_R] * n_rng
    c = _Counter()
    _, total = c.run(closed.jaxpr, labels, 1.0)
    return dataclasses.replace(total, unknown_loops=len(c.unknown))


def train_flops(model_fn: Any, loss_fn: Any, trainable_filter: Any, batch: dict) -> ModelFlops:
    """Model FLOPs of one micro-step's loss (forward + backward; all chips together) of a phase:
    ``model_fn()`` builds its model (only its shapes are made: ``nnx.eval_shape``), ``loss_fn(model, batch,
    rng)`` as ``train.loop.Trainer`` takes it, ``trainable_filter`` its trained variables, ``batch`` a dict
    of ``jax.ShapeDtypeStruct`` (``aot.programs.abstract_batch``)."""
    abstract = nnx.eval_shape(model_fn)
    graphdef, trained, rest = nnx.split(abstract, trainable_filter, ...)

    def strip(tree):  # plain shapes: the count needs no sharding and no mesh
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)

    def loss(t, r, b, key):
        return loss_fn(nnx.merge(graphdef, t, r), b, key)[0]

    # traced for one host CPU device: attention resolves to its XLA form (matmuls in the jaxpr), not a
    # TPU / GPU kernel whose FLOPs a jaxpr does not show (train.loop calls this on the accelerator's host)
    cpu = Mesh(np.array(jax.devices("cpu")[:1]).reshape((1,) * len(parallel.MESH_AXES)), parallel.MESH_AXES)
    with parallel.sharding_context(cpu, parallel.DEFAULT_RULES):
        return count(loss, strip(trained), strip(rest), strip(batch), rng=jax.random.key(0))


__all__ = ["ModelFlops", "count", "train_flops"]
