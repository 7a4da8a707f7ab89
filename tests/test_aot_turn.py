"""Play's turn stages compile for a TPU slice in both layouts (real TPU compiler, deviceless), and the
``animegamer-aot`` command prints its table and writes its JSON."""

import json
import os

import jax
import pytest

from animegamer_jax.aot import pieces, programs, report
from animegamer_jax.parallel import target
from animegamer_jax.commands.aot import main
from tests.tpu import compile_tiny


@pytest.mark.parametrize("layout", ["latency", "batch"])
@pytest.mark.slow
def test_turn_stages_compile_on_tpu(layout):
    rows = {p: compile_tiny(p, [], layout) for p in ("prefill", "decode", "pass_b", "dit")}
    for name, row in rows.items():
        assert row.status == "ok", (name, row.status)
        assert row.peak > 0 and row.hbm_fraction < 0.01 and row.roofline_s > 0
    # jump-forward pass A: the ten state ids in prefill + 3 steps of 3 tokens (the chosen id + 2 fixed)
    assert pieces.decode_schedule() == (3, 3) and rows["decode"].runs == 3
    if layout == "latency":  # one game on all 4 chips: CFG halves on data, the sequence on context
        assert "1 game(s), mesh {'data': 2, 'fsdp': 1, 'tensor': 1, 'context': 2}" in rows["dit"].note
    else:  # tiny.py's mesh: 4-way data parallel, one game per chip
        assert "4 game(s), mesh {'data': 4," in rows["dit"].note
    kernels = {n: {k.split(" (")[0] for k in r.kernels} for n, r in rows.items()}
    # pass B and the DiT take the real splash kernel (pass B failed to compile unpartitioned); the KV-cache
    # calls have explicit positions, which splash cannot take
    assert kernels["dit"] == {"splash"} and kernels["pass_b"] == {"splash"}
    assert kernels["prefill"] == kernels["decode"] == {"blockwise"}
    assert all("KV-cache" in k for k in rows["prefill"].kernels)


@pytest.mark.slow
def test_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "aot.json"
    rc = main(["--topology=v5e-4", "--config=configs/tiny.py", "--program=pass_b,dit", f"--json={out}",
               f"--save={tmp_path / 'exe'}"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "| dit [latency] |" in text and "| pass_b [latency] |" in text and "assumptions:" in text
    assert "v5e: HBM 16.0 GiB, 197 TFLOP/s" in text and "splash (TPU, mask expressible for splash)" in text
    doc = json.loads(out.read_text())
    assert doc["topology"] == "v5e-4" and doc["num_devices"] == 4 and doc["device_kind"] == "TPU v5 lite"
    assert doc["chip"]["name"] == "v5e" and doc["commit"] != "unknown" and doc["layouts"] == ["latency"]
    progs = {p["program"]: p for p in doc["programs"]}
    assert set(progs) == {"pass_b", "dit"} and all(p["status"] == "ok" and p["fits"] for p in progs.values())
    assert progs["dit"]["roofline_s"] > 0 and progs["dit"]["flops"] > 0
    # not every stage of the turn was compiled
    assert doc["turn_roofline_s"] == {"latency": None} and doc["turn_resident_bytes"] == {"latency": None}
    saved = progs["dit"]["saved"]
    assert os.path.getsize(saved) > 0, saved  # the serialized TPU executable (maxtext's compiled_trainstep_file)


@pytest.mark.parametrize("args,message", [
    (["--program=dit"], "--topology is required"),
    (["--topology=tpu9000"], "unknown topology 'tpu9000'"),
    (["--topology=v5e-4", "--program=dit,fly"], "unknown --program 'fly'"),
    (["--topology=v6e-3"], "no v6e slice of 3 chips"),
])
def test_cli_bad_input_is_one_line(args, message, capsys):
    assert main(args + ["--config=configs/tiny.py"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_turn_estimate_sums_every_stage_times_its_runs():
    rows = [report.Row(n, "turn", "", roofline_s=t, runs=r, layout="latency") for n, t, r in
            (("prefill", 0.1, 1), ("decode", 0.01, 20), ("pass_b", 0.1, 1), ("dit", 1.0, 1), ("vae_decode", 0.3, 1))]
    assert report.turn_estimate(rows) == pytest.approx(0.1 + 0.2 + 0.1 + 1.0 + 0.3)
    for r, (args, tmp) in zip(rows, ((14, 2), (15, 0.5), (14, 1), (4, 1), (0.5, 9))):
        r.arguments, r.temporaries = args, tmp
    assert report.turn_resident(rows) == 15 + 4 + 0.5 + 9  # all weights at once + the largest stage's temps
    assert report.turn_estimate(rows[:-1]) is None and report.turn_estimate(rows, "batch") is None
    # time to first frame: the VAE's first chunk priced as the one-program decode x its share of latent frames
    rows[-1].first_chunk = (2, 5)
    secs, label = report.turn_ttff(rows)
    assert secs == pytest.approx(0.1 + 0.2 + 0.1 + 1.0 + 0.3 * 2 / 5) and "x 2/5 latent frames" in label
    rows[-1].first_chunk = (5, 5)
    assert report.turn_ttff(rows)[0] == pytest.approx(report.turn_estimate(rows))
    assert report.turn_ttff(rows[:-1]) is None
    rows[2].status = "FAILED x"
    assert report.turn_estimate(rows) is None


def test_latency_layout_weights_sharded_or_replicated():
    from animegamer_jax.config import load_config
    from animegamer_jax.inference.layout import apply_layout

    cfg = load_config("configs/animegamer_2b_7b.py", [])
    rules = dict(apply_layout(cfg, "latency", 8).sharding_rules)
    assert rules["embed"] == ("data", "fsdp", "context") and rules["act_width"] == "data"
    cfg.game.latency_weights = "replicated"
    lat = apply_layout(cfg, "latency", 8)
    assert dict(lat.sharding_rules)["embed"] is None and tuple(lat.mesh.shape) == (2, 1, 1, 4)
    cfg.game.latency_weights = "halved"
    with pytest.raises(ValueError, match="latency_weights"):
        apply_layout(cfg, "latency", 8)


@pytest.mark.slow
def test_batch_layout_splits_games_over_chips():
    """generate's layout: 4 games on 4 chips run one game per chip, also through the splash kernel's
    shard_map inside the per-game vmap (parallel.vmap_over_batch), so each chip does about 4x the
    latency layout's share of one game (one game over 4 chips), not 16x."""
    batch, latency = compile_tiny("dit", [], "batch"), compile_tiny("dit", [], "latency")
    assert batch.status == latency.status == "ok"
    assert batch.flops == pytest.approx(4 * latency.flops, rel=0.1), (batch.flops, latency.flops)


@pytest.mark.slow
def test_student_dit_sampling_compiles_without_a_cfg_batch():
    """``--config.diffusion.sampler=student``: the dit program is the student's N steps, one game per
    call, and the latency layout puts all 4 chips on the sequence (no CFG halves on data); its loop
    runs N DiT calls (8 steps cost twice 4), well under the teacher's 8 steps x CFG 2 (tiny)."""
    student = compile_tiny("dit", ["diffusion.sampler=student", "diffusion.num_sampling_steps=4"])
    student8 = compile_tiny("dit", ["diffusion.sampler=student", "diffusion.num_sampling_steps=8"])
    teacher = compile_tiny("dit", [])
    assert student.status == student8.status == teacher.status == "ok", (student.status, teacher.status)
    assert student.note.startswith("latency layout, 1 game(s), mesh {'data': 1, 'fsdp': 1, 'tensor': 1, "
                                   "'context': 4}; 4 steps, no CFG batch (student), 1 game(s)"), student.note
    assert "8 steps x CFG batch 2, 1 game(s)" in teacher.note
    assert {k.split(" (")[0] for k in student.kernels} == {"splash"}
    assert student8.flops == pytest.approx(2 * student.flops, rel=0.02), (student8.flops, student.flops)
    # per chip, model FLOPs: the teacher's 16 calls over 2 (data) x 2 (context) chips against the student's 4
    # calls over 4 context chips would be 4x; compiled at tiny size (TPU tiles pad the 4-way split of the
    # sequence more) it is 2.9x (0.499 vs 1.466 GFLOP per chip)
    assert 2.5 * student.flops < teacher.flops < 4 * student.flops, (student.flops, teacher.flops)


@pytest.mark.slow
def test_benchmark_student_piece_runs_plays_samplers():
    """The benchmark runner's ``student`` piece (benchmarks/student_bench.py) compiles and runs play's
    student and teacher sampling for one game on this CPU (configs/tiny.py, random weights)."""
    from animegamer_jax.config import load_config
    from benchmarks import student_bench

    r = student_bench.bench_student(load_config("configs/tiny.py"), student_steps=2, teacher_steps=2)
    assert r["ok"] and r["check"] == "finite, shape [1, 5, 16, 8, 12]: True"
    assert r["notes"]["student"] == "2 steps, no CFG batch (student), 1 game(s), play's program"
    assert r["notes"]["teacher"] == "2 steps x CFG batch 2, 1 game(s), play's program"
    student, teacher = r["fns"]
    assert student().shape == teacher().shape == (1, 5, 16, 8, 12)


@pytest.mark.slow
def test_games_per_chip_batches_games_in_one_program():
    """``--games_per_chip=B``: B games in each turn program (the engine's rows); on one chip the decode's
    arguments grow by exactly B - 1 more KV caches (weights once), and the batch's DiT sampling costs
    about B times one game's FLOPs."""
    from animegamer_jax.config import load_config
    from tests.tpu import tpu_devices

    cfg = load_config("configs/tiny.py", ["diffusion.sampler=student", "diffusion.num_sampling_steps=2"])
    devs = tpu_devices("v6e-1")
    chip = target.of_device(devs[0]).chip
    rows = {}
    for b in (1, 3):
        for name in ("decode", "dit"):
            prog = programs.turn_programs(cfg, [name], devs, "latency", games_per_chip=b)[0]
            with jax.default_matmul_precision("default"):
                rows[name, b] = report.compile_program(prog, chip)
            assert rows[name, b].status == "ok", rows[name, b].status
    assert "latency layout, 3 game(s), mesh" in rows["dit", 3].note
    m = cfg.mllm
    length = pieces.turn_length(cfg) + int(m.max_new_tokens)
    import numpy as np
    cache = 2 * int(m.num_layers) * length * int(m.num_kv_heads) * int(m.head_dim) * np.dtype(m.dtype).itemsize  # K, V per game
    grown = rows["decode", 3].arguments - rows["decode", 1].arguments
    # two more caches (the TPU pads their minor dimensions to its tiles: 1.27x at tiny size), not more weights
    assert 2 * cache <= grown < 1.5 * 2 * cache < rows["decode", 1].arguments, (grown, cache)
    assert 2.5 * rows["dit", 1].flops < rows["dit", 3].flops < 3.5 * rows["dit", 1].flops
    with pytest.raises(ValueError, match="games_per_chip must be at least 1"):
        programs.turn_programs(cfg, ["dit"], devs, "latency", games_per_chip=0)


def test_reference_programs_add_one_latent_frame_of_tokens():
    """``--program=dit_reference``: play's sampler with a --character's reference latent and the phase-r
    adapter (cpu-1, tiny): every DiT call's sequence gains one patchified latent frame (8 x 12 latents,
    patch 2: 24 tokens on 144), so the sampling costs more FLOPs and takes the adapter and the latent as
    arguments; ``reference_encode`` (once per character per game) maps one 64 x 96 image to one latent
    frame [1, 1, 16, 8, 12] float32."""
    from animegamer_jax.config import load_config

    cfg = load_config("configs/tiny.py", [])
    devs = target.compile_devices(target.parse_topology("cpu-1"))
    rows = {p.name: report.compile_program(p, None) for p in
            programs.turn_programs(cfg, ["dit", "dit_reference", "reference_encode"], devs, "latency")}
    assert all(r.status == "ok" for r in rows.values()), {n: r.status for n, r in rows.items()}
    plain, ref = rows["dit"], rows["dit_reference"]
    assert pieces.reference_tokens(cfg) == 24 and "(+24 tokens per DiT call)" in ref.note
    (k_plain,), (k_ref,) = plain.kernels, ref.kernels
    assert "q (2, 144, 4, 32)" in k_plain and "q (2, 168, 4, 32)" in k_ref, (k_plain, k_ref)
    # the attention grows by (168 / 144)^2 and the projections / MLP by 168 / 144: between the two
    assert 168 / 144 < ref.flops / plain.flops < (168 / 144) ** 2, (ref.flops, plain.flops)
    d = cfg.dit
    latent = 4 * int(d.in_channels) * int(d.sample_height) * int(d.sample_width)
    assert ref.arguments - plain.arguments > latent
    assert rows["reference_encode"].outputs == latent == 6144 and "64x96 -> [1, 1, 16, 8, 12]" in \
        rows["reference_encode"].note
    # the report's added cost needs a chip's roofline (none for cpu-N); with one it is the difference per turn
    assert report.reference_added(list(rows.values())) is None
    for r, t in ((plain, 1.0), (ref, 1.25), (rows["reference_encode"], 0.01)):
        r.roofline_s = t
    added = report.reference_added(list(rows.values()))
    assert added["added_s"] == pytest.approx(0.25) and added["encode_s"] == 0.01
    assert added["added_flops"] == ref.flops - plain.flops and added["added_peak"] == ref.peak - plain.peak
