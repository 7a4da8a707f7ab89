"""`convert release` + `check-release` on the tiny release fixture (../shared/fixtures/release_tiny).

One conversion per module; one reference engine plays both recorded cases (compiled once). The
bad-input tests each break one file of a symlinked copy of the release and check the one-line
messages (file, key, fix) and that nothing is left at DST.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "..", "shared", "fixtures", "release_tiny")
RELEASE = os.path.join(FIXTURE, "release")
CONFIG = os.path.join(ROOT, "configs", "release_tiny.py")
CASES = sorted(glob.glob(os.path.join(FIXTURE, "cases", "*.npz")))

pytestmark = pytest.mark.skipif(not os.path.isdir(RELEASE),
                                reason=f"release fixture absent: {FIXTURE} (CI clones shared/ beside the repo)")


def _convert(src: str, dst: str, config: str = CONFIG) -> int:
    from animegamer_jax.commands.convert import main as convert_main

    return convert_main(["release", src, dst, "--config", config])


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The release fixture converted; beside DST first: what a SIGKILLed conversion leaves (its owner
    process gone, to be removed) and a folder of the same pattern without an owner file (kept)."""
    import socket
    import subprocess
    import sys

    root = tmp_path_factory.mktemp("release")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (root / ".system.partial-killed" / "system").mkdir(parents=True)
    from animegamer_jax.io import fileio

    (root / ".system.partial-killed" / ".animegamer-owner").write_text(
        f"{socket.gethostname()} {dead.stdout.strip()} {fileio._pid_namespace()}")
    (root / ".system.partial-notours").mkdir()
    dst = str(root / "system")
    assert _convert(RELEASE, dst) == 0
    return dst


def test_convert_release_writes_one_system_checkpoint(converted):
    from animegamer_jax import checkpoint

    m = checkpoint.read_manifest(converted)
    assert m["components"] == sorted(checkpoint.COMPONENTS)
    # counts from the fixture's module sizes (README "Tiny sizes"), e.g. the DiT and E_a
    assert m["param_counts"]["shot_encoder"] == (32 * 64 + 64 + 64 * 64 + 64) + (768 * 64 + 64 + 64 * 64 + 64) + 4 * 64
    assert m["param_counts"]["mllm"] > m["param_counts"]["dit"] > 0
    assert checkpoint.load_config(converted).name == "release_tiny"
    # the killed conversion's folder is gone, a folder without an owner file is not this program's to remove
    assert [p for p in os.listdir(os.path.dirname(converted)) if ".partial-" in p] == [".system.partial-notours"]


@pytest.mark.slow
def test_check_release_both_cases(converted, capsys):
    from animegamer_jax.convert import check_release
    from animegamer_jax.commands.convert import reference_engine

    assert len(CASES) >= 2
    engine = reference_engine(converted)
    for case in CASES:
        stages = check_release.check_release(engine, case, log=print)
        names = [s.name for s in stages]
        assert names == ["ids", "masks", "state tokens", "states", "s_a", "latents", "frames float", "frames uint8"]
        bad = [s.line() for s in stages if not s.ok]
        assert not bad, f"{os.path.basename(case)}: {bad}"
        by = {s.name: s for s in stages}
        assert 0 < by["s_a"].diff < by["s_a"].tol < 1e-3  # a real comparison, not a trivially equal one
        assert 0 < by["latents"].diff < by["latents"].tol
    out = capsys.readouterr().out
    assert out.count("ok   states") == len(CASES)


# ---------------------------------------------------------------------------------------------
# Bad input: one line per problem naming file, key and fix; nothing at DST
# ---------------------------------------------------------------------------------------------
def _copy_release(tmp_path, replace: dict[str, object] | None = None):
    """A copy of the release made of symlinks, with the files in ``replace`` written anew."""
    src = tmp_path / "release"
    for path in glob.glob(os.path.join(RELEASE, "**", "*"), recursive=True):
        if os.path.isdir(path):
            continue
        rel = os.path.relpath(path, RELEASE)
        out = src / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if replace and rel in replace:
            if replace[rel] is not None:
                replace[rel](path, str(out))
        else:
            os.symlink(os.path.abspath(path), out)
    return str(src)


def _fails(src: str, tmp_path, capsys, config: str = CONFIG) -> list[str]:
    dst = str(tmp_path / "out" / "system")
    assert _convert(src, dst, config) == 1
    assert not os.path.exists(dst)
    assert not os.path.exists(os.path.dirname(dst)) or os.listdir(os.path.dirname(dst)) == []
    lines = [l for l in capsys.readouterr().err.splitlines() if l.startswith("error: ")]
    assert lines and all("Fix:" in l for l in lines), lines
    return lines


ENGINE = "AnimeGamer/VDM_Decoder-Qiqi/10000/mp_rank_00_model_states.pt"
MLLM = "AnimeGamer/MLLM-Qiqi/pytorch_model.bin"


def _edit_torch(fn, key: str = "state_dict"):
    def write(path, out):
        obj = torch.load(path, map_location="cpu", weights_only=True)
        fn(obj[key] if key else obj)
        torch.save(obj, out)
    return write


def test_missing_file(tmp_path, capsys):
    lines = _fails(_copy_release(tmp_path, {MLLM: None}), tmp_path, capsys)
    assert len(lines) == 1 and "MLLM-*/pytorch_model.bin" in lines[0] and "no MLLM pytorch_model.bin found" in lines[0]


def test_renamed_key(tmp_path, capsys):
    old, new = "decoder.conv_in.conv.weight", "decoder.conv_in.conv.weights"
    lines = _fails(_copy_release(tmp_path, {"vae/3d-vae.pt": _edit_torch(lambda sd: sd.__setitem__(new, sd.pop(old)))}),
                   tmp_path, capsys)
    assert len(lines) == 1
    assert "vae/3d-vae.pt" in lines[0] and "decoder.conv_in.conv.weight" in lines[0] and "missing" in lines[0]
    assert "conv.weights" in lines[0] and "unexpected" in lines[0]


def test_wrong_shape(tmp_path, capsys):
    key = "output_resampler.proj.2.bias"
    lines = _fails(_copy_release(tmp_path, {MLLM: _edit_torch(lambda sd: sd.__setitem__(key, sd[key][:-1].clone()), key=None)}),
                   tmp_path, capsys)
    assert len(lines) == 1 and MLLM in lines[0] and key in lines[0] and "(63,)" in lines[0]


def test_truncated_file(tmp_path, capsys):
    def truncate(path, out):
        with open(path, "rb") as f:
            data = f.read()
        with open(out, "wb") as f:
            f.write(data[: len(data) // 2])

    lines = _fails(_copy_release(tmp_path, {ENGINE: truncate}), tmp_path, capsys)
    assert len(lines) == 1 and ENGINE in lines[0] and "truncated" in lines[0] and "download" in lines[0]


def test_pickled_bookkeeping_needs_allow_pickle(tmp_path, capsys):
    import argparse

    def add_args(path, out):  # DeepSpeed / SAT files can pickle Python objects beside 'module'
        obj = torch.load(path, map_location="cpu", weights_only=True)
        obj["args"] = argparse.Namespace(seed=1234)
        torch.save(obj, out)

    lines = _fails(_copy_release(tmp_path, {ENGINE: add_args}), tmp_path, capsys)
    assert len(lines) == 1 and ENGINE in lines[0] and "--allow_pickle" in lines[0] and "\x1b" not in lines[0]


def test_config_sizes_do_not_match(tmp_path, capsys):
    # the paper-size default config against the tiny weights: one line per component, naming a key
    lines = _fails(RELEASE, tmp_path, capsys, config=os.path.join(ROOT, "configs", "animegamer_2b_7b.py"))
    assert len(lines) == 6
    assert all("does not match" in l or "do not match" in l for l in lines)
    assert any("llm.base_model.model.model.embed_tokens.weight" in l and "(32284, 48)" in l for l in lines)
    assert any("model.diffusion_model.mixins.patch_embed.proj.weight" in l for l in lines)
