"""Which films a data command reads: ``--film=ID=PATH`` arguments, a folder of films, a prepared dataset's films.

Every function returns ``(film_id, path)`` pairs; the film id names the film in labels, datasets and
reports (``data/label_schema.py``).
"""

from __future__ import annotations

import os

from etils import epath

from animegamer_jax.data import datasets

#: file name suffixes :func:`list_film_dir` takes for films (compared lower-case)
VIDEO_EXTENSIONS = (".mp4", ".mkv", ".avi", ".mov", ".webm", ".m4v")


def parse_film_arg(arg: str) -> tuple[str, str]:
    """``"FILM_ID=PATH"`` -> (FILM_ID, PATH); a bare ``"PATH"`` -> (file stem, PATH).

    Raises:
      FileNotFoundError: PATH is a local path that is not a file (missing, or a folder), named with the
        fix, so a command refuses it in one line before any work (a URL is checked when read).
    """
    if "=" in arg and not os.path.exists(arg):
        film_id, path = arg.split("=", 1)
    else:
        path = arg
        film_id = os.path.splitext(os.path.basename(path))[0]
    if "://" not in path and not os.path.isfile(path):
        what = "is a folder, not a video file" if os.path.isdir(path) else "no such video file"
        raise FileNotFoundError(f"--film={arg}: {what}. Fix: pass --film=[ID=]PATH of a video file "
                                f"(or --film_dir=FOLDER)")
    return film_id, path


def list_film_dir(film_dir: str) -> list[tuple[str, str]]:
    """(film_id = file stem, path) of every video file directly in `film_dir`, sorted by name.

    Raises:
      FileNotFoundError: no such folder, or no video file in it (extensions VIDEO_EXTENSIONS).
    """
    root = epath.Path(film_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"{film_dir}: no such folder of films")
    films = [(p.stem, str(p)) for p in sorted(root.iterdir()) if p.suffix.lower() in VIDEO_EXTENSIONS]
    if not films:
        raise FileNotFoundError(f"{film_dir}: no video file ({', '.join(VIDEO_EXTENSIONS)}) in this folder")
    return films


def films_of_dataset(dataset_dir: str) -> list[tuple[str, str]]:
    """(film_id, path) of every film of a prepared dataset (its metadata.json, every split), to label them again.

    Raises FileNotFoundError naming the folder when it holds no prepared dataset.
    """
    try:
        meta = datasets.metadata(dataset_dir)
    except datasets.DatasetError as e:
        raise FileNotFoundError(str(e)) from None
    return [(str(f["film_id"]), str(f["path"])) for f in meta["films"]]
