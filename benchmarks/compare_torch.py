"""Side-by-side CPU timing at the tiny config: our jitted JAX pieces vs the torch references, in one run.

    python benchmarks/compare_torch.py [--repeats 5] [--threads 2]

Same sizes on both sides (configs/tiny.py), weights moved through OUR converters so outputs match:
  DiT forward      CogVideoXDiT (jit)  vs diffusers CogVideoXTransformer3DModel (CFG batch 2, fp32)
  VAE decode       CogVideoXVAE.decode vs diffusers AutoencoderKLCogVideoX.decode (if the JAX VAE exists)
  Mistral          prefill + greedy decode with KV cache (jit per step) vs transformers
                   MistralForCausalLM.generate(do_sample=False, use_cache=True)
  game turn        MLLM prefill/decode + pass B + N CFG DiT steps + VAE decode, composed from the
                   same pieces on both sides (there is no torch AnimeGamer engine to time)
Prints median wall seconds per call after one warm-up (compile excluded, reported apart), the ratio
torch / JAX (> 1: JAX faster) and the max |difference| of the outputs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from flax import nnx  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def _median(fn, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def bench_dit(cfg, repeats, tmp):
    from diffusers import CogVideoXTransformer3DModel

    from animegamer_jax.convert import cogvideox_dit as conv
    from animegamer_jax.models.cogvideox_dit import DiTConfig

    q = cfg.rep.num_text_tokens + cfg.rep.num_image_tokens
    d = cfg.dit
    dc = DiTConfig.from_config(d, text_length=q)
    dc = DiTConfig(**{**dc.__dict__, "lora_rank": 0, "dtype": "float32", "param_dtype": "float32",
                      "final_norm_eps": 1e-5})
    torch.manual_seed(0)
    tm = CogVideoXTransformer3DModel(
        num_attention_heads=d.num_heads, attention_head_dim=d.head_dim, in_channels=d.in_channels,
        out_channels=d.out_channels, time_embed_dim=d.time_embed_dim, text_embed_dim=d.hidden_size,
        num_layers=d.num_layers, sample_width=d.sample_width, sample_height=d.sample_height,
        sample_frames=(d.num_latent_frames - 1) * 4 + 1, patch_size=d.patch_size, max_text_seq_length=q,
        use_rotary_positional_embeddings=False).eval()
    with torch.no_grad():
        for p in tm.parameters():
            p.add_(0.05 * torch.randn_like(p))
    tm.save_pretrained(os.path.join(tmp, "dit"))
    params, extras = conv.from_diffusers(conv.read_torch_state_dict(os.path.join(tmp, "dit")), dc)
    ours = conv.build_model(dc, params, keep_init=("flow_embed",))
    x = np.random.RandomState(0).randn(2, d.num_latent_frames, d.in_channels, d.sample_height, d.sample_width).astype(np.float32)
    txt = np.random.RandomState(1).randn(2, q, d.hidden_size).astype(np.float32)
    t = np.array([999, 999])
    with torch.no_grad():
        cond = tm.patch_embed.text_proj(torch.tensor(txt)).numpy()
    graphdef, state = nnx.split(ours)
    fwd = jax.jit(lambda s, x, c, t: nnx.merge(graphdef, s)(x, c, t, None))
    args = (state, jnp.asarray(x), jnp.asarray(cond), jnp.asarray(t))
    t0 = time.perf_counter()
    out_j = np.asarray(jax.block_until_ready(fwd(*args)))
    compile_s = time.perf_counter() - t0
    tx, tt, ttxt = torch.tensor(x), torch.tensor(t), torch.tensor(txt)

    def run_t():
        with torch.no_grad():
            return tm(tx, ttxt, tt).sample

    out_t = run_t().numpy()
    jt = _median(lambda: jax.block_until_ready(fwd(*args)), repeats)
    tt_s = _median(run_t, repeats)
    return {"jax_s": jt, "torch_s": tt_s, "compile_s": compile_s, "max_abs_diff": float(np.abs(out_j - out_t).max()),
            "fns": (lambda: jax.block_until_ready(fwd(*args)), run_t)}


def bench_vae(cfg, repeats, tmp):
    from diffusers import AutoencoderKLCogVideoX

    from animegamer_jax.convert import cogvideox_vae as vconv
    from animegamer_jax.models.cogvideox_vae import VAEConfig, diffusers_plan

    v = cfg.vae
    torch.manual_seed(0)
    tm = AutoencoderKLCogVideoX(latent_channels=v.latent_channels, block_out_channels=tuple(v.block_out_channels),
                                layers_per_block=v.layers_per_block, norm_num_groups=v.norm_num_groups).eval()
    tm.save_pretrained(os.path.join(tmp, "vae"))
    vcfg = VAEConfig.from_config(cfg.vae)
    ours = vconv.build_vae(vcfg, vconv.diffusers_to_state(vconv.load_diffusers_state_dict(os.path.join(tmp, "vae")), vcfg))
    z = np.random.RandomState(0).randn(1, cfg.dit.num_latent_frames, v.latent_channels, cfg.dit.sample_height,
                                       cfg.dit.sample_width).astype(np.float32)
    graphdef, state = nnx.split(ours)
    # diffusers' framewise plan (pairs of latents) so both sides compute the same GroupNorm chunks
    plan = diffusers_plan(z.shape[1], 2)
    dec = jax.jit(lambda s, z: nnx.merge(graphdef, s).decode(z, plan))
    t0 = time.perf_counter()
    out_j = np.asarray(jax.block_until_ready(dec(state, jnp.asarray(z))))
    compile_s = time.perf_counter() - t0
    tz = torch.tensor(z).permute(0, 2, 1, 3, 4)

    def run_t():
        with torch.no_grad():
            return tm.decode(tz).sample

    out_t = run_t().permute(0, 2, 3, 4, 1).numpy()
    jt = _median(lambda: jax.block_until_ready(dec(state, jnp.asarray(z))), repeats)
    tt_s = _median(run_t, repeats)
    diff = float(np.abs(out_j - out_t).max()) if out_j.shape == out_t.shape else float("nan")
    return {"jax_s": jt, "torch_s": tt_s, "compile_s": compile_s, "max_abs_diff": diff,
            "fns": (lambda: jax.block_until_ready(dec(state, jnp.asarray(z))), run_t)}


def bench_mistral(cfg, repeats, tmp, prompt_len: int, new_tokens: int):
    from transformers import MistralConfig as HFMistralConfig
    from transformers import MistralForCausalLM

    from animegamer_jax.convert import mistral as mconv
    from animegamer_jax.models import mistral as mst

    m = cfg.mllm
    hc = HFMistralConfig(vocab_size=m.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                         num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
                         num_key_value_heads=m.num_kv_heads, head_dim=m.head_dim, sliding_window=None,
                         max_position_embeddings=m.max_position_embeddings, rope_theta=m.rope_theta)
    torch.manual_seed(0)
    tm = MistralForCausalLM(hc).eval()
    tm.save_pretrained(os.path.join(tmp, "mistral"))
    mcfg, state = mconv.convert_hf_checkpoint(os.path.join(tmp, "mistral"), dtype="float32", param_dtype="float32")
    ours = nnx.merge(nnx.graphdef(nnx.eval_shape(lambda: mst.Mistral(mcfg, rngs=nnx.Rngs(0)))), state)
    ids = np.random.RandomState(0).randint(3, 32000, (1, prompt_len))

    def run_j():
        toks, _ = mst.greedy_generate(ours, new_tokens, input_ids=jnp.asarray(ids))
        return np.asarray(jax.block_until_ready(toks))

    t0 = time.perf_counter()
    toks_j = run_j()
    compile_s = time.perf_counter() - t0
    tids = torch.tensor(ids)

    def run_t():
        with torch.no_grad():
            return tm.generate(tids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                               use_cache=True, pad_token_id=0)[:, prompt_len:]

    toks_t = run_t().numpy()

    def pass_b_t():
        with torch.no_grad():
            return tm.model(tids).last_hidden_state

    pb = jax.jit(lambda s, x: nnx.merge(nnx.graphdef(ours), s)(x, return_logits=False).hidden)
    st = nnx.state(ours)
    jax.block_until_ready(pb(st, jnp.asarray(ids)))
    jt = _median(run_j, repeats)
    tt_s = _median(run_t, repeats)
    return {"jax_s": jt, "torch_s": tt_s, "compile_s": compile_s,
            "tokens_equal": bool((toks_j == toks_t).all()),
            "fns": (run_j, run_t),
            "pass_b": (lambda: jax.block_until_ready(pb(st, jnp.asarray(ids))), pass_b_t)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/tiny.py")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (XLA CPU uses all cores)")
    args = ap.parse_args(argv)
    import tempfile

    from animegamer_jax.config import load_config
    from benchmarks.turn_pieces import turn_length

    torch.set_num_threads(args.threads)
    cfg = load_config(args.config)
    tmp = tempfile.mkdtemp(prefix="compare_torch_")
    rows, errors = {}, {}
    for name, fn in (("DiT forward (CFG batch 2)", lambda: bench_dit(cfg, args.repeats, tmp)),
                     ("VAE decode", lambda: bench_vae(cfg, args.repeats, tmp)),
                     (f"Mistral prefill {turn_length(cfg)} + {cfg.mllm.max_new_tokens} greedy tokens",
                      lambda: bench_mistral(cfg, args.repeats, tmp, turn_length(cfg), int(cfg.mllm.max_new_tokens)))):
        try:
            rows[name] = fn()
            print(f"{name}: done", flush=True)
        except Exception as e:  # report and go on: one missing piece should not hide the others
            errors[name] = f"{type(e).__name__}: {e}"[:300]
            print(f"{name}: skipped ({errors[name]})", flush=True)
    # one game turn = MLLM (generate + pass B) + steps x DiT(CFG) + VAE decode, same composition on both sides
    steps = int(cfg.diffusion.num_sampling_steps)
    dit = next((v for k, v in rows.items() if k.startswith("DiT")), None)
    vae = rows.get("VAE decode")
    mis = next((v for k, v in rows.items() if k.startswith("Mistral")), None)
    if dit and mis:
        def turn(side):
            mis["fns"][side]()
            mis["pass_b"][side]()
            for _ in range(steps):
                dit["fns"][side]()
            if vae:
                vae["fns"][side]()

        jt = _median(lambda: turn(0), max(1, args.repeats // 2))
        tt_s = _median(lambda: turn(1), max(1, args.repeats // 2))
        rows[f"game turn ({steps} steps{', VAE' if vae else ', no VAE'})"] = {"jax_s": jt, "torch_s": tt_s}
    print(f"\nCPU: {os.cpu_count()} cores, torch {torch.__version__} ({args.threads} threads), jax {jax.__version__}; "
          f"config {cfg.name}; median of {args.repeats}\n")
    print("| piece | JAX s | torch s | torch/JAX | JAX compile s | check |\n|---|---:|---:|---:|---:|---|")
    for k, v in rows.items():
        check = (f"max abs diff {v['max_abs_diff']:.1e}" if "max_abs_diff" in v else
                 f"tokens equal: {v['tokens_equal']}" if "tokens_equal" in v else "")
        comp = f"{v['compile_s']:.2f}" if "compile_s" in v else ""
        print(f"| {k} | {v['jax_s']:.4f} | {v['torch_s']:.4f} | {v['torch_s'] / v['jax_s']:.2f} | {comp} | {check} |")
    for k, e in errors.items():
        print(f"| {k} | | | | | skipped: {e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
