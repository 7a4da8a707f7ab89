"""Model FLOPs (train/model_flops.py), collectives read from compiled HLO (aot/hlo_cost.py) and their price
on a target's links (aot/report.py): hand-counted functions, the three replica-group forms, a sharded
program compiled on 8 CPU devices and for a v5p slice with the real TPU compiler (deviceless)."""

import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from animegamer_jax.aot import hlo_cost, programs, report
from animegamer_jax.config import load_config
from animegamer_jax.parallel import target
from animegamer_jax.train import model, model_flops, phases
from tests.subproc import run_python
from tests.tpu import fsdp_step_hlo, tpu_devices

B, D = 8, 16
F = 2.0 * B * D * D  # one [B, D] x [D, D] matmul


def _s(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def test_frozen_trained_and_passing_gradients_counted_apart():
    def f(trained, frozen, x, key):
        h = x @ frozen["w1"]  # data x frozen weight: computable once per example
        y = h @ trained["w"]  # trained weight: forward + its gradient
        z = (y + jax.random.normal(key, y.shape)) @ frozen["w2"]  # passes y's gradient back
        return jnp.sum(z)

    got = model_flops.count(f, {"w": _s(D, D)}, {"w1": _s(D, D), "w2": _s(D, D)}, _s(B, D), rng=jax.random.key(0))
    assert (got.frozen, got.forward, got.backward, got.model) == (F, 2 * F, 2 * F, 4 * F)


def test_no_backward_through_stop_gradient():
    def f(trained, frozen, x, key):  # a distillation target: the trained model's forward, no gradient
        target = jax.lax.stop_gradient(x @ trained["w"])
        return jnp.sum((x @ trained["w"] - target) ** 2)

    got = model_flops.count(f, {"w": _s(D, D)}, {}, _s(B, D), rng=jax.random.key(0))
    assert (got.forward, got.backward, got.frozen) == (2 * F, F, 0.0)


def test_noise_makes_a_frozen_matmul_step_work():
    def f(trained, frozen, x, key):  # the DiT's input projection: noised latents x a frozen weight
        return jnp.sum(((x + jax.random.normal(key, x.shape)) @ frozen["w"]) * trained["s"])

    got = model_flops.count(f, {"s": _s(D)}, {"w": _s(D, D)}, _s(B, D), rng=jax.random.key(0))
    assert (got.frozen, got.forward, got.backward) == (0.0, F, 0.0)


@pytest.mark.parametrize("remat", [False, True])
def test_scanned_layers_count_length_times_and_remat_once(remat):
    layers = 5

    def f(trained, frozen, x, key):
        def body(h, w):
            return jnp.tanh(h @ w), None

        h, _ = jax.lax.scan(jax.checkpoint(body) if remat else body, x, trained["w"])
        return jnp.sum(h)

    got = model_flops.count(f, {"w": _s(layers, D, D)}, {}, _s(B, D), rng=jax.random.key(0))
    # layer 1 takes data (only its weight's gradient); layers 2..5 take activations that carry gradients
    assert got.forward == layers * F
    assert got.backward == F + 2 * (layers - 1) * F
    assert got.frozen == 0.0


def test_a_trained_weight_late_in_a_scan_taints_the_carry_by_fixed_point():
    def f(trained, frozen, x, key):  # the carry only depends on the trained scale from step 2 on
        def body(c, w):
            return (c @ w) * trained["s"], None

        h, _ = jax.lax.scan(body, x, frozen["w"])
        return jnp.sum(h)

    got = model_flops.count(f, {"s": _s(D)}, {"w": _s(3, D, D)}, _s(B, D), rng=jax.random.key(0))
    # step 1's matmul takes data and a frozen weight (computable once); steps 2 and 3 take the scaled carry
    assert got.frozen == F and got.forward == 2 * F and got.backward == 2 * F


@pytest.mark.slow
def test_tiny_phase_counts_follow_the_trained_set_and_the_features():
    cfg = load_config("configs/tiny.py", ["train.global_batch_size=2"])
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))

    def count(phase, **over):
        c = programs._with_phase(cfg, phase)
        for k, v in over.items():
            c.train[k] = v
        batch = programs.abstract_batch(c, phase, 2, mesh, ())
        return model_flops.train_flops(model.phase_model(c), phases.phase(phase).step_loss(c), model.phase_filter(c),
                                       batch)

    full, paper = count("a2", dit_trainable="all"), count("a2", dit_trainable="paper")
    assert full.forward == paper.forward > 0 and full.frozen == paper.frozen > 0
    assert full.backward > paper.backward > 0  # every DiT weight's gradient vs LoRA's, adaLN's and flow's
    pre = count("a2", dit_trainable="all", precomputed_features=True, encode_latents=False)
    assert pre.forward == full.forward and pre.backward == full.backward
    assert pre.frozen == 0.0  # T5, CLIP and the VAE encode left the step: nothing frozen remains
    assert full.unknown_loops == 0


MESH_AXES = "replica_groups=mesh['axis_0'=4,'axis_1'=1,'axis_2'=2] {'axis_0'}, dimensions={0}"


@pytest.mark.parametrize("attrs,groups", [
    ("replica_groups={{0,1},{2,3}}", ((0, 1), (2, 3))),
    ("replica_groups=[2,2]<=[4]", ((0, 1), (2, 3))),
    ("replica_groups=[2,2]<=[2,2]T(1,0)", ((0, 2), (1, 3))),
    ("replica_groups={}", ((0, 1, 2, 3),)),
    (MESH_AXES, ((0, 2, 4, 6), (1, 3, 5, 7))),
    # a minor mesh axis: the devices at each mesh position given as an iota, transposed
    ("replica_groups=mesh['axis_0'=1,'axis_1'=4,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_1'}",
     ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("source_target_pairs={{0,1},{1,0}}", ((0, 1), (1, 0))),
])
def test_replica_group_forms(attrs, groups):
    ins = hlo_cost._Instr("ag", "f32[8]", "all-gather", "", [], ", " + attrs)
    assert hlo_cost._groups(ins, 4) == groups


@pytest.mark.slow
def test_collectives_of_a_scanned_fsdp_step_on_cpu():
    out = run_python("""
        import json, jax
        from animegamer_jax.aot import hlo_cost
        from tests.tpu import fsdp_step_hlo
        text, mesh = fsdp_step_hlo(jax.devices()[:8])
        cols, loops = hlo_cost.collectives(text)
        print(json.dumps({"cols": [[c.op, c.payload, sorted(map(sorted, c.groups)), c.runs, c.loop] for c in cols],
                          "trips": {k: v[0] for k, v in loops.items()}}))
    """)
    got = json.loads(out.strip().splitlines()[-1])
    gathers = [c for c in got["cols"] if c[0] == "all-gather"]
    assert gathers, got
    for op, payload, groups, runs, loop in gathers:  # each layer's weight gathered over the 4 data shards
        assert payload == 256 * 256 * 4 and groups == [[0, 2, 4, 6], [1, 3, 5, 7]] and runs == 3
        assert got["trips"][loop] == 3


def _chip(**links):
    return target.Chip("x", ("x",), 1e12, 1e15, 1e12, "test", **links)


def test_price_hides_a_loop_bodys_collectives_behind_its_compute():
    gather = hlo_cost.Collective("all-gather", 4e9, ((0, 1, 2, 3),), runs=10, loop="w", loop_runs=10)
    devs = [types.SimpleNamespace(platform="gpu", process_index=0)] * 4
    chip = _chip(fast_bytes_per_s=1e12, fast_ports=0, network_bytes_per_s=1e10)
    one = 4e9 * 0.75 / 0.5e12  # (n-1)/n of the result at half the NVLink figure
    # a body of 1 PFLOP at 1 PFLOP/s (1 s) hides its 6 ms gather; a body of 1 GFLOP does not
    _, total, exposed = report.price_collectives([gather], {"w": (10, 1e15, 0.0)}, chip, devs)
    assert total == pytest.approx(10 * one) and exposed == 0.0
    _, _, exposed = report.price_collectives([gather], {"w": (10, 1e9, 0.0)}, chip, devs)
    assert exposed == pytest.approx(10 * (one - 1e-6))
    top = hlo_cost.Collective("all-reduce", 1e9, ((0, 1, 2, 3),), runs=1)
    summary, total, exposed = report.price_collectives([top], {}, chip, devs)
    assert exposed == total == pytest.approx(2 * 0.75 * 1e9 / 0.5e12)
    assert summary == {"all-reduce": [1, 1e9, total]}
    # across nodes: the network figure
    nodes = [types.SimpleNamespace(platform="gpu", process_index=i // 2) for i in range(4)]
    _, total, _ = report.price_collectives([top], {}, chip, nodes)
    assert total == pytest.approx(2 * 0.75 * 1e9 / 1e10)
    # no link figures: not priced
    assert report.price_collectives([top], {}, _chip(), devs)[1:] == (None, None)


def test_tpu_ring_bandwidth_grows_with_the_torus_axes_spanned():
    chip = target.chip_named("v5p")
    devs = [types.SimpleNamespace(platform="tpu", coords=(x, y, 0), slice_index=0) for y in range(2) for x in range(2)]
    per_axis = 1200e9 / 6
    assert report.link_bandwidth((0, 1), chip, devs) == pytest.approx(per_axis)
    assert report.link_bandwidth((0, 1, 2, 3), chip, devs) == pytest.approx(2 * per_axis)


@pytest.mark.slow
def test_v5p_slice_prices_its_fsdp_gathers():
    devs = tpu_devices("v5p-16")  # 8 chips, 2x2x2
    text, mesh = fsdp_step_hlo(devs, layers=4)
    cols, loops = hlo_cost.collectives(text)
    assert any(c.op == "all-gather" and c.group_size == 4 and c.loop for c in cols), cols
    summary, total, exposed = report.price_collectives(cols, loops, target.chip_named("v5p"), list(mesh.devices.flat))
    assert total > 0 and 0.0 <= exposed <= total
    assert summary["all-gather"][0] >= 4  # at least one gather a layer


def _auto_config():
    from tests.tpu import FSDP

    return load_config("configs/tiny.py", FSDP + ["train.precomputed_features=True", "train.encode_latents=False",
                                                  "train.remat=auto"])


def test_remat_auto_keeps_the_fastest_policy_that_fits():
    from animegamer_jax.train.model import AUTO_REMAT, training_config

    cfg = _auto_config()
    with pytest.raises(ValueError, match="animegamer-aot"):  # the train command is told where auto is chosen
        training_config(cfg)
    chip = target.chip_named("v5p")
    # as on v5p-64 (docs/results.md): none over 80 % of HBM, save_dots fits but slower than full
    figures = {"none": (0.97, 0.74), "save_dots": (0.37, 0.68), "full": (0.06, 0.52)}
    seen = []

    def fake_compile(prog, chip_, save):
        policy = prog.note.split("remat ")[1].split(";")[0]
        seen.append(policy)
        hbm, secs = figures[policy]
        return report.Row(prog.name, "train", prog.note, hbm_fraction=hbm, roofline_s=secs)

    lines = []
    row = report.compile_auto_remat(cfg, "a2", jax.devices()[:1], chip, say=lines.append, compile_fn=fake_compile)
    assert seen == list(AUTO_REMAT) and len(lines) == 3
    assert row.roofline_s == 0.52 and "remat auto -> full (none: 97 % of HBM, 0.740 s; save_dots: 37 %" in row.note
    figures["full"] = (0.06, 0.70)  # now save_dots is the fastest that fits
    assert "remat auto -> save_dots" in report.compile_auto_remat(cfg, "a2", jax.devices()[:1], chip, say=lines.append,
                                                                  compile_fn=fake_compile).note
    figures.update(none=(0.9, 0.1), save_dots=(0.9, 0.1), full=(0.9, 0.1))  # nothing fits: full remat
    assert "remat auto -> full" in report.compile_auto_remat(cfg, "a2", jax.devices()[:1], chip, say=lines.append,
                                                             compile_fn=fake_compile).note


@pytest.mark.paper
def test_remat_auto_compiles_each_policy_for_a_tpu():
    lines = []  # the tiny a2 step on a v5e-4 slice: every policy fits, the fastest kept
    row = report.compile_auto_remat(_auto_config(), "a2", tpu_devices("v5e-4"), target.chip_named("v5e"),
                                    say=lines.append)
    assert row.status == "ok" and row.fits and len(lines) == 3 and "remat auto -> " in row.note
