"""The ``python -m animegamer_jax.convert <kind>`` dispatcher reaches every converter's CLI."""

import importlib

import pytest

from animegamer_jax.convert import __main__ as cli


def test_every_kind_has_a_cli():
    for kind, module in cli.KINDS.items():
        assert callable(importlib.import_module(module).main), kind


def test_unknown_kind_and_help(capsys):
    assert cli.main(["bogus"]) == 2
    assert "unknown kind 'bogus'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["vae", "--help"])
    assert e.value.code == 0
    assert "3d-vae.pt" in capsys.readouterr().out
