"""CLIP embedder for the metrics: a tiny HF CLIPModel folder through our converter and Flax CLIP."""

import json
import string

import numpy as np
import pytest

from animegamer_jax.eval import embedders, metrics


def _tiny_hf_clip(folder):
    import torch
    from transformers import CLIPConfig, CLIPModel

    chars = list(string.ascii_lowercase) + list(".,;:")
    vocab = {c: i for i, c in enumerate(chars)}
    vocab.update({c + "</w>": len(chars) + i for i, c in enumerate(chars)})
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    eot = vocab["<|endoftext|>"]
    cfg = CLIPConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=24, bos_token_id=eot - 1,
                         eos_token_id=eot, pad_token_id=eot, hidden_act="quick_gelu"),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=32, patch_size=8, hidden_act="quick_gelu"),
        projection_dim=16)
    torch.manual_seed(0)
    model = CLIPModel(cfg).eval()
    model.save_pretrained(str(folder))
    return model


def _features(out):
    return (out if hasattr(out, "detach") else out.pooler_output).detach().numpy()


@pytest.mark.parity
def test_clip_embedder_matches_hf_clipmodel(tmp_path):
    import torch
    from PIL import Image
    from transformers import CLIPTokenizer

    from animegamer_jax.models.clip.model import CLIP_MEAN, CLIP_STD

    hf = _tiny_hf_clip(tmp_path)
    emb = embedders.embedder_from_config(str(tmp_path))
    assert "CLIP" in emb.label
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (3, 40, 60, 3), np.uint8)
    ours = emb.image(frames)
    # reference: centre 40x40 crop, PIL bicubic to 32, CLIP normalization, HF CLIPModel
    crops = frames[:, :, 10:50]
    pix = np.stack([np.asarray(Image.fromarray(f).resize((32, 32), Image.BICUBIC)) for f in crops]) / 255.0
    pix = (pix - np.asarray(CLIP_MEAN)) / np.asarray(CLIP_STD)
    with torch.no_grad():
        ref = _features(hf.get_image_features(pixel_values=torch.tensor(pix.transpose(0, 3, 1, 2), dtype=torch.float32)))
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=1e-4)

    texts = ["quickly chase a butterfly", "day meadow"]
    tok = CLIPTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    ids = tok(texts, padding="max_length", max_length=24, truncation=True, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        ref_t = _features(hf.get_text_features(input_ids=ids))
    np.testing.assert_allclose(emb.text(texts), ref_t, atol=1e-4, rtol=1e-4)

    # identical images -> CLIP-I 1.0 with the real embedder
    assert metrics.clip_i(emb.image(np.stack([frames[0]] * 4)), emb.image(frames[:1])) == pytest.approx(1.0, abs=1e-6)


def test_embedder_from_config_errors_and_standin(tmp_path):
    with pytest.raises(FileNotFoundError, match="CLIP folder"):
        embedders.embedder_from_config(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        embedders.embedder_from_config(str(tmp_path))
    s = embedders.embedder_from_config("standin")
    assert "stand-in" in s.label
    img = np.random.default_rng(1).integers(0, 256, (2, 20, 30, 3), np.uint8)
    np.testing.assert_allclose(s.image(img[:1]), s.image(img[:1]))
    assert s.text(["walk slowly", "run"]).shape == s.image(img).shape == (2, 64)
