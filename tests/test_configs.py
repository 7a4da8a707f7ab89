"""Both configs load, have the paper numbers, and take command-line style overrides."""

import pytest

from animegamer_jax.config import ConfigError, load_config
from configs import animegamer_2b_7b, tiny


def test_full_config_has_paper_numbers():
    c = animegamer_2b_7b.get_config()
    assert c.mllm.vocab_size == 32284 and c.mllm.hidden_size == 4096 and c.mllm.num_layers == 32
    assert (c.mllm.num_heads, c.mllm.num_kv_heads, c.mllm.head_dim) == (32, 8, 128)
    assert (c.mllm.lora_rank, c.mllm.lora_alpha) == (32, 32.0)
    assert c.rep.dim == 1920 and c.rep.num_text_tokens + c.rep.num_image_tokens == 226
    assert (c.dit.hidden_size, c.dit.num_layers, c.dit.num_heads, c.dit.lora_rank) == (1920, 30, 30, 64)
    assert c.vae.block_out_channels == (128, 256, 256, 512) and c.vae.scaling_factor == 1.15258426
    assert (c.clip.vision_width, c.clip.patch_size, c.t5.d_model, c.t5.max_length) == (768, 16, 4096, 30)
    assert c.diffusion.snr_shift_scale == 3.0 and c.dit.flow_table == (0.5, 2.5, 10.0, 15.0, 40.0)


def test_tiny_keeps_structure_and_shrinks():
    full, small = animegamer_2b_7b.get_config(), tiny.get_config()

    def keys(c, prefix=""):
        out = set()
        for k, v in c.items():
            out.add(prefix + k)
            if hasattr(v, "items"):
                out |= keys(v, prefix + k + ".")
        return out

    assert keys(full) == keys(small)
    assert small.mllm.vocab_size == 32284  # real tokenizer at every size
    assert small.dit.hidden_size <= 128 and small.mllm.hidden_size < 128  # 1920 / 2048 at full size
    assert small.rep.dim == small.dit.hidden_size  # s_a enters the DiT unprojected
    assert small.shot_encoder.image_dim == small.clip.vision_width
    assert small.shot_encoder.text_dim == small.t5.d_model
    assert small.rep.num_image_tokens == (small.clip.image_size // small.clip.patch_size) ** 2


def test_overrides_and_errors():
    c = load_config("configs/tiny.py", ["train.phase=b", "mesh.shape=[2,-1,1,1]", "train.learning_rate=1"])
    assert c.train.phase == "b" and c.mesh.shape == (2, -1, 1, 1) and c.train.learning_rate == 1.0
    with pytest.raises(ConfigError, match="unknown config key 'train.phasee'"):
        load_config("configs/tiny.py", ["train.phasee=b"])
    with pytest.raises(ConfigError, match="expects int"):
        load_config("configs/tiny.py", ["dit.num_layers=two"])
    with pytest.raises(ConfigError, match="not found"):
        load_config("configs/nope.py")


def test_overrides_go_through_config_flags(tmp_path):
    """load_config parses overrides by config_flags' rules (as --config.a.b=v on a command line) and
    loads each file fresh: a later file without get_config() is refused, not given the earlier one's."""
    c = load_config("configs/tiny.py", ["mesh.shape=(1,1,1,-1)", "game.write_gif=false", "config.game.fps=12"])
    assert c.mesh.shape == (1, 1, 1, -1) and c.game.write_gif is False and c.game.fps == 12
    with pytest.raises(ConfigError, match=r"^config key 'train.learning_rate' expects float, got 'fast'$"):
        load_config("configs/tiny.py", ["train.learning_rate=fast"])
    with pytest.raises(ConfigError, match=r"unknown config key 'nope.x' in .*tiny.py \(no section 'nope'\)"):
        load_config("configs/tiny.py", ["nope.x=1"])
    with pytest.raises(ConfigError, match="not of the form key=value"):
        load_config("configs/tiny.py", ["train.phase"])
    bare = tmp_path / "bare.py"
    bare.write_text("x = 1\n")
    with pytest.raises(ConfigError, match="defines no get_config"):
        load_config(str(bare))


def test_output_folders_are_flags_not_config_values():
    """Where outputs go is a command's --out: no config has game.out_dir / eval.out_dir, and a
    checkpoint saved with them (checkpoints/tiny_system) loads without them."""
    import json

    from animegamer_jax import checkpoint
    from animegamer_jax.config import REMOVED_KEYS

    for c in (animegamer_2b_7b.get_config(), tiny.get_config(), load_config("configs/toy_world.py")):
        assert "out_dir" not in c.game and "out_dir" not in c.eval
    saved = json.load(open("checkpoints/tiny_system/config/metadata"))
    assert saved["game"]["out_dir"] == "outputs/games" and saved["eval"]["out_dir"] == "outputs/eval_tiny"
    loaded = checkpoint.load_config("checkpoints/tiny_system")
    assert REMOVED_KEYS == ("game.out_dir", "eval.out_dir")
    assert "out_dir" not in loaded.game and "out_dir" not in loaded.eval
    assert loaded.game.checkpoint == "checkpoints/tiny_system" and loaded.eval.clip_frames == 4  # the rest kept
