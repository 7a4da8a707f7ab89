"""A check every converter test shares: a corrupted state dict fails with one message naming every bad key."""

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest

from animegamer_jax.weights import ConversionError


def assert_names_bad_keys(convert: Callable[[dict], Any], sd: Mapping[str, Any], *, drop: Iterable[str],
                          put: Mapping[str, Any], expect: Iterable[str]) -> str:
    """Drops the keys ``drop`` from a copy of ``sd``, sets ``put`` (extra keys, or known keys with a
    wrong shape), and asserts that ``convert(bad)`` raises :class:`ConversionError` whose message
    contains every string of ``expect``. Returns the message."""
    bad = {k: v for k, v in sd.items() if k not in set(drop)}
    bad.update(put)
    with pytest.raises(ConversionError) as e:
        convert(bad)
    msg = str(e.value)
    missing = [s for s in expect if s not in msg]
    assert not missing, f"{missing} not in: {msg}"
    return msg
