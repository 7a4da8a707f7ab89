"""The side-by-side pieces (JAX vs the torch references) that the benchmark runner times.

    python -m benchmarks compare ...     # the runner: equal threads, ABAB rounds, sizes, JSON (benchmarks/__main__.py)
    python benchmarks/compare_torch.py   # the same runner, tiny + medium sizes

Each ``bench_*`` builds both sides at the sizes of the config it is given, with the weights moved
from the torch model through OUR converters (so outputs must agree), and returns the two callables
(``"fns"``: JAX, torch), the JAX compile time and the output check:
  bench_dit       CogVideoXDiT (jit)  vs diffusers CogVideoXTransformer3DModel (CFG batch 2, fp32)
  bench_vae       CogVideoXVAE.decode vs diffusers AutoencoderKLCogVideoX.decode (diffusers' chunk plan)
  bench_attention models/attention.py dot_product_attention (the "auto" kernel; every CPU kernel
                  timed once more in "variants") vs torch scaled_dot_product_attention, at the DiT's
                  joint sequence of the config (batch 2, no mask) or a causal GQA prompt
  bench_mistral   greedy generate with KV cache (jit per step) vs transformers
                  MistralForCausalLM.generate(do_sample=False, use_cache=True); ``"pass_b"``: the
                  prompt forward without logits on both sides (prefill)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from flax import nnx  # noqa: E402

from animegamer_jax.weights import load_state_dict  # noqa: E402
from animegamer_jax.models import attention  # noqa: E402
from animegamer_jax.models.cogvideox import dit_convert, vae_convert  # noqa: E402
from animegamer_jax.models.cogvideox.dit import DiTConfig  # noqa: E402
from animegamer_jax.models.cogvideox.vae import VAEConfig  # noqa: E402
from animegamer_jax.models.cogvideox.vae_tiling import diffusers_plan  # noqa: E402
from animegamer_jax.models.mistral import convert as mistral_convert  # noqa: E402
from animegamer_jax.models.mistral import model as mistral_model  # noqa: E402
from benchmarks.common import median_seconds  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def bench_dit(cfg, repeats, tmp):
    from diffusers import CogVideoXTransformer3DModel  # optional

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
    params, extras = dit_convert.from_diffusers(load_state_dict(os.path.join(tmp, "dit")), dc)
    ours = dit_convert.build_model(dc, params, keep_init=("flow_embed",))
    x = np.random.RandomState(0).randn(2, d.num_latent_frames, d.in_channels, d.sample_height,
                                       d.sample_width).astype(np.float32)
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
    jt = median_seconds(lambda: jax.block_until_ready(fwd(*args)), repeats)
    tt_s = median_seconds(run_t, repeats)
    return {"jax_s": jt, "torch_s": tt_s, "compile_s": compile_s, "max_abs_diff": float(np.abs(out_j - out_t).max()),
            "fns": (lambda: jax.block_until_ready(fwd(*args)), run_t)}


def bench_vae(cfg, repeats, tmp):
    from diffusers import AutoencoderKLCogVideoX  # optional

    v = cfg.vae
    torch.manual_seed(0)
    tm = AutoencoderKLCogVideoX(latent_channels=v.latent_channels, block_out_channels=tuple(v.block_out_channels),
                                layers_per_block=v.layers_per_block, norm_num_groups=v.norm_num_groups).eval()
    tm.save_pretrained(os.path.join(tmp, "vae"))
    vcfg = VAEConfig.from_config(cfg.vae)
    ours = vae_convert.build_vae(vcfg, vae_convert.diffusers_to_state(load_state_dict(os.path.join(tmp, "vae")), vcfg))
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
    jt = median_seconds(lambda: jax.block_until_ready(dec(state, jnp.asarray(z))), repeats)
    tt_s = median_seconds(run_t, repeats)
    diff = float(np.abs(out_j - out_t).max()) if out_j.shape == out_t.shape else float("nan")
    return {"jax_s": jt, "torch_s": tt_s, "compile_s": compile_s, "max_abs_diff": diff,
            "fns": (lambda: jax.block_until_ready(dec(state, jnp.asarray(z))), run_t)}


def bench_attention(b: int, l: int, n: int, kh: int, h: int, causal: bool, repeats: int):
    """q [b, l, n, h], k/v [b, l, kh, h] fp32 random; JAX "auto" (jitted) vs torch SDPA (K/V heads
    repeated to n, as transformers' SDPA path does). Returns the callables, the kernel "auto" chose,
    the max |difference| and "variants": median seconds of each JAX kernel that runs on CPU."""
    r = np.random.RandomState(0)
    q = r.randn(b, l, n, h).astype(np.float32)
    k, v = (r.randn(b, l, kh, h).astype(np.float32) for _ in range(2))
    mask = attention.causal_mask() if causal else None
    qj, kj, vj = map(jnp.asarray, (q, k, v))

    def jitted(impl):
        return jax.jit(lambda q, k, v: attention.dot_product_attention(q, k, v, mask=mask, implementation=impl))

    fns = {impl: jitted(impl) for impl in ("auto", "reference", "dense", "xla", "blockwise")}
    outs = {impl: np.asarray(jax.block_until_ready(f(qj, kj, vj))) for impl, f in fns.items()}
    qt, kt, vt = (torch.tensor(x).transpose(1, 2) for x in (q, k, v))
    kt, vt = kt.repeat_interleave(n // kh, 1), vt.repeat_interleave(n // kh, 1)

    def run_t():
        with torch.no_grad():
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    out_t = run_t().transpose(1, 2).numpy()
    variants = {impl: median_seconds(lambda f=f: jax.block_until_ready(f(qj, kj, vj)), max(repeats, 3))
                for impl, f in fns.items() if impl != "auto"}
    return {"fns": (lambda: jax.block_until_ready(fns["auto"](qj, kj, vj)), run_t),
            "chosen": attention.resolve("auto", qj, kj, mask=mask), "variants": variants,
            "max_abs_diff": max(float(np.abs(o - out_t).max()) for o in outs.values())}


def bench_mistral(cfg, repeats, tmp, prompt_len: int, new_tokens: int):
    from transformers import MistralConfig as HFMistralConfig  # optional
    from transformers import MistralForCausalLM  # optional

    m = cfg.mllm
    hc = HFMistralConfig(vocab_size=m.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                         num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads,
                         num_key_value_heads=m.num_kv_heads, head_dim=m.head_dim, sliding_window=None,
                         max_position_embeddings=m.max_position_embeddings, rope_theta=m.rope_theta)
    torch.manual_seed(0)
    tm = MistralForCausalLM(hc).eval()
    tm.save_pretrained(os.path.join(tmp, "mistral"))
    mcfg, state = mistral_convert.convert_hf_checkpoint(os.path.join(tmp, "mistral"), dtype="float32",
                                                        param_dtype="float32")
    ours = nnx.merge(nnx.graphdef(nnx.eval_shape(lambda: mistral_model.Mistral(mcfg, rngs=nnx.Rngs(0)))), state)
    ids = np.random.RandomState(0).randint(3, 32000, (1, prompt_len))

    def run_j():
        toks, _ = mistral_model.greedy_generate(ours, new_tokens, input_ids=jnp.asarray(ids))
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
    jt = median_seconds(run_j, repeats)
    tt_s = median_seconds(run_t, repeats)
    return {"jax_s": jt, "torch_s": tt_s, "compile_s": compile_s,
            "tokens_equal": bool((toks_j == toks_t).all()),
            "fns": (run_j, run_t),
            "pass_b": (lambda: jax.block_until_ready(pb(st, jnp.asarray(ids))), pass_b_t)}


def main(argv=None) -> int:
    """Runs ``python -m benchmarks compare`` (in a fresh interpreter: it pins threads before JAX starts)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, "-m", "benchmarks", "compare", *(sys.argv[1:] if argv is None else argv)]
    return subprocess.call(cmd, cwd=root)


if __name__ == "__main__":
    sys.exit(main())
