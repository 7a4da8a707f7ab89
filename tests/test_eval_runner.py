"""The benchmark runner end to end on the random stand-in system (tiny config, 2 short games)."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from animegamer_jax.config import load_config
from animegamer_jax.commands import eval as cli
from animegamer_jax.commands.cli import run_subcommand
from animegamer_jax.eval import games
from animegamer_jax.eval import metrics
from animegamer_jax.eval.table1_games import BenchmarkError
from animegamer_jax.inference.turn_model import TurnModel


def _small_benchmark(tmp_path):
    src = json.load(open("data/benchmark/benchmark.json"))
    src["characters"] = {k: os.path.abspath(os.path.join("data/benchmark", v)) for k, v in src["characters"].items()}
    src["games"] = [dict(g, rounds=g["rounds"][:2]) for g in src["games"][:2]]
    p = tmp_path / "bench.json"
    p.write_text(json.dumps(src))
    return str(p), src


class _CheapModel:
    """A minimal TurnModel (cheaper to compile than inference/standin_model.py): states from the ids,
    noise frames; none of the optional capabilities."""

    label, identity, description = "test system (noise)", "", ""
    free_decoding = False
    kv_cache = streaming = reference = characters = preview = None

    def __init__(self, config):
        self.q, self.d = config.rep.num_text_tokens + config.rep.num_image_tokens, config.rep.dim
        self.latent_shape = (config.dit.num_latent_frames, config.vae.latent_channels, config.dit.sample_height,
                             config.dit.sample_width)
        self.params = {"bias": np.float32(0.0)}

    def mllm(self, p, batch):
        s = jnp.sum(batch["ids"], axis=1)
        states = jnp.stack([1 + s % 5, s % 11 - 5, s % 7 - 3, s % 3 - 1], axis=1).astype(jnp.int32)
        return states, jnp.zeros((s.shape[0], self.q, self.d), jnp.float32) + p["bias"]

    def sample(self, p, rep, ml, keys, noise=None, reference=None):
        return jax.vmap(lambda k: jax.random.normal(k, self.latent_shape))(keys)

    def decode(self, p, lat):
        x = jnp.repeat(jnp.repeat(lat[:, :, :3], 8, axis=3), 8, axis=4)  # [B, T, 3, H, W]
        x = jnp.concatenate([x[:, :1]] + [x[:, 1:]] * 4, axis=1)  # 1 + 4 (T - 1) frames
        return jax.nn.sigmoid(jnp.moveaxis(x, 2, -1))


def _cheap_system(config):
    """A :class:`_CheapModel` for ``config``."""
    model = _CheapModel(config)
    assert isinstance(model, TurnModel)
    return model


def test_runner_writes_report_with_table1_columns(tmp_path):
    path, src = _small_benchmark(tmp_path)
    config = load_config("configs/tiny.py", ["game.write_gif=False"])
    out = str(tmp_path / "eval")
    report = games.run_table1(config, path, out, system=_cheap_system(config), write_games=True, log=lambda *_: None)
    on_disk = json.load(open(os.path.join(out, "report.json")))
    assert on_disk["metrics"] == pytest.approx(report["metrics"])
    md = open(os.path.join(out, "report.md")).read()
    for col in metrics.TABLE1_COLUMNS:
        assert f" {col} |" in md
    assert "test system (noise)" in md and "random-feature stand-in" in md and "paper AnimeGamer" in md
    m = report["metrics"]
    assert m["turns"] == 4 and report["benchmark"]["rounds"] == 4
    assert set(report["per_game"]) == {"bunny-day", "rider-city"}
    # ACC-S / MAE-S recomputed from the stored predictions and the benchmark's ground truth
    pred = np.array([s for gid in ("bunny-day", "rider-city") for s in report["predictions"][gid]])
    gt = np.array([[r["states"][f] for f in metrics.STATE_FIELDS] for g in src["games"] for r in g["rounds"]])
    acc, mae = metrics.state_metrics(pred, gt)
    assert m["ACC-S"] == pytest.approx(acc) and m["MAE-S"] == pytest.approx(mae)
    assert 0.0 <= m["ACC-F"] <= 1.0 and m["MAE-F"] >= 0.0
    assert -1.0 <= m["CLIP-I"] <= 1.0 and m["DreamSim"] is None
    assert m["s/turn"] > 0.0
    # every game was also written through the game writers
    assert os.path.exists(os.path.join(out, "games", "bunny-day", "game.json"))


def test_cli_reports_a_bad_benchmark_before_generating(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "characters": {}, "games": []}')
    rc = cli.main(["--standin", f"--config.eval.benchmark={bad}", "--out", str(tmp_path / "o")])
    assert rc == 2
    assert "'characters' must map each character name" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "o" / "report.json")
    with pytest.raises(BenchmarkError):
        games.run_table1(load_config("configs/tiny.py"), str(bad), str(tmp_path / "o"), standin=True)
    rc = cli.main(["--standin", "--config.eval.nope=1"])
    assert rc == 2 and "unknown config key" in capsys.readouterr().err
    # the same through the named subcommand; an unknown one is one line
    rc = cli.main(["table1", "--standin", "--config.eval.nope=1"])
    assert rc == 2 and "unknown config key" in capsys.readouterr().err
    assert cli.main(["zz"]) == 2 and "unknown kind 'zz'" in capsys.readouterr().err


def test_run_subcommand_default_takes_flags_and_no_arguments(capsys):
    """``<program> --flag`` and ``<program>`` run the default kind on all the arguments; a named kind runs
    itself; help goes to the default (whose doc names the kinds)."""
    calls = []
    commands = {"a": lambda args: calls.append(("a", args)) or 3, "b": lambda args: calls.append(("b", args))}
    assert run_subcommand(["--x=1", "y"], commands, "doc", default="a") == 3
    assert run_subcommand([], commands, "doc", default="a") == 3
    assert run_subcommand(["--help"], commands, "doc", default="a") == 3
    assert run_subcommand(["b", "--x=2"], commands, "doc", default="a") == 0
    assert calls == [("a", ["--x=1", "y"]), ("a", []), ("a", ["--help"]), ("b", ["--x=2"])]
    # without a default: a flag first is an unknown kind, nothing at all asks for one, help prints the doc
    assert run_subcommand(["--x=1"], commands, "doc") == 2 and "unknown kind '--x=1'" in capsys.readouterr().err
    assert run_subcommand([], commands, "doc") == 2 and "expected a kind" in capsys.readouterr().err
    assert run_subcommand(["--help"], commands, "the doc") == 0 and "the doc" in capsys.readouterr().err
    assert len(calls) == 4


def test_run_reads_a_table_of_commands(capsys):
    """``cli.run``: a row's flags, positional names, errors, ``with_argv`` and nested ``subcommands``."""
    from absl import flags

    from animegamer_jax.commands.cli import Command, run

    calls = []

    def define(fv, argv):
        flags.DEFINE_integer("n", 1, "a number", flag_values=fv)

    def body(f, *rest):
        calls.append((f.n, rest))
        if f.n < 0:
            raise LookupError("negative n")
        return f.n

    inner = Command(define, lambda f, argv, src: calls.append(("inner", argv, src)), "inner doc", ("SRC",),
                    with_argv=True)
    table = {"x": Command(define, body, "x doc", ("SRC", "DST"), errors=(LookupError,), subcommands={"in": inner})}
    assert run("prog", ["x", "a", "b", "--n=4"], table, "the doc") == 4
    assert run("prog", ["x", "a", "b", "--n=-1"], table, "the doc") == 2
    assert capsys.readouterr().err == "error: negative n\n"
    assert run("prog", ["x", "a"], table, "the doc") == 2
    assert "expected SRC DST, got ['a']. Usage: prog x SRC DST [flags]" in capsys.readouterr().err
    assert run("prog", ["x", "in", "s", "--n=2"], table, "the doc") == 0
    assert run("prog", ["y"], table, "the doc") == 2 and "unknown kind 'y'" in capsys.readouterr().err
    assert run("prog", ["a", "b", "--n=5"], table["x"]) == 5  # one Command: no kind to name
    assert calls == [(4, ("a", "b")), (-1, ("a", "b")), ("inner", ["s", "--n=2"], "s"), (5, ("a", "b"))]
