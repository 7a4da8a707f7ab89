"""Video I/O helpers: uint8 conversion, MP4 (H.264) and GIF round trips with fps."""

import numpy as np
import pytest

from animegamer_jax.video_io import from_uint8, read_video, to_uint8, write_gif, write_mp4, write_video


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


def test_mp4_round_trip(tmp_path):
    frames = _clip()
    path = str(tmp_path / "a" / "clip.mp4")
    write_mp4(path, frames, fps=8, crf=0)
    got, fps = read_video(path)
    assert got.shape == frames.shape and got.dtype == np.uint8
    assert fps == pytest.approx(8.0)
    assert np.abs(got.astype(int) - frames.astype(int)).mean() < 5.0  # yuv420p chroma subsampling + colour matrix rounding
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
