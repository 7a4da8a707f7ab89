"""Checked system checkpoints: integrity.json written by save_system, verified before every load; each
damaged, truncated or missing file gives one line naming it and the fix (no TensorStore/JSON traceback)."""

import glob
import json
import os
import shutil

import numpy as np
import pytest
from flax import nnx

from animegamer_jax import checkpoint
from animegamer_jax.commands import play
from animegamer_jax.commands import checkpoint as checkpoint_cli
from animegamer_jax.checkpoint import integrity
from configs import tiny
from tests.checkpoint_helpers import system_without
from tests.train_helpers import Toy

BUILDERS = {"dit": lambda c, r: Toy(r)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("ck") / "sys")
    return checkpoint.save_system(d, {"dit": Toy(nnx.Rngs(1))}, tiny.get_config())


def _copy(saved, tmp_path):
    dst = str(tmp_path / "copy")
    shutil.copytree(saved, dst)
    return dst


def _array_file(d):
    """The largest OCDBT data file of the dit component (holds the weights)."""
    files = [f for f in glob.glob(os.path.join(d, "dit", "**", "d", "*"), recursive=True) if os.path.isfile(f)]
    return max(files, key=os.path.getsize)


def _rel(d, path):
    return os.path.relpath(path, d)


@pytest.mark.slow
def test_save_writes_integrity_and_load_verifies(saved):
    man = json.load(open(os.path.join(saved, checkpoint.INTEGRITY_FILE)))
    assert "commit_success.txt" in man["files"] and "manifest/metadata" in man["files"]
    assert all(len(v["sha256"]) == 64 and v["size"] >= 0 for v in man["files"].values())
    assert checkpoint.verify_checkpoint(saved, "full")["files"] == man["files"]
    out = checkpoint.load_system(saved, builders=BUILDERS)
    np.testing.assert_array_equal(np.asarray(out["dit"].w1[...]), np.asarray(Toy(nnx.Rngs(1)).w1[...]))
    assert checkpoint.checkpoint_identity(saved).startswith("sha256:")


def test_shipped_tiny_system_verifies():
    assert len(checkpoint.verify_checkpoint("checkpoints/tiny_system", "full")["files"]) > 10


def _truncate(path, keep=0.5):
    n = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(int(n * keep))
    return n


@pytest.mark.parametrize("what", ["array", "_METADATA", "manifest", "config", "commit", "flip8"])
def test_each_damage_is_one_line_naming_the_file(saved, tmp_path, what):
    d = _copy(saved, tmp_path)
    target = {"array": _array_file(d), "_METADATA": os.path.join(d, "dit", "_METADATA"),
              "manifest": os.path.join(d, "manifest", "metadata"), "config": os.path.join(d, "config", "metadata"),
              "commit": os.path.join(d, "commit_success.txt"), "flip8": _array_file(d)}[what]
    rel = _rel(d, target)
    if what == "commit":
        os.remove(target)
        msg = f"{d}: file {rel} is missing (the checkpoint is incomplete). Fix: copy the whole checkpoint"
    elif what == "flip8":  # 8 overwritten bytes inside the weights: same size, caught by the hash
        with open(target, "r+b") as f:
            f.seek(os.path.getsize(target) // 2)
            f.write(b"\x7f" * 8)
        msg = f"{d}: file {rel} is damaged (its sha256 differs from the one saved in integrity.json). Fix:"
    else:
        n = _truncate(target)
        msg = f"{d}: file {rel} is truncated ({n // 2} bytes, {n} when saved). Fix: copy the whole"
    for mode in ("fast", "full"):
        with pytest.raises(checkpoint.CheckpointIntegrityError) as e:
            checkpoint.load_system(d, builders=BUILDERS, verify=mode)
        assert str(e.value).startswith(msg) and "\n" not in str(e.value)
        assert f"verify --full {d}`" in str(e.value)


@pytest.mark.parametrize("what", ["array", "_METADATA", "manifest", "config"])
def test_unverified_reads_still_give_one_line(saved, tmp_path, what):
    """Even with the check skipped (verify=None), orbax/TensorStore/JSON errors are one line naming the folder."""
    d = _copy(saved, tmp_path)
    target = {"array": _array_file(d), "_METADATA": os.path.join(d, "dit", "_METADATA"),
              "manifest": os.path.join(d, "manifest", "metadata"), "config": os.path.join(d, "config", "metadata")}[what]
    _truncate(target, 0.3)
    with pytest.raises(checkpoint.CheckpointIntegrityError) as e:
        if what == "config":
            checkpoint.load_config(d)
        else:
            checkpoint.load_system(d, builders=BUILDERS, verify=None)
    text = str(e.value)
    assert "\n" not in text and d in text and "Fix:" in text, text
    want = {"array": ("reading component(s) ['dit'] failed", "cannot read the metadata of component 'dit'"),
            "_METADATA": ("cannot read the metadata of component 'dit'",),
            "manifest": ("manifest/metadata (the component list) is damaged",),
            "config": ("config/metadata (the saved config) is damaged",)}[what]
    assert any(w in text for w in want), text


def test_missing_or_damaged_integrity_file_and_remanifest(saved, tmp_path, capsys):
    d = _copy(saved, tmp_path)
    os.remove(os.path.join(d, checkpoint.INTEGRITY_FILE))
    with pytest.raises(checkpoint.CheckpointIntegrityError, match=r"no integrity.json, so its files cannot be checked .*"
                       r"Fix: re-save it with save_system; if you trust it, write one with "
                       r"`python -m animegamer_jax.commands.checkpoint manifest "):
        checkpoint.load_system(d, builders=BUILDERS)
    assert checkpoint_cli.main(["manifest", d]) == 0
    assert checkpoint_cli.main(["verify", "--full", d]) == 0
    out = capsys.readouterr().out
    assert "ok: " in out and "MiB, full check in" in out
    assert checkpoint_cli.main(["check", d]) == 2 and checkpoint_cli.main(["verify", d, "--fast"]) == 2  # absl: a one-line usage error
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "error: unknown kind 'check'; choose one of verify, manifest, cast, add"
    assert err[1].startswith("error: Unknown command line flag 'fast'")
    with open(os.path.join(d, checkpoint.INTEGRITY_FILE), "r+b") as f:
        f.truncate(40)
    assert checkpoint_cli.main(["verify", d]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {d}/integrity.json is damaged (JSONDecodeError") and err.count("\n") == 1


def test_fast_mode_samples_large_files(saved, tmp_path, monkeypatch):
    """Files over FULL_HASH_BELOW: fast = size + sampled blocks (catches truncation and the sampled
    regions), full = every byte (catches the rest)."""
    monkeypatch.setattr(integrity, "FULL_HASH_BELOW", 256)
    monkeypatch.setattr(integrity, "SAMPLE_BLOCK", 16)
    monkeypatch.setattr(integrity, "SAMPLE_BLOCKS", 2)
    d = _copy(saved, tmp_path)
    checkpoint.write_integrity(d)
    f = _array_file(d)
    entry = json.load(open(os.path.join(d, checkpoint.INTEGRITY_FILE)))["files"][_rel(d, f)]
    assert os.path.getsize(f) > 256 and "sampled_sha256" in entry
    with open(f, "r+b") as fh:  # outside the two sampled blocks (first and last 16 bytes)
        fh.seek(100)
        fh.write(b"\x7f" * 8)
    checkpoint.verify_checkpoint(d, "fast")
    with pytest.raises(checkpoint.CheckpointIntegrityError, match="is damaged"):
        checkpoint.verify_checkpoint(d, "full")
    with open(f, "r+b") as fh:  # inside the first block
        fh.write(b"\x7f" * 8)
    with pytest.raises(checkpoint.CheckpointIntegrityError, match="is damaged"):
        checkpoint.verify_checkpoint(d, "fast")


def test_play_with_a_damaged_checkpoint_is_one_line(tmp_path, capsys):
    d = str(tmp_path / "tiny")
    shutil.copytree("checkpoints/tiny_system", d)
    dit = max((f for f in glob.glob(os.path.join(d, "dit", "**", "*"), recursive=True) if os.path.isfile(f)),
              key=os.path.getsize)
    _truncate(dit)
    script = tmp_path / "s.txt"
    script.write_text("Character: Bunny; Motion: hop; Background: day.\n")
    for args in ([], ["--config", "configs/tiny.py"]):  # config from the checkpoint, or given
        assert play.main([str(script), "--checkpoint", d, "--out", str(tmp_path / "o"), *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {d}: file {_rel(d, dit)} is truncated (") and err.count("\n") == 1, err
    assert not os.path.exists(tmp_path / "o" / "s")


@pytest.mark.slow
def test_cast_stores_components_smaller_and_loads_back(tmp_path, capsys):
    """``python -m animegamer_jax.commands.checkpoint cast``: the named components' float32 arrays stored as bf16 (how the shipped
    tiny system's MLLM is stored), loaded back at the module dtype within bf16 rounding, the rest
    bit-identical; never onto an existing folder."""
    import jax

    src, dst = "checkpoints/tiny_system", str(tmp_path / "cast")
    assert checkpoint_cli.main(["cast", src, dst, "--components=vae"]) == 0
    assert "vae stored as bfloat16" in capsys.readouterr().out
    size = lambda d, c: sum(os.path.getsize(p) for p in glob.glob(os.path.join(d, c, "**"), recursive=True)  # noqa: E731
                            if os.path.isfile(p))
    assert size(dst, "vae") < 0.6 * size(src, "vae") and abs(size(dst, "dit") - size(src, "dit")) < 0.02 * size(src, "dit")
    a, b = checkpoint.load_system(src), checkpoint.load_system(dst)
    va, vb = (jax.tree.leaves(nnx.state(m["vae"], nnx.Param)) for m in (a, b))
    assert all(y.dtype == x.dtype for x, y in zip(va, vb))
    assert any(not np.array_equal(x, y) for x, y in zip(va, vb))  # rounded ...
    for x, y in zip(va, vb):  # ... to bf16's 8 bits of mantissa
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=2 ** -8, atol=1e-30)
    for x, y in zip(*(jax.tree.leaves(nnx.state(m["dit"])) for m in (a, b))):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # components not named keep the dtype they are stored with (the shipped MLLM: bf16), not the config's
    for name in ("mllm", "dit"):
        assert checkpoint.stored_dtypes(dst, name) == checkpoint.stored_dtypes(src, name), name
    assert set(map(str, checkpoint.stored_dtypes(dst, "vae").values())) == {"bfloat16"}
    assert checkpoint_cli.main(["cast", src, str(tmp_path / "z"), "--components=vae", "--dtype=float64"]) == 2
    assert "narrower than float32" in capsys.readouterr().err
    assert checkpoint_cli.main(["cast", src, dst, "--components=vae"]) == 2
    assert "exists" in capsys.readouterr().err
    assert checkpoint_cli.main(["cast", src, str(tmp_path / "x"), "--components=nope"]) == 2
    assert "no component(s) ['nope']" in capsys.readouterr().err
    assert checkpoint_cli.main(["cast", src, str(tmp_path / "y")]) == 2  # --components is required
    # the description of what the system is travels with a cast, or is replaced by --description
    about = checkpoint.read_manifest(src).get("description", "")
    assert "81 two-second 64x96 clips" in about and checkpoint.read_manifest(dst)["description"] == about
    assert checkpoint_cli.main(["cast", src, str(tmp_path / "d"), "--components=vae", "--description=a <b> system"]) == 0
    assert checkpoint.read_manifest(str(tmp_path / "d"))["description"] == "a <b> system"


def test_add_copies_every_file_and_rewrites_only_the_records(tmp_path, capsys):
    """``python -m animegamer_jax.commands.checkpoint add BASE DST --from=SYSTEM --components=reference`` (how the
    shipped tiny system gained its reference adapter): every file of BASE and of the added component
    byte for byte, the manifest/config/handlers gain the component; refusals are one line."""
    ship = "checkpoints/tiny_system"
    base = system_without(ship, str(tmp_path / "base"), ("reference",))
    cfg = json.load(open(os.path.join(base, "config", "metadata")))
    for key in ("reference_lora_rank", "reference_lora_alpha"):  # a base whose config predates them
        cfg["dit"].pop(key)
    cfg["train"]["phase"] = "d"
    with open(os.path.join(base, "config", "metadata"), "w") as f:
        json.dump(cfg, f)
    checkpoint.write_integrity(base)
    src = str(tmp_path / "src")
    shutil.copytree(ship, src)
    with open(os.path.join(src, "config", "metadata")) as f:
        src_cfg = json.load(f)
    src_cfg["train"]["phase"], src_cfg["train"]["resume_step"] = "r", 7  # the run's own settings stay out
    with open(os.path.join(src, "config", "metadata"), "w") as f:
        json.dump(src_cfg, f)
    checkpoint.write_integrity(src)
    dst = str(tmp_path / "dst")
    assert checkpoint_cli.main(["add", base, dst, f"--from={src}", "--components=reference"]) == 0
    assert "config gained dit.reference_lora_rank, dit.reference_lora_alpha" in capsys.readouterr().out
    records = {"manifest/metadata", "config/metadata", "_CHECKPOINT_METADATA", checkpoint.INTEGRITY_FILE}
    got = set(checkpoint.verify_checkpoint(dst, "full")["files"])
    assert got == set(checkpoint.read_integrity(ship)["files"])  # the shipped system's file list exactly
    for rel in got - records:
        root = src if rel.startswith("reference/") else base
        assert open(os.path.join(dst, rel), "rb").read() == open(os.path.join(root, rel), "rb").read(), rel
    man, ship_man = checkpoint.read_manifest(dst), checkpoint.read_manifest(ship)
    assert man["components"] == ship_man["components"] and man["param_counts"] == ship_man["param_counts"]
    assert man["description"] == ship_man["description"]  # BASE's, kept
    new_cfg = json.load(open(os.path.join(dst, "config", "metadata")))
    assert new_cfg["dit"]["reference_lora_rank"] == 4 and new_cfg["dit"]["reference_lora_alpha"] == 4.0
    assert new_cfg["train"] == cfg["train"] and "resume_step" not in new_cfg["train"]
    meta = json.load(open(os.path.join(dst, "_CHECKPOINT_METADATA")))
    assert meta["item_handlers"] == json.load(open(os.path.join(ship, "_CHECKPOINT_METADATA")))["item_handlers"]
    assert checkpoint.stored_dtypes(dst, "mllm") == checkpoint.stored_dtypes(ship, "mllm")  # bf16 kept
    # refusals: an existing DST, a component BASE holds or SRC lacks, nothing named; nothing written
    for argv, says in ((["add", base, dst, f"--from={src}", "--components=reference"], "exists"),
                       (["add", src, str(tmp_path / "x"), f"--from={src}", "--components=reference"], "already holds"),
                       (["add", base, str(tmp_path / "x"), f"--from={base}", "--components=reference"],
                        "has no component(s) ['reference']"),
                       (["add", base, str(tmp_path / "x"), f"--from={src}"], "expected 'add BASE DST")):
        assert checkpoint_cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err
    assert sorted(os.listdir(tmp_path)) == ["base", "dst", "src"]
