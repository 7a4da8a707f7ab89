"""The ``python -m animegamer_jax.commands.convert <kind>`` dispatcher reaches every converter's CLI."""

import re

import numpy as np

import pytest

from animegamer_jax.commands import convert as cli


def test_every_kind_has_a_cli():
    assert set(cli.KINDS) == {"mistral", "animegamer-mllm", "clip", "t5", "dit", "vae", "release", "check-release"}
    for kind, command in cli.KINDS.items():
        assert command.body is not None and command.doc, kind
    assert set(cli.KINDS["dit"].subcommands) == {"migrate"}


def test_unknown_kind_and_help(capsys):
    assert cli.main(["bogus"]) == 2
    assert "unknown kind 'bogus'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["vae", "--help"])
    assert e.value.code == 0
    assert "3d-vae.pt" in capsys.readouterr().out


def test_every_kind_is_absl_with_config_overrides_in_help(capsys):
    """One command-line style: absl flags, `--config=F --config.a.b=v` shown in --help, SRC DST positional."""
    for kind in ("mistral", "animegamer-mllm", "clip", "t5", "dit", "vae", "release", "check-release"):
        with pytest.raises(SystemExit) as e:
            cli.main([kind, "--help"])
        assert e.value.code == 0, kind
        out = capsys.readouterr().out
        assert out.startswith(f"usage: python -m animegamer_jax.commands.convert {kind} "), (kind, out[:200])
        assert "flags:" in out and "argparse" not in out
        if kind not in ("mistral", "check-release"):
            assert "--config:" in out and re.search(r"--config\.[a-z0-9.]+=v overrides a field", " ".join(out.split())), kind
    with pytest.raises(SystemExit):
        cli.main(["clip", "--help"])
    assert "--[no]text_tower" in capsys.readouterr().out  # --notext_tower: the vision tower only


def test_bad_command_lines_are_one_line_errors(tmp_path, capsys):
    from safetensors.numpy import save_file

    save_file({"encoder.nope.weight": np.zeros((2, 2), np.float32)}, str(tmp_path / "bad.safetensors"))
    cases = [
        (["vae", "only_src"], "expected SRC DST, got ['only_src']"),
        (["release", "a", "b", "c"], "expected SRC DST, got ['a', 'b', 'c']"),
        (["t5", "a", "b", "--config.t5.nope=1"], "unknown config key"),
        (["dit", "a", "b"], "--kind is required"),
        (["dit", "a", "b", "--kind=torch"], "kind"),
        (["dit", "migrate", "only_src"], "expected SRC DST"),
        (["clip", "a", "b", "--vision_only"], "Unknown command line flag 'vision_only'"),
        (["check-release", "dst"], "expected DST CASE.npz"),
        (["check-release", str(tmp_path / "dst"), str(tmp_path / "nope.npz")], "case file not found"),
        (["dit", "migrate", str(tmp_path / "nope"), str(tmp_path / "out")], "is not a system checkpoint"),
        (["vae", str(tmp_path / "nope.pt"), str(tmp_path / "out")], "No such file or directory"),
        (["t5", str(tmp_path / "bad.safetensors"), str(tmp_path / "out"), "--config=configs/tiny.py"],
         "encoder.nope.weight"),
    ]
    for argv, want in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and want in err and err.count("\n") == 1, (argv, err)
    assert not (tmp_path / "out").exists()  # a bad input writes nothing


def test_config_overrides_apply_to_the_default_config(tmp_path, capsys):
    """`--config.x=y` without `--config` overrides the converter's default config (paper sizes)."""
    from animegamer_jax.commands import cli as cli_lib

    f, rest = cli_lib.parse_flags(["release", "src", "dst", "--config.dit.num_layers=3", "--allow-pickle"],
                                  cli._release_flags, positional=("SRC", "DST"))
    assert rest == ["src", "dst"] and f.config.dit.num_layers == 3 and f.config.name == "animegamer_2b_7b"
    assert f.allow_pickle  # the old --allow-pickle spelling still works
    # a missing SRC is one line naming it, with the override in effect and nothing written
    assert cli.main(["release", str(tmp_path / "nope"), str(tmp_path / "out"), "--config.dit.num_layers=3"]) == 2
    err = capsys.readouterr().err
    assert "release folder not found" in err and not (tmp_path / "out").exists()


def test_t5_tokenizer_cli(tmp_path, capsys):
    from animegamer_jax.commands.data import main as data_main
    from animegamer_jax.tokenizers.t5_tokenizer import T5Tokenizer

    out = tmp_path / "spm.model"
    assert data_main(["tiny-t5-spiece", f"--out={out}", "--vocab_size=128"]) == 0
    assert f"wrote {out} (" in capsys.readouterr().out and T5Tokenizer(str(out)).vocab_size <= 128
    assert data_main(["tiny-t5-spiece", "extra"]) == 2 and "expected" in capsys.readouterr().err
