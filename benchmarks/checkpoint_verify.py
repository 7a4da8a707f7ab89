"""Time the system checkpoint integrity check (``verify_checkpoint``) on a full-size-like layout.

    python benchmarks/checkpoint_verify.py                  # 28.6 GB (bf16 paper system), sparse files
    python benchmarks/checkpoint_verify.py --real_mb 512    # + sha256 throughput on real (random) bytes

The layout mimics what orbax writes for the paper system in bf16 (Mistral-7B MLLM 14.5 GB, DiT 3.4 GB,
T5-XXL encoder 9.5 GB, CLIP ViT-L 0.8 GB, VAE 0.4 GB, shot encoder 0.1 GB): per component the small
metadata files orbax writes and OCDBT data files of at most ``MAX_DATA_FILE`` bytes (orbax's local-disk
target size).
The data files are *sparse* (no disk space used, reads return zeros), so the figures are the
check's CPU and per-file cost: the fast check's handful of seeks per file, and the full check's
hashing throughput. On real disks the full check is bound by read bandwidth as well; ``--real_mb``
measures hashing a real file held in the page cache, for comparison.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from animegamer_jax.io import fileio  # noqa: E402
from animegamer_jax.checkpoint import integrity  # noqa: E402

GB = 10**9
#: component -> bytes in bf16 (parameter counts of the paper system x 2)
COMPONENTS = {"mllm": 14.5 * GB, "dit": 3.4 * GB, "t5": 9.5 * GB, "clip": 0.8 * GB, "vae": 0.4 * GB,
              "shot_encoder": 0.1 * GB}
MAX_DATA_FILE = 2**31


def build_layout(root: str, scale: float) -> int:
    """Writes the sparse layout under ``root``; returns the total bytes."""
    total = 0
    for name in ("config", "manifest"):
        os.makedirs(os.path.join(root, name))
        open(os.path.join(root, name, "metadata"), "w").write("{}" * 200)
    for f in ("_CHECKPOINT_METADATA", "commit_success.txt"):
        open(os.path.join(root, f), "w").write("x" * 300)
    for comp, size in COMPONENTS.items():
        d = os.path.join(root, comp)
        os.makedirs(os.path.join(d, "d"))
        os.makedirs(os.path.join(d, "array_metadatas"))
        for f, n in (("_METADATA", 200_000), ("_sharding", 50_000), ("manifest.ocdbt", 4_000),
                     ("commit_success.txt", 80), ("array_metadatas/process_0", 100_000)):
            with open(os.path.join(d, f), "wb") as fh:
                fh.write(os.urandom(n))
        left, k = int(size * scale), 0
        while left > 0:
            n = min(left, MAX_DATA_FILE)
            with open(os.path.join(d, "d", f"{k:032x}"), "wb") as fh:
                fh.write(os.urandom(4096))  # a real header, then a sparse tail
                fh.truncate(n)
            left -= n
            k += 1
            total += n
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the full size")
    ap.add_argument("--real_mb", type=int, default=0, help="also time sha256 of a real file of this size")
    ap.add_argument("--dir", default=None, help="where to build the layout (default: a temp folder)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = os.path.join(tmp, "system")
        total = build_layout(root, args.scale)
        nfiles = sum(1 for _ in fileio.walk_files(root))
        print(f"layout: {nfiles} files, {total / GB:.1f} GB (sparse data files), cpus {os.cpu_count()}, "
              f"load {os.getloadavg()[0]:.1f}")
        t0 = time.perf_counter()
        integrity.write_integrity(root)
        t_save = time.perf_counter() - t0
        print(f"save_system's integrity.json (full sha256 of every file): {t_save:.2f} s "
              f"({total / GB / t_save:.2f} GB/s)")
        for mode in ("fast", "full", "fast"):
            integrity._VERIFIED.clear()
            t0 = time.perf_counter()
            integrity.verify_checkpoint(root, mode)
            dt = time.perf_counter() - t0
            print(f"verify {mode}: {dt:.3f} s" + (f" ({total / GB / dt:.2f} GB/s)" if mode == "full" else ""))
        if args.real_mb:
            path = os.path.join(tmp, "real.bin")
            with open(path, "wb") as fh:
                for _ in range(args.real_mb):
                    fh.write(os.urandom(2**20))
            fileio.sha256_file(path)  # into the page cache
            t0 = time.perf_counter()
            fileio.sha256_file(path)
            dt = time.perf_counter() - t0
            print(f"sha256 of {args.real_mb} MiB real bytes (page cache): {dt:.2f} s "
                  f"({args.real_mb * 2**20 / GB / dt:.2f} GB/s)")


if __name__ == "__main__":
    main()
