"""Bring your own character: reference images for the turns that name a character.

``--character NAME=IMAGE`` (play, generate; the web app's upload) gives character ``NAME`` the look
of ``IMAGE``: every turn whose instruction's Character field equals ``NAME`` (case-insensitive,
inference/instructions.py ``Turn.character``) is decoded with that image as the DiT's reference (training phase
r, models/cogvideox/reference.py); other turns decode exactly as without it. The image is read and
checked here (:func:`load_character`, :func:`character_from_bytes`: a file of at most
:data:`MAX_BYTES`, an image PIL reads, each side :data:`MIN_SIDE`..:data:`MAX_SIDE` px), kept as
PNG bytes of its RGB pixels (the game folder's ``characters/<NAME>.png``), and fitted to the clip
size (:func:`fit_image`: resized to cover, then centre-cropped) when the engine VAE-encodes it once
per game.

Every problem raises :class:`CharacterError`, one line naming the flag value or file and the fix.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from PIL import Image, UnidentifiedImageError

from animegamer_jax.io import fileio
from animegamer_jax.inference.instructions import is_plain_name

#: reference image limits: file bytes, and the shorter / longer side in pixels
MAX_BYTES = 50 * 1024 * 1024
MIN_SIDE = 32
MAX_SIDE = 8192
#: the game folder's subfolder of reference images (``characters/<NAME>.png``)
FOLDER = "characters"


class CharacterError(ValueError):
    """A bad ``--character`` value or reference image; the message is one line with the fix."""


@dataclasses.dataclass(frozen=True)
class Character:
    """One character's reference: ``name`` as given, ``png`` the RGB image as PNG bytes."""

    name: str
    png: bytes = dataclasses.field(repr=False)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.png).hexdigest()

    @property
    def file(self) -> str:
        """Its path inside a game folder."""
        return f"{FOLDER}/{self.name}.png"

    def pixels(self) -> np.ndarray:
        """The image, uint8 ``[H, W, 3]``."""
        with Image.open(io.BytesIO(self.png)) as im:
            return np.asarray(im.convert("RGB"), np.uint8)


def check_name(name: str, where: str) -> str:
    """``name`` if it can name a character (and its file ``characters/<NAME>.png``), else CharacterError."""
    if not is_plain_name(name) or "=" in name or ";" in name:
        raise CharacterError(f"{where}: {name!r} is not a usable character name. Fix: a name as the script's "
                             f"'Character:' field writes it (no '/', '=', ';', leading '.' or control characters)")
    return name


def rgb8(im: Image.Image) -> Image.Image:
    """8-bit RGB of an image of any PIL mode: 16- and 32-bit integer greyscale (``I;16``, ``I;16B``, ``I``,
    ...; PIL's own conversion would clip every value over 255 to white) keep their top 8 of 16 bits
    (value >> 8, ``I`` read as 16-bit, clipped to 0..65535); every other mode (``L``, ``LA``, ``P``,
    ``RGBA``, ``CMYK``, ...) through PIL's ``convert("RGB")`` (alpha dropped, palettes looked up)."""
    if im.mode.startswith("I;16") or im.mode == "I":
        grey = np.clip(np.asarray(im, np.int64), 0, 65535) >> 8
        return Image.fromarray(grey.astype(np.uint8), "L").convert("RGB")
    rgb = im.convert("RGB")
    rgb.load()
    return rgb


def check_used(characters: Sequence[Character], turns: Iterable, where: str) -> None:
    """Refuses a ``--character`` NAME that no turn of ``turns`` (inference/instructions.py ``Turn``)
    names in its Character field (case-insensitive, as :func:`named` matches): its image would never be
    used, most likely a misspelt name.

    Raises:
      CharacterError: one line naming the unused name, the game (``where``) and the names it uses.
    """
    fields = {t.character.strip().casefold(): t.character.strip() for t in turns}
    for c in characters:
        if c.name.casefold() not in fields:
            raise CharacterError(f"--character {c.name}: no turn of {where} names the character {c.name!r} (its "
                                 f"Character fields: {', '.join(sorted(set(fields.values()))) or 'none'}). Fix: "
                                 f"name the character as the script's 'Character:' field does, or drop it")


def character_from_bytes(name: str, data: bytes, where: str) -> Character:
    """Checks and decodes one reference image (module docstring); ``where`` names it in errors.

    Raises:
      CharacterError: over :data:`MAX_BYTES`, not an image PIL reads, a side under :data:`MIN_SIDE`
        or over :data:`MAX_SIDE` px.
    """
    check_name(name, where)
    if len(data) > MAX_BYTES:
        raise CharacterError(_too_big(where, len(data)))
    try:
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size  # from the header: the size is checked before the pixels are decoded
            if min(w, h) < MIN_SIDE or max(w, h) > MAX_SIDE:
                raise CharacterError(f"{where}: the image is {w}x{h} px; a reference needs {MIN_SIDE} to "
                                     f"{MAX_SIDE} px a side. Fix: pass a picture of the character of a "
                                     f"usable size")
            rgb = rgb8(im)
    except CharacterError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError, SyntaxError) as e:
        why = "is not an image" if isinstance(e, UnidentifiedImageError) else f"cannot be decoded ({e})"
        raise CharacterError(f"{where}: the file {why}. Fix: pass a PNG or JPEG picture of the character") from None
    buf = io.BytesIO()
    rgb.save(buf, format="PNG")
    return Character(name, buf.getvalue())


def load_character(value: str) -> Character:
    """A ``--character NAME=IMAGE`` value (IMAGE a local path or URL) as a checked :class:`Character`.

    Raises:
      CharacterError: no ``=``, an empty or unusable NAME, an unreadable file, or a bad image.
    """
    name, sep, path = value.partition("=")
    name, path = name.strip(), path.strip()
    if not sep or not name or not path:
        raise CharacterError(f"--character {value!r}: expected NAME=IMAGE. Fix: e.g. "
                             f"--character Bunny=data/characters/Bunny/ref.png")
    where = f"--character {name}={path}"
    check_name(name, where)
    try:
        if not fileio.isfile(path):
            raise FileNotFoundError(path)
        size = fileio.size(path)
        data = fileio.read_bytes(path) if size <= MAX_BYTES else None
    except (OSError, ValueError) as e:
        raise CharacterError(f"{where}: cannot read the image ({type(e).__name__}). Fix: pass an existing, "
                             f"readable image file") from None
    if data is None:  # not read: refused on its size
        raise CharacterError(_too_big(where, size))
    return character_from_bytes(name, data, where)


def _too_big(where: str, size: int) -> str:
    return (f"{where}: the image is {size / 2**20:.1f} MB, over the {MAX_BYTES / 2**20:g} MB limit. Fix: pass a "
            f"smaller image (a few hundred pixels a side is plenty)")


def load_characters(values: Iterable[str]) -> tuple[Character, ...]:
    """Every ``--character`` value, checked; a NAME given twice (case-insensitive) is an error."""
    out: dict[str, Character] = {}
    for v in values or ():
        c = load_character(v)
        if c.name.casefold() in out:
            raise CharacterError(f"--character {c.name}: given twice. Fix: one image per character")
        out[c.name.casefold()] = c
    return tuple(out.values())


def named(characters: Sequence[Character], character_field: str) -> Character | None:
    """The character a turn names: the one whose name equals the turn's Character field
    (``Turn.character``, case-insensitive), else None."""
    key = character_field.strip().casefold()
    for c in characters:
        if c.name.casefold() == key:
            return c
    return None


def fit_image(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 ``[H', W', 3]`` -> uint8 ``[height, width, 3]``: resized (bicubic) so it covers the clip,
    then centre-cropped to it."""
    h0, w0 = pixels.shape[:2]
    scale = max(height / h0, width / w0)
    nh, nw = max(height, round(h0 * scale)), max(width, round(w0 * scale))
    im = Image.fromarray(pixels).resize((nw, nh), Image.BICUBIC)
    top, left = (nh - height) // 2, (nw - width) // 2
    return np.asarray(im.crop((left, top, left + width, top + height)), np.uint8)


def record_entries(characters: Sequence[Character], instructions: Sequence[str] = ()) -> list[dict]:
    """game.json's ``characters`` list: name, image file, sha256 (and nothing for no characters)."""
    return [{"name": c.name, "image": c.file, "sha256": c.sha256} for c in characters]


def fingerprint_part(characters: Sequence[Character]) -> dict[str, str]:
    """name -> image sha256 (a game's fingerprint holds it only when it has characters)."""
    return {c.name: c.sha256 for c in characters}


def files_of(characters: Sequence[Character]) -> dict[str, bytes]:
    """The game folder's files of ``characters``: ``characters/<NAME>.png`` -> PNG bytes."""
    return {c.file: c.png for c in characters}


def from_record(entries: Sequence[Mapping], read) -> tuple[Character, ...]:
    """The characters of a saved game (game.json ``characters``); ``read(name)`` returns a file's bytes.

    Raises:
      CharacterError: a missing or changed image (sha256).
    """
    out = []
    for e in entries or ():
        try:
            data = read(e["image"])
        except (OSError, KeyError, TypeError):
            raise CharacterError(f"the game's reference image {e.get('image')!r} is missing") from None
        if hashlib.sha256(data).hexdigest() != e.get("sha256"):
            raise CharacterError(f"the game's reference image {e['image']!r} was changed since it was saved")
        out.append(Character(str(e["name"]), data))
    return tuple(out)
