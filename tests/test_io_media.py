"""Video I/O helpers: the pixel-range conversions, MP4 (H.264) and GIF round trips with fps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from animegamer_jax.io.media import from_uint8, read_video, to_uint8, to_unit, write_gif, write_mp4, write_video


def _clip(t=9, h=32, w=48):
    """A smooth moving gradient (compresses well, so H.264 error stays small)."""
    yy, xx = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
    frames = [np.stack([xx, yy, (xx + yy + i / t) % 1.0 * 0.5 + 0.25], -1) for i in range(t)]
    return to_uint8(np.stack(frames), (0.0, 1.0))


def test_uint8_conversion():
    x = np.array([-1.0, -0.5, 0.0, 1.0, 2.0, -3.0], np.float32)
    np.testing.assert_array_equal(to_uint8(x), [0, 64, 128, 255, 255, 0])
    np.testing.assert_array_equal(to_uint8(np.array([0.0, 0.5, 1.0]), (0.0, 1.0)), [0, 128, 255])
    u = np.arange(256, dtype=np.uint8)
    back = from_uint8(u)
    assert back.dtype == np.float32 and back.min() == -1.0 and back.max() == 1.0
    np.testing.assert_array_equal(to_uint8(back), u)
    with pytest.raises(TypeError):
        from_uint8(back)
    np.testing.assert_array_equal(to_uint8(u), u)  # uint8 frames are already pixels
    for value_range in ((-1.0, 1.0), (0.0, 1.0)):  # the pair round-trips every pixel value
        np.testing.assert_array_equal(to_uint8(from_uint8(u, value_range), value_range), u)


def test_to_unit_numpy_and_jax():
    """The [lo, hi] -> [0, 1] map behind to_uint8, on numpy and under jax.jit, dtype kept."""
    x = np.array([-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0], np.float32)
    want = [0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    np.testing.assert_array_equal(to_unit(x), want)
    got = jax.jit(to_unit)(jnp.asarray(x))
    assert got.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(to_unit(x, (0.0, 1.0)), np.clip(x, 0.0, 1.0))
    np.testing.assert_array_equal(to_uint8(x), np.round(to_unit(x) * 255.0).astype(np.uint8))


def test_mp4_round_trip(tmp_path):
    frames = _clip()
    path = str(tmp_path / "a" / "clip.mp4")
    write_mp4(path, frames, fps=8, crf=0)
    got, fps = read_video(path)
    assert got.shape == frames.shape and got.dtype == np.uint8
    assert fps == pytest.approx(8.0)
    # yuv420p chroma subsampling + colour matrix rounding
    assert np.abs(got.astype(int) - frames.astype(int)).mean() < 5.0
    with pytest.raises(ValueError, match="even"):
        write_mp4(str(tmp_path / "odd.mp4"), frames[:, :31], fps=8)


def test_gif_and_float_input(tmp_path):
    frames = _clip(t=5)
    path = str(tmp_path / "clip.gif")
    write_video(path, from_uint8(frames), fps=10)  # float [-1, 1] input
    got, fps = read_video(path)
    assert got.shape == frames.shape and fps == pytest.approx(10.0)
    assert np.abs(got.astype(int) - frames.astype(int)).mean() < 8.0  # 256-colour palette
    with pytest.raises(ValueError, match="suffix"):
        write_video(str(tmp_path / "x.avi"), frames)
    with pytest.raises(ValueError, match=r"\[T, H, W, 3\]"):
        write_gif(str(tmp_path / "y.gif"), frames[0])
