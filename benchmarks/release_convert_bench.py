"""Peak RSS and wall time of `convert release` on a synthetic release with a large SAT engine file.

Builds, in a scratch folder, a copy of the tiny release fixture (../shared/fixtures/release_tiny)
whose engine file ``mp_rank_00_model_states.pt`` holds a DiT at paper width (hidden 1920, 30 heads,
CogVideoX-2B blocks + AnimeGamer LoRA r64 and flow embedding) with as many layers as make the file
``--gb`` gigabytes (default 8; each paper-width layer is ~0.24 GB in float32), plus the fixture's
own T5 / CLIP / VAE prefixes. The tensors are slices of one file-backed torch storage, so
building the file needs little RAM. Then it runs ``convert release`` in a child process and prints the
child's peak RSS (``ru_maxrss``, which counts resident pages of the memory-mapped source file too)
and wall time, and deletes everything it wrote. The values are random (a repeated 64 MiB block)
so the zstd-compressed output is as large as real weights.

  nice -n 10 .venv/bin/python benchmarks/release_convert_bench.py --gb 8 --scratch /tmp/relbench

Not a test. The backend is CPU (asserted).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from animegamer_jax.models.cogvideox.dit import DiTConfig  # noqa: E402
from animegamer_jax.models.cogvideox.dit_convert import sat_expected_shapes  # noqa: E402
from configs import animegamer_2b_7b  # noqa: E402

FIXTURE = os.path.join(ROOT, "..", "shared", "fixtures", "release_tiny", "release")
ENGINE = "AnimeGamer/VDM_Decoder-Qiqi/10000/mp_rank_00_model_states.pt"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=8.0, help="target engine file size (GB)")
    ap.add_argument("--scratch", default="/tmp/release_convert_bench")
    a = ap.parse_args()
    assert jax.default_backend() == "cpu", jax.default_backend()
    if os.path.exists(a.scratch):
        raise SystemExit(f"{a.scratch} exists; pass a new --scratch (this benchmark deletes what it writes)")
    os.makedirs(a.scratch)
    try:
        paper = animegamer_2b_7b.get_config()
        per_layer = sum(int(torch.Size(s).numel()) for k, s in sat_expected_shapes(
            DiTConfig.from_config(paper.dit, text_length=226), 64).items() if k.startswith("transformer.layers.0."))
        per_layer += sum(int(torch.Size(s).numel()) for k, s in sat_expected_shapes(
            DiTConfig.from_config(paper.dit, text_length=226), 64).items() if ".0.1." in k or "_list.0." in k)
        layers = max(1, int(round(a.gb * 1e9 / (4 * per_layer))))
        paper.dit.num_layers = layers
        cfg = DiTConfig.from_config(paper.dit, text_length=226)
        shapes = sat_expected_shapes(cfg, 64)
        total = sum(int(torch.Size(s).numel()) for s in shapes.values())
        # one file-backed storage backs every tensor (each its own slice): little RAM
        backing = os.path.join(a.scratch, "backing.bin")
        nbytes = 4 * (total + 17_000_000)  # + the paper-width E_a
        block = (np.random.default_rng(0).standard_normal(16 << 20, dtype=np.float32) * 0.02).tobytes()
        with open(backing, "wb") as f:  # random values (zstd cannot shrink them), a 64 MiB block repeated
            for _ in range(nbytes // len(block)):
                f.write(block)
            f.write(block[: nbytes % len(block)])
        store = torch.UntypedStorage.from_file(backing, shared=False, nbytes=nbytes)
        base = torch.tensor([], dtype=torch.float32).set_(store)  # one storage; each tensor its own slice
        src = os.path.join(a.scratch, "release")
        for path in glob.glob(os.path.join(FIXTURE, "**", "*"), recursive=True):
            if os.path.isdir(path) or os.path.relpath(path, FIXTURE) == ENGINE:
                continue
            out = os.path.join(src, os.path.relpath(path, FIXTURE))
            os.makedirs(os.path.dirname(out), exist_ok=True)
            os.symlink(os.path.abspath(path), out)
        tiny = torch.load(os.path.join(FIXTURE, ENGINE), map_location="cpu", weights_only=True)["module"]
        module = {k: v for k, v in tiny.items() if not k.startswith("model.diffusion_model.")
                  or k.startswith("model.diffusion_model.mixins.patch_embed.")
                  and "proj." not in k.split("patch_embed.")[1][:5]}
        # E_a at paper width is part of the DiT engine prefix too (text 4096 -> 1920, ip 768 -> 1920)
        for k in list(module):
            if k.startswith("model.diffusion_model.mixins.patch_embed."):
                del module[k]
        ea = {"text_proj.0.weight": (1920, 4096), "text_proj.0.bias": (1920,), "text_proj.2.weight": (1920, 1920),
              "text_proj.2.bias": (1920,), "ip_proj.0.weight": (1920, 768), "ip_proj.0.bias": (1920,),
              "ip_proj.2.weight": (1920, 1920), "ip_proj.2.bias": (1920,)}
        for n in ("txt", "ip", "output"):
            ea[f"{n}_mix_layer_norm.weight"] = (1920,)
            ea[f"{n}_mix_layer_norm.bias"] = (1920,)
        full = {"model.diffusion_model." + k: s for k, s in shapes.items()}
        full.update({"model.diffusion_model.mixins.patch_embed." + k: s for k, s in ea.items()})
        off = 0
        for k, s in full.items():
            n = int(torch.Size(s).numel())
            module[k] = base[off:off + n].view(*s)
            off += n
        # the MLLM resamplers at the paper rep width (s_a is 1920 wide like the DiT)
        mllm_rel = "AnimeGamer/MLLM-Qiqi/pytorch_model.bin"
        msd = torch.load(os.path.join(FIXTURE, mllm_rel), map_location="cpu", weights_only=True)
        h = msd["llm.base_model.model.model.embed_tokens.weight"].shape[1]
        for k, shp in {"input_resampler.proj.0.weight": (h, 1920), "output_resampler.proj.0.weight": (1920, h),
                       "output_resampler.proj.0.bias": (1920,), "output_resampler.proj.2.weight": (1920, 1920),
                       "output_resampler.proj.2.bias": (1920,)}.items():
            msd[k] = torch.randn(shp) * 0.02
        os.remove(os.path.join(src, mllm_rel))
        torch.save(msd, os.path.join(src, mllm_rel))
        eng = os.path.join(src, ENGINE)
        os.makedirs(os.path.dirname(eng), exist_ok=True)
        t0 = time.perf_counter()
        torch.save({"module": module}, eng)
        del module, base, store
        size = os.path.getsize(eng)
        print(f"synthetic engine file: {size / 1e9:.2f} GB ({layers} paper-width DiT layers, {total / 1e9:.2f} B DiT "
              f"parameters), written in {time.perf_counter() - t0:.0f} s")
        # a config: the fixture's sizes, with the paper-width DiT / E_a of the synthetic file
        cfg_py = os.path.join(a.scratch, "bench_config.py")
        with open(cfg_py, "w") as f:
            f.write("from configs import release_tiny\n\n\ndef get_config():\n    c = release_tiny.get_config()\n"
                    "    c.dit.hidden_size, c.dit.num_layers, c.dit.num_heads, c.dit.head_dim = "
                    f"1920, {layers}, 30, 64\n"
                    "    c.dit.time_embed_dim, c.dit.sample_height, c.dit.sample_width = 512, 60, 90\n"
                    "    c.rep.dim = 1920\n    c.shot_encoder.text_dim = 4096\n    return c\n")
        dst = os.path.join(a.scratch, "system")
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + a.scratch)
        t0 = time.perf_counter()
        # The child reports its own VmHWM (peak RSS of its address space since exec): ru_maxrss of a
        # forked child also counts the parent's pages it held before exec.
        code = ("import sys; from animegamer_jax.commands.convert import main; rc = main(sys.argv[1:]); "
                "st = dict(l.split(':', 1) for l in open('/proc/self/status')); "
                "print('VMHWM', st['VmHWM'].strip(), flush=True); sys.exit(rc)")
        r = subprocess.run([sys.executable, "-c", code, "release", src, dst, "--config", cfg_py],
                           cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        print(r.stdout + r.stderr, end="")
        hwm = [l.split()[1] for l in r.stdout.splitlines() if l.startswith("VMHWM")]
        peak = int(hwm[0]) / 1e6 if hwm else float("nan")  # kB -> GB
        print(f"convert release: exit {r.returncode}, wall {wall:.1f} s, peak RSS {peak:.2f} GB "
              f"(engine file {size / 1e9:.2f} GB; backend cpu)")
    finally:
        shutil.rmtree(a.scratch, ignore_errors=True)
        print(f"deleted {a.scratch}")


if __name__ == "__main__":
    main()
