"""``make demo`` (``play SCRIPT --demo``) plays the shipped checkpoint with the config saved in it, as
``play SCRIPT --checkpoint checkpoints/tiny_system`` does (the VAE's fitted scaling factor, 1.1199,
not configs/tiny.py's 1.1526): the same config, so the same turn files, and a demo game continues
with the docs' ``play --continue outputs/games/bunny --checkpoint checkpoints/tiny_system``."""

import json
import os

import pytest

from animegamer_jax.checkpoint import load_config
from animegamer_jax.commands import play
from animegamer_jax.commands.game_flags import parse_game_flags
from animegamer_jax.config import load_config as load_config_file
from animegamer_jax.io import paths

CKPT = "checkpoints/tiny_system"


def _plain(cfg) -> dict:
    d = json.loads(cfg.to_json())
    d["game"].pop("checkpoint")
    return d


def test_demo_plays_with_the_checkpoints_saved_config():
    saved = load_config(paths.resource(CKPT))
    tiny = load_config_file("configs/tiny.py")
    assert round(float(saved.vae.scaling_factor), 4) == 1.1199
    assert round(float(tiny.vae.scaling_factor), 4) == 1.1526  # what the demo decoded with before
    _, _, demo = parse_game_flags("play", ["s.txt", "--demo"], play.define_flags)
    _, _, ckpt = parse_game_flags("play", ["s.txt", "--checkpoint", CKPT], play.define_flags)
    assert demo.vae.scaling_factor == saved.vae.scaling_factor
    assert _plain(demo) == _plain(ckpt)
    assert demo.game.checkpoint == paths.resource(CKPT)
    # overrides still apply on top of the saved config
    _, _, seeded = parse_game_flags("play", ["s.txt", "--demo", "--config.game.seed=5"], play.define_flags)
    assert seeded.game.seed == 5 and seeded.vae.scaling_factor == saved.vae.scaling_factor
    # an explicit --config wins, and a missing checkpoint falls back to configs/tiny.py (the random system)
    _, _, given = parse_game_flags("play", ["s.txt", "--demo", "--config=configs/tiny.py"], play.define_flags)
    assert given.vae.scaling_factor == tiny.vae.scaling_factor
    _, _, missing = parse_game_flags("play", ["s.txt", "--demo", "--config.game.checkpoint=no/such/dir"],
                                     play.define_flags)
    assert missing.vae.scaling_factor == tiny.vae.scaling_factor and missing.game.checkpoint == "no/such/dir"


@pytest.mark.paper  # three plays of the tiny system, each compiling: over a minute on 2 cores
def test_demo_turns_equal_checkpoint_turns_and_continue(tmp_path):
    """The first two turns of bunny.txt: ``--demo`` and ``--checkpoint`` give the same bytes (timings
    apart), and the demo's game continues with the docs' command. (The whole of ``make demo`` against
    ``--checkpoint``: every file of both games the same, docs/changelog.md.)"""
    lines = [ln for ln in open(paths.resource("data/games/bunny.txt")) if ln.strip() and not ln.startswith("#")]
    (tmp_path / "bunny.txt").write_text("".join(lines[:2]))
    (tmp_path / "more.txt").write_text(lines[2])
    assert play.main([str(tmp_path / "bunny.txt"), "--demo", "--out", str(tmp_path / "a")]) == 0
    assert play.main([str(tmp_path / "bunny.txt"), "--checkpoint", CKPT, "--out", str(tmp_path / "b")]) == 0
    a, b = tmp_path / "a" / "bunny", tmp_path / "b" / "bunny"
    names = sorted(n for n in os.listdir(a) if n != "timings.json")
    assert names == sorted(n for n in os.listdir(b) if n != "timings.json")
    assert [n for n in names if n.startswith("turn_")] == [f"turn_{k:03d}.{e}" for k in range(2)
                                                          for e in ("gif", "mp4", "state.npz")]
    assert [n for n in names if (a / n).read_bytes() != (b / n).read_bytes()] == []
    assert play.main(["--continue", str(a), str(tmp_path / "more.txt"), "--checkpoint", CKPT]) == 0
    assert len(json.load(open(a / "game.json"))["turns"]) == 3
