"""The gallery page of a game folder (index.html: the template gallery.html styled by gallery.css, which
the web app shares) and the meters' markup the web app's page draws too."""

from __future__ import annotations

import html
import os
import string
from collections.abc import Mapping
from typing import Any

from animegamer_jax.io import fileio
from animegamer_jax.io import paths
from animegamer_jax.game.run import METER_NAMES

#: the stylesheet of the gallery and the web app (animegamer_jax/web): one look for both (inlined into every
#: index.html, so its text, its first comment too, stays as it was: galleries stay byte-identical)
GALLERY_CSS = open(os.path.join(os.path.dirname(__file__), "gallery.css"), encoding="utf-8").read()
#: the gallery page (index.html), gallery.html beside this module. The project's one template engine is
#: the standard library's ``string.Template``: the page is written by the game core, which has no
#: optional dependency (Jinja2 is not a dependency), and the web app's page is a static file. Fields:
#: ``title`` ``css`` ``config`` ``seed`` ``n_turns`` ``about`` ``characters`` ``turns`` (HTML, escaped
#: by the caller); a literal ``$`` in the file is written ``$$``.
GALLERY_PAGE = string.Template(open(os.path.join(os.path.dirname(__file__), "gallery.html"), encoding="utf-8").read())


def meters_html(meters: Mapping[str, int], deltas: Mapping[str, int] | None = None) -> str:
    """The meters as bars (``gallery.css`` classes; the web app's app.js draws the same markup).

    Args:
      meters: ``{"social", "entertainment", "stamina"}`` values in 0..100.
      deltas: optional change of each meter this turn (meter units), shown as ``+5`` / ``-10``.
    """
    cells = []
    for name in METER_NAMES:
        v = int(meters[name])
        d = "" if deltas is None else f"{int(deltas[name]):+d}"
        cls = "" if deltas is None else ("up" if deltas[name] > 0 else "down" if deltas[name] < 0 else "")
        cells.append(f'<span class="name">{name}</span><span class="bar" role="meter" aria-valuemin="0" '
                     f'aria-valuemax="100" aria-valuenow="{v}" aria-label="{name}"><span class="fill {name}" '
                     f'style="width:{max(0, min(100, v))}%"></span></span><span class="value">{v}</span>'
                     f'<span class="delta {cls}">{d}</span>')
    return f'<div class="meters">{"".join(cells)}</div>'


def index_html(game_id: str, record: Mapping[str, Any]) -> str:
    """The gallery page (index.html) of a game: :data:`GALLERY_PAGE` filled from ``record`` (game.json's
    dict): one ``<figure>`` per turn (clip, instruction, states, :func:`meters_html`), played in order."""
    items = []
    start = record.get("meter_start")
    prev = None if start is None else dict.fromkeys(METER_NAMES, int(start))
    for t in record["turns"]:
        m, st = t["meters"], t["states"]
        deltas = None if prev is None else {k: int(m[k]) - int(prev[k]) for k in METER_NAMES}
        prev = m
        items.append(
            f'<figure class="turn"><video src="{html.escape(t["video"])}" controls muted playsinline '
            f'preload="auto" class="pixelated"></video>'
            f"<figcaption><b>Turn {t['turn'] + 1}</b>: {html.escape(t['instruction'])}"
            f'<div class="states">ML {st["ML"]} SC {st["SC"]:+d} ET {st["ET"]:+d} ST {st["ST"]:+d}</div>'
            f"{meters_html(m, deltas)}</figcaption></figure>")
    return GALLERY_PAGE.substitute(
        title=html.escape(game_id), css=GALLERY_CSS, config=html.escape(str(record["config"])), seed=record["seed"],
        n_turns=len(record["turns"]), about=about_html(record), characters=characters_html(record),
        turns="".join(items))


def characters_html(record: Mapping[str, Any]) -> str:
    """The gallery's line of a game's reference images (game.json ``characters``); "" without any."""
    items = "".join(f'<figure class="character"><img src="{html.escape(c["image"])}" alt="{html.escape(c["name"])}" '
                    f'height="64"><figcaption>{html.escape(c["name"])}</figcaption></figure>'
                    for c in record.get("characters", []))
    return f'<div class="characters">characters: {items}</div>\n' if items else ""


def about_html(record: dict) -> str:
    """The gallery's line on the system that played the game: its label and, when its checkpoint
    has one, its description (game.json ``system``, ``system_description``); "" when neither."""
    parts = [html.escape(str(record.get(k) or "")) for k in ("system", "system_description")]
    if not any(parts):
        return ""
    return f'<p class="muted" id="about">system: {". ".join(p for p in parts if p)}</p>'



def write_index(game_dir: str, game_id: str, rec: Mapping[str, Any]) -> None:
    """Writes ``game_dir``'s index.html (atomically) for game.json content ``rec``."""
    rec = dict(rec, video="game.mp4", contact_sheet="contact_sheet.png")
    fileio.write_text_atomic(paths.join(game_dir, "index.html"), index_html(game_id, rec))
