"""An ``ml_collections`` config as the JSON stored in a system checkpoint (``config/metadata``), and back."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import ml_collections


def config_to_json(config: ml_collections.ConfigDict) -> dict:
    """JSON-safe dict of a config; tuples become lists (restored to tuples by :func:`config_from_json`)."""
    return json.loads(config.to_json_best_effort())


def config_from_json(d: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """Inverse of :func:`config_to_json`: lists become tuples again (every list field of ours is a tuple)."""

    def fix(v: Any) -> Any:
        if isinstance(v, Mapping):
            return ml_collections.ConfigDict({k: fix(x) for k, x in v.items()})
        if isinstance(v, list):
            return tuple(fix(x) for x in v)
        return v

    return fix(dict(d))
