"""pyproject.toml: dependencies, extras and console scripts; commands work from any directory."""

import ast
import importlib
import importlib.util
import os
import re
import subprocess
import sys
import tomllib

import pytest

from tests.subproc import ROOT


def _pyproject():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_dependencies_extras_and_console_scripts():
    proj = _pyproject()["project"]
    deps = {re.split(r"[=<>\[]", d)[0].lower(): d for d in proj["dependencies"]}
    pins = {}
    for line in open(os.path.join(ROOT, "requirements.txt")):
        line = line.split("#")[0].strip()
        if "==" in line:
            name, ver = line.split("==")
            pins[name.lower()] = ver
    # every runtime package of requirements.txt is declared, at the same known-good version
    for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "ml_collections", "absl-py",
                 "tensorboardx", "gcsfs", "av", "sentencepiece", "mistral-common"):
        assert deps[name] == f"{name if name != 'tensorboardx' else 'tensorboardX'}=={pins[name]}", name
    extras = proj["optional-dependencies"]
    assert extras["cuda12"] == [f"jax[cuda12]=={pins['jax']}"] and extras["tpu"] == [f"jax[tpu]=={pins['jax']}"]
    assert "cpu" in extras and f"tensorboard=={pins['tensorboard']}" in extras["tensorboard"]
    assert f"torch=={pins['torch']}" in extras["torch"]
    scripts = proj["scripts"]
    # one console script per command module (check runs under a launcher's python -m), none an alias of another
    commands = {f.removesuffix(".py") for f in os.listdir(os.path.join(ROOT, "animegamer_jax", "commands"))
                if f.endswith(".py")} - {"__init__", "cli", "game_flags", "check"}
    assert set(scripts) == {f"animegamer-{c}" for c in commands}
    assert sorted(scripts.values()) == sorted(f"animegamer_jax.commands.{n.removeprefix('animegamer-')}:cli"
                                              for n in scripts)
    for name, target in scripts.items():
        # parsed, not imported: train and serve define absl flags at import (one process could not
        # hold both); test_absl_command_runs_outside_the_checkout runs one for real
        module, attr = target.split(":")
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin, name
        tree = ast.parse(open(spec.origin, encoding="utf-8").read())
        assert attr in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, name


def test_configs_and_repo_data_resolve_from_any_directory(tmp_path, monkeypatch):
    from animegamer_jax.commands import cli
    from animegamer_jax.io import paths
    from animegamer_jax.config import load_config
    from animegamer_jax.tokenizers.t5_tokenizer import T5Tokenizer

    monkeypatch.chdir(tmp_path)
    argv = cli.resolve_config_args(["prog", "--config=configs/tiny.py", "--config.train.phase=b", "--config",
                                    "configs/animegamer_2b_7b.py", "--workdir=configs/tiny.py"])
    assert argv == ["prog", f"--config={ROOT}/configs/tiny.py", "--config.train.phase=b", "--config",
                    f"{ROOT}/configs/animegamer_2b_7b.py", "--workdir=configs/tiny.py"]
    cfg = load_config("configs/tiny.py", ["train.phase=b"])
    assert cfg.train.phase == "b"
    assert T5Tokenizer(cfg.t5.spiece_model, 8).vocab_size > 0  # data/tiny_t5_spiece.model from the checkout
    assert paths.resource(cfg.game.checkpoint) == os.path.join(ROOT, "checkpoints", "tiny_system")
    assert paths.resource("gs://b/x") == "gs://b/x" and paths.resource("nope/x") == "nope/x"
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "tiny.py").write_text("")
    assert paths.resource("configs/tiny.py") == "configs/tiny.py"  # the user's own file wins


@pytest.mark.slow
def test_absl_command_runs_outside_the_checkout(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    res = subprocess.run([sys.executable, "-m", "animegamer_jax.commands.data", "prepare", "--helpfull"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode in (0, 1) and "Traceback" not in res.stderr, res.stderr[-2000:]  # absl: help exits 1
    assert f"{ROOT}/configs/tiny.py" in res.stdout and "--config" in res.stdout


def test_absl_commands_help_and_booleans_read_well(capsys):
    import glob

    import pytest

    from animegamer_jax.commands import data
    from animegamer_jax.commands import eval as eval_cli

    for main, argv in ((eval_cli.main, ["--help"]), (data.main, ["sample", "--help"])):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
    text = capsys.readouterr().out
    assert "--[no]standin" in text and "--[no]write_games" not in text and "--config: Config file" in text
    assert "--width: Frame width (px)." in text
    assert eval_cli.main(["--standin", "--config.eval.nope=1"]) == 2
    assert "unknown config key 'nope'" in capsys.readouterr().err
    # no boolean flag whose absl negation doubles the "no" (--nono_progress)
    for path in glob.glob(os.path.join(ROOT, "animegamer_jax", "**", "*.py"), recursive=True):
        src = open(path, encoding="utf-8").read()
        assert not re.search(r"DEFINE_bool(ean)?\(\s*['\"]no_?", src), path


def test_cited_code_paths_exist():
    """Every code path (``models/cogvideox/dit.py``, ``animegamer_jax/convert/release.py``) and
    ``python -m animegamer_jax.<module>`` named in README.md, docs/ and the Python sources exists
    (in animegamer_jax/ or at the repository root; a ``python -m`` package runs only with a ``__main__.py``):
    moved modules leave no stale pointer behind. docs/changelog.md is left out: it names old paths on
    purpose."""
    import glob

    files = ["README.md", *(f for f in glob.glob("docs/*.md", root_dir=ROOT) if f != "docs/changelog.md")]
    for folder in ("animegamer_jax", "configs", "benchmarks", "tests"):
        files += glob.glob(f"{folder}/**/*.py", root_dir=ROOT, recursive=True)
    rx_path = re.compile(r"(?<![\w/.])((?:animegamer_jax/)?(?:models|convert|game|train|data|eval|parallel|diffusion|web|commands)"
                         r"/[\w/]*\w\.py)\b")
    rx_mod = re.compile(r"python -m (animegamer_jax(?:\.[a-z_]\w*)*)(?!\w|\.[\w<])")  # not `...commands.<name>`
    stale = []
    for f in files:
        with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
            text = fh.read()
        for p in rx_path.findall(text):
            if not any(os.path.exists(os.path.join(ROOT, d, p)) for d in ("", "animegamer_jax")):
                stale.append(f"{f}: {p}")
        for m in rx_mod.findall(text):
            base = os.path.join(ROOT, *m.split("."))
            if not (os.path.exists(base + ".py") or os.path.exists(os.path.join(base, "__main__.py"))):
                stale.append(f"{f}: python -m {m}")
    assert not stale, stale


@pytest.mark.slow
def test_config_overrides_work_on_every_default_config(tmp_path, capsys):
    """`--config.a.b=v` without `--config` overrides the command's default config (serve: the config saved
    in --checkpoint, else configs/tiny.py); a command without a default (train) says to add --config."""
    from animegamer_jax.commands import game_flags
    from animegamer_jax.commands import web as web_cli

    ckpt = os.path.join(ROOT, "checkpoints", "tiny_system")
    f, rest, cfg = game_flags.parse_game_flags("animegamer-web", ["--standin", "--config.game.seed=5", "--port=1"],
                                               web_cli.define_flags, exclude=("overwrite",))
    assert (rest, cfg.name, cfg.game.seed, f.port, f.standin) == ([], "tiny", 5, 1, True)
    f, _, cfg = game_flags.parse_game_flags("animegamer-web", ["--checkpoint", ckpt, "--config.game.mode=reference"],
                                            web_cli.define_flags, exclude=("overwrite",))
    assert cfg.game.mode == "reference" and cfg.name == game_flags.checkpoint_config(ckpt).name
    assert web_cli.main(["--standin", "--config.game.nope=1"]) == 2
    assert "unknown config key 'nope'" in capsys.readouterr().err
    assert web_cli.main(["--standin", "--overwrite"]) == 2  # play's flag, not the web app's
    assert "overwrite" in capsys.readouterr().err

    from animegamer_jax.commands import train as train_cli

    workdir = str(tmp_path / "run")
    assert train_cli.main(["--config.train.phase=a2", f"--workdir={workdir}"]) == 2
    assert "has no default for. Fix: add --config=configs/tiny.py" in capsys.readouterr().err
    tiny = os.path.join(ROOT, "configs", "tiny.py")
    assert train_cli.main([f"--config={tiny}", "--config.train.nope=1", f"--workdir={workdir}"]) == 2
    assert "unknown config key 'nope'" in capsys.readouterr().err
    assert not os.path.exists(workdir)  # nothing written for a bad command line

    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    res = subprocess.run([sys.executable, "-m", "animegamer_jax.commands.data", "prepare", "--config.data.nope=1"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 2 and res.stderr == "error: unknown config key 'nope' in ['--config.data.nope=1']\n", \
        res.stderr[-2000:]
