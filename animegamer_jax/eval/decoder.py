"""Decoder PSNR of a system checkpoint: D_a's samples for a prepared dataset's clips against the clips' frames.

  python -m animegamer_jax.commands.eval decoder --checkpoint checkpoints/tiny_system [--dataset data/prepared/tiny]
  python -m animegamer_jax.commands.eval decoder --checkpoint DIR --config.diffusion.cfg_scale=6 \
      --config.diffusion.num_sampling_steps=50   # other sampler settings
  python -m animegamer_jax.commands.eval decoder --config.diffusion.sampler=student \
      --config.diffusion.num_sampling_steps=4   # the few-step student (phase d)
  python -m animegamer_jax.commands.eval decoder --sheet /tmp/decoder.png   # + real | VAE | sample frames, one row per clip
  python -m animegamer_jax.commands.eval decoder --checkpoint DIR --reference   # each clip decoded with a reference image

For each scored clip, s_a = E_a(CLIP of its first frame, T5 of its action) as in phase a (paper Sec. 3.2);
play's DiT sampler (``inference.clip_sampler.dit_sampler`` on the weights play prepares,
``dit.prepare_for_inference``, with ``game.mode`` applied as play applies it) samples latents with the
checkpoint config's sampler (``diffusion.sampler``, ``num_sampling_steps``, DynamicCFG ``cfg_scale`` /
``cfg_exp`` / ``cfg_schedule``; ``--config.a.b=value`` overrides a field of the checkpoint's config,
e.g. ``--config.diffusion.sampler=student``; the ``student`` sampler runs the checkpoint's ``student``
component), conditioned on the
clip's motion level (``dit.flow_table``) against E_a's unconditional embedding, and the VAE decodes them
(``decode(latents / scaling_factor)``, untiled). Two PSNRs (dB, frames mapped to
[0, 1], decoded output clipped to [0, 1]): ``sample``, the decoded sample against the clip's frames, and
``reconstruction``, the VAE's own encode/decode of the clip (posterior mean), the ceiling a sample can
reach through this VAE. ``--sheet PNG`` also writes the middle frame of each scored clip, of its VAE
reconstruction and of the sample, side by side (one row per clip, in that order): what a sample can show,
and what the VAE already loses.

``--reference`` (a system trained with phase r, its ``reference`` component): each scored clip is
sampled with a reference image as play samples a turn naming a ``--character`` (the VAE's reference
latent, ``models/cogvideox/reference.py`` ``encode_reference``, into the same sampler with the
adapter): the first frame of ANOTHER clip of the same character, the pair phase r trains on
(``data.batches.mined_reference_frames`` on the dataset's labels with the config's seed; a clip
without one gets its own first frame, and a dataset without character labels is refused). Run once
without and once with it for the decoder PSNR with and without a reference.

Scored clips: ``--clips`` evenly spaced over the dataset's clip order (all when it has fewer,
eval/metrics.py ``sample_frame_indices``), each with its own noise (``--seed`` + its position). The
default dataset is the checkpoint config's ``data.dataset_dir``: the decoder's training clips. On those
this says how well D_a reproduces what it was trained on (the shipped tiny system memorises its training
clips and generalises to no other footage), not how well it generalises.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from animegamer_jax.io import media
from animegamer_jax.data import datasets, loader, references
from animegamer_jax.data.batches import BatchBuilder
from animegamer_jax.eval.metrics import sample_frame_indices
from animegamer_jax.eval.vae import model_frames_to_unit, psnr
from animegamer_jax.inference.action_representation import ea_representation
from animegamer_jax.inference.clip_sampler import dit_sampler
from animegamer_jax.inference.mode import apply_mode
from animegamer_jax.inference.vae_decode import FRAME_RANGE
from animegamer_jax.models.cogvideox.dit import prepare_for_inference
from animegamer_jax.models.cogvideox.reference import encode_reference


def clip_indices(num_clips: int, count: int) -> list[int]:
    """``count`` dataset positions evenly spaced over ``range(num_clips)`` (first and last included;
    every position when ``count >= num_clips``)."""
    return [int(i) for i in sample_frame_indices(num_clips, count)]


def check_dataset(dataset_dir: str, config) -> dict:
    """The index (``datasets.read_index``, split train) of ``dataset_dir`` after checking that its clips are what the
    system's config makes: ``data.height`` x ``data.width``, ``data.num_frames`` frames, at least one.

    Raises:
      datasets.DatasetError: no prepared dataset there (local path or URL), no clips, or clips of
        another size or length (the message names both and the fix).
    """
    index = datasets.read_index(dataset_dir)
    have = {k: index["config"].get(k) for k in ("height", "width", "num_frames")}
    want = {k: int(config.data[k]) for k in ("height", "width", "num_frames")}
    if have != want:
        raise datasets.DatasetError(f"{dataset_dir}: clips of {have}, the system's config makes {want}; pass a "
                                   f"dataset prepared with this config (--dataset)")
    if not index.get("clips"):
        raise datasets.DatasetError(f"{dataset_dir}: the dataset has no clips")
    return index


def clip_example(record: dict) -> dict:
    """One clip record of a prepared dataset (``loader.ClipSource``) as a batch of one for phase a's
    ``BatchBuilder``: ``frames`` uint8 [1, T, H, W, 3], ``first_frame`` [1, H, W, 3], ``motion_level``
    [1], ``action`` str [1] (E_a's T5 input)."""
    ex = {name: np.asarray(record[name])[None] for name in ("frames", "first_frame", "motion_level")}
    ex["action"] = np.asarray([str(record["action"])])
    return ex


class _Encoders(nnx.Module):
    """E_a with its frozen T5 / CLIP, and the VAE, as one module for nnx.jit (the DiT goes in as play's
    prepared state)."""

    def __init__(self, components: dict):
        for name in ("shot_encoder", "vae", "t5", "clip"):
            setattr(self, name, components[name])


def decoder_psnr(components: dict, config, dataset_dir: str, count: int = 12, seed: int = 0,
                 keep_frames: bool = False, reference: bool = False) -> dict:
    """Scores D_a's samples on ``count`` clips of ``dataset_dir`` (module docstring).

    Args:
      components: ``shot_encoder``, ``dit``, ``vae``, ``t5`` and ``clip`` modules (``checkpoint.load_system``).
      config: the system's config (sizes, sampler, flow table, T5 tokenizer).
      keep_frames: also return each clip's middle frame, VAE reconstruction and sample (``"frames"``).
      reference: sample each clip with its mined reference image (module docstring; needs the
        ``reference`` component); each scored clip's record then has ``"reference"``, the record index
        of the clip whose first frame it got.

    Returns:
      ``{"sample": dB, "reconstruction": dB, "clips": [{"index", "film_id", "action", "motion_level",
      "sample", "reconstruction"}, ...], "dataset_clips": int, "dataset_films": [film ids]}`` (dB: means
      over the scored clips); with ``keep_frames``, ``"frames"``: one uint8 ``[3, H, W, 3]`` array a
      scored clip (the clip's, the reconstruction's and the sample's middle frame).

    Raises:
      datasets.DatasetError: no prepared dataset at ``dataset_dir``, no clips, or clips of another size
        or length than the config's (:func:`check_dataset`).
      ValueError: ``reference`` without a ``reference`` component, or on a dataset whose clips carry no
        character labels.
    """
    check_dataset(dataset_dir, config)
    source = loader.ClipSource(dataset_dir)
    builder = BatchBuilder(config, "decoder")
    # play's sampling stage (inference/turn_model.py RealTurnModel): the same prepared DiT, uncond and sampler
    dit_graph, dit_state = nnx.split(prepare_for_inference(components["dit"]))
    params = {"dit": dit_state, "uncond": components["shot_encoder"].uncond(1)[0].astype(jnp.float32)}
    g_ref, refs = None, None
    if reference:
        if "reference" not in components:
            raise ValueError("--reference needs the system's reference adapter (a system trained with phase r); "
                             "this one has none")
        try:
            refs = references.dataset_references(dataset_dir, "train", seed=int(config.seed))
        except FileNotFoundError:
            refs = np.full(len(source), -1)
        if not (refs >= 0).any():
            raise ValueError(f"{dataset_dir}: its clips carry no character labels (or no character has two clips), "
                             f"so no clip has a reference of the same character; drop --reference or score a "
                             f"dataset prepared with character labels")
        g_ref, params["reference"] = nnx.split(components["reference"])
    sample = dit_sampler(dit_graph, apply_mode(config), g_ref)
    scale = float(config.vae.scaling_factor)

    @nnx.jit
    def run(m, p, batch, level, key, ref_images):
        ref = None if ref_images is None else encode_reference(m.vae, ref_images, scale)
        latents = sample(p, ea_representation(m, batch), level, key[None], reference=ref)
        return m.vae.decode(latents / scale), m.vae.decode(m.vae.encode(batch["frames"]).mean)

    model = _Encoders(components)
    scored, frames = [], []
    for k, i in enumerate(clip_indices(len(source), count)):
        rec = source[i]
        batch = jax.tree.map(jnp.asarray, builder(clip_example(rec)))
        level = jnp.asarray([int(rec["motion_level"])], jnp.int32)
        ref_images = None  # phase r's pair (data.batches.mined_reference_frames): another clip's first frame
        if refs is not None:
            ref_images = jnp.asarray(references.reference_frames(source, refs, [i]).astype(np.uint8))
        video, recon = run(model, params, batch, level, jax.random.key(seed + k), ref_images)
        target = model_frames_to_unit(batch["frames"])[0]
        scored.append({"index": int(i), "film_id": str(rec["film_id"]), "action": str(rec["action"]),
                       "motion_level": int(rec["motion_level"]), "sample": psnr(model_frames_to_unit(video)[0], target),
                       "reconstruction": psnr(model_frames_to_unit(recon)[0], target)})
        if refs is not None:
            scored[-1]["reference"] = int(refs[i]) if refs[i] >= 0 else int(i)
        if keep_frames:
            mid = target.shape[0] // 2
            frames.append(np.stack([np.asarray(target[mid]), np.asarray(model_frames_to_unit(recon)[0][mid]),
                                    np.asarray(model_frames_to_unit(video)[0][mid])]))
    res = {"sample": float(np.mean([c["sample"] for c in scored])),
           "reconstruction": float(np.mean([c["reconstruction"] for c in scored])), "clips": scored,
           "dataset_clips": len(source), "dataset_films": sorted({f["film_id"] for f in source.index["films"]})}
    if keep_frames:
        res["frames"] = [media.to_uint8(f, FRAME_RANGE) for f in frames]
    return res
