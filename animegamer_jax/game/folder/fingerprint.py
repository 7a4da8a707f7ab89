"""What made a game, as its game.json ``fingerprint`` records it, and the one rule that matches a saved
game against a command's settings (:func:`same_making`): play ``--continue``, generate's resume, the web app."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from animegamer_jax.config import KEY_CHANGES, config_to_json

#: config fields left out of a game's fingerprint: where things are (out_dir, checkpoint path: the
#: system identity names the weights), or recorded on their own (the game's effective seed and mode)
_NOT_FINGERPRINTED = ("game.out_dir", "game.checkpoint", "game.seed", "game.mode")

#: config fields that say where a game's turns are computed, not what they are: the device mesh, the
#: sharding rules, play's layout (inference/layout.py ``apply_layout``: ``latency`` for play, the config's
#: mesh for generate and the web app). Left out of a game's fingerprint, so a game folder is one save
#: file wherever it was made (:func:`same_making`); games fingerprinted with them still match.
PLACEMENT_FIELDS = ("mesh", "sharding_rules", "game.play_layout", "game.latency_weights")


def game_fingerprint(config, instructions: Sequence[str], seed: int, system_identity: str,
                     characters: Mapping[str, str] | None = None) -> dict:
    """The :func:`fingerprint` of one game: its instructions, seed, mode, the effective config (every
    override included; :data:`_NOT_FINGERPRINTED` left out; config.py ``KEY_CHANGES`` read so that
    games fingerprinted before each key change keep their fingerprint: a removed key put back, an
    added one left out at its as-before value, the ``preview`` section left out unless ``game.decoder``
    uses it), the system identity (a checkpoint's content digest, or the stand-in's label) and, for
    a game with reference images, ``characters`` (name -> image sha256; absent otherwise, so such
    games' fingerprints are as before)."""
    cfg = config_to_json(config)
    for change in KEY_CHANGES:
        sec, _, name = change.key.partition(".")
        if change.fingerprints and not change.added and isinstance(cfg.get(sec), dict) and name not in cfg[sec]:
            cfg[sec][name] = change.before.get(str(cfg.get("name")), change.before[""])
    _drop_fields(cfg, _NOT_FINGERPRINTED + PLACEMENT_FIELDS)
    if str(config.game.get("decoder", "full")) == "full":
        cfg.pop("preview", None)
    for change in KEY_CHANGES:
        sec, _, name = change.key.partition(".")
        if change.fingerprints and change.added and cfg.get(sec, {}).get(name, change.before) == change.before:
            cfg.get(sec, {}).pop(name, None)
    parts = {"instructions": list(instructions), "seed": int(seed), "mode": config.game.mode,
             "system": system_identity, "config": cfg}
    if characters:
        parts["characters"] = dict(characters)
    return fingerprint(parts)


def _drop_fields(cfg: dict, keys: Sequence[str]) -> None:
    """Removes ``keys`` (``"section"`` or ``"section.name"``) from the config dict ``cfg`` in place."""
    for key in keys:
        sec, _, name = key.partition(".")
        if not name:
            cfg.pop(sec, None)
        elif isinstance(cfg.get(sec), dict):
            cfg[sec].pop(name, None)


def same_making(stored: Any, expected: Mapping[str, Any]) -> list[str] | None:
    """The one rule that says whether a saved game was made as ``expected`` (a :func:`game_fingerprint`)
    says: None when it was, else what differs (:func:`fingerprint_changes`; ``["fingerprint differs"]``
    when nothing readable does). Used wherever a saved game is matched: ``play --continue``
    (game/folder/load.py ``load_game``), generate's resume (layout.py ``verify_game``), the web app's saved games.

    ``stored`` is game.json's ``fingerprint``; its :data:`PLACEMENT_FIELDS` are dropped first (games
    saved before they were left out hold them), so a game made by play, generate or the web app, on
    any device layout, matches the same game and settings in any of them.
    """
    if isinstance(stored, dict) and stored.get("sha256") == expected["sha256"]:
        return None
    parts = stored.get("parts") if isinstance(stored, dict) else None
    if not isinstance(parts, dict):
        return ["fingerprint differs"]
    parts = json.loads(json.dumps(parts))
    if isinstance(parts.get("config"), dict):
        _drop_fields(parts["config"], PLACEMENT_FIELDS)
    if fingerprint(parts)["sha256"] == expected["sha256"]:
        return None
    return fingerprint_changes(parts, expected["parts"]) or ["fingerprint differs"]


def fingerprint(parts: Mapping[str, Any]) -> dict:
    """``{"sha256": hex, "parts": parts}``: what made a game (stored in game.json, compared on resume).

    ``parts`` is any JSON-able mapping (:func:`game_fingerprint`: instructions, seed, mode, effective
    config, system identity); the digest is over its canonical JSON (sorted keys).
    """
    parts = json.loads(json.dumps(parts, sort_keys=True))
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return {"sha256": digest, "parts": parts}


def _short(v: Any) -> str:
    s = json.dumps(v)
    return s if len(s) <= 40 else s[:37] + "..."


def fingerprint_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Human-readable differences between two :func:`fingerprint` part mappings (nested keys dotted)."""
    out = []

    def walk(a: Any, b: Any, key: str) -> None:
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            for k in sorted(set(a) | set(b)):
                walk(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{key}.{k}" if key else k)
        elif a != b:
            out.append(f"{key} changed" if key == "instructions" else f"{key} {_short(a)} -> {_short(b)}")

    walk(old, new, "")
    return sorted(out, key=lambda c: c.startswith("config."))  # seed, mode, instructions, system first
