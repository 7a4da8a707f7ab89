"""Zero-terminal-SNR DDPM discretization with SNR shift (docs/diffusion.md#schedule).

All tables are computed once in float64 numpy (static for a given number of steps) and enter jitted
code as constants. Conventions: `a` is sqrt(alpha_bar) (SAT's `alphas_cumprod_sqrt`), `sigma` is
sqrt(1 - a^2), the DDPM index tau runs 0 (clean) .. 999 (pure noise, a = 0).

Precision note: SAT casts the shifted alpha_bar to float32 before the sqrt and rescale; we keep float64
(diffusers `CogVideoXDDIMScheduler` does the same), a difference of ~1e-7 relative.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class DiffusionSchedule:
    """DDPM discretization parameters (config section `diffusion`; defaults = AnimeGamer / CogVideoX-2B).

    Attributes:
      num_train_timesteps: DDPM steps (1000).
      beta_start / beta_end: "scaled_linear" betas, `linspace(sqrt(start), sqrt(end))^2` (0.00085 / 0.012).
      snr_shift_scale: s in `abar / (s + (1 - s) abar)` (3.0).
    """

    num_train_timesteps: int = 1000
    beta_start: float = 0.00085
    beta_end: float = 0.012
    snr_shift_scale: float = 3.0

    @classmethod
    def from_config(cls, diffusion: Any) -> "DiffusionSchedule":
        return cls(num_train_timesteps=diffusion.num_train_timesteps, beta_start=diffusion.beta_start,
                   beta_end=diffusion.beta_end, snr_shift_scale=diffusion.snr_shift_scale)

    def shifted_alphas_cumprod(self) -> np.ndarray:
        """float64 [num_train]: SNR-shifted alpha_bar before the zero-terminal-SNR rescale
        (docs/diffusion.md#schedule)."""
        betas = np.linspace(self.beta_start ** 0.5, self.beta_end ** 0.5, self.num_train_timesteps,
                            dtype=np.float64) ** 2
        abar = np.cumprod(1.0 - betas)
        s = self.snr_shift_scale
        return abar / (s + (1.0 - s) * abar)

    def alphas_cumprod(self) -> np.ndarray:
        """float64 [num_train]: the training table alpha_bar_tau (shift, then zero-SNR rescale over all steps).

        Equals diffusers `CogVideoXDDIMScheduler(snr_shift_scale=s, rescale_betas_zero_snr=True).alphas_cumprod`;
        alpha_bar_999 = 0.
        """
        return rescale_zero_terminal_snr(np.sqrt(self.shifted_alphas_cumprod())) ** 2

    def train_a(self) -> np.ndarray:
        """float64 [num_train]: sqrt(alpha_bar) of the training table (a_0 = 0.998726, a_999 = 0)."""
        return np.sqrt(self.alphas_cumprod())

    def sampling_timesteps(self, num_steps: int) -> np.ndarray:
        """int64 [num_steps], highest noise first: `linspace(num_train - 1, 0, num_steps,
        endpoint=False).astype(int)`.

        For num_train = 1000, num_steps = 50: [999, 979, ..., 19] (equals diffusers' "trailing" spacing).
        """
        if not 0 < num_steps <= self.num_train_timesteps:
            raise ValueError(f"num_steps must be in 1..{self.num_train_timesteps}, got {num_steps}")
        return np.linspace(self.num_train_timesteps - 1, 0, num_steps, endpoint=False).astype(np.int64)

    def sampler_a(self, num_steps: int) -> np.ndarray:
        """float64 [num_steps + 1]: the SAT sampler sequence, highest noise first, 1.0 appended
        (docs/diffusion.md#schedule).

        The zero-SNR rescale runs over the selected subset only (a_first = a(tau_min), a_last = a(tau_max)),
        so e.g. tau=19 gives 0.97394 here vs 0.97292 in the training table; a[0] = 0.
        """
        tau = self.sampling_timesteps(num_steps)[::-1]
        a = rescale_zero_terminal_snr(np.sqrt(self.shifted_alphas_cumprod()[tau]))
        return np.concatenate([a[::-1], [1.0]])

    def snap_to_train(self, a: np.ndarray) -> np.ndarray:
        """Nearest training-table value for each entry of `a` (SAT `DiscreteDenoiser`, `quantize_c_noise=False`)."""
        table = self.train_a()
        idx = np.abs(np.asarray(a, np.float64)[:, None] - table[None]).argmin(axis=1)
        return table[idx]


def rescale_zero_terminal_snr(a: np.ndarray) -> np.ndarray:
    """`(a - a_last) * a_first / (a_first - a_last)` on a sqrt(alpha_bar) sequence ordered clean -> noisy.

    (Lin et al. 2024, Algorithm 1; diffusers `rescale_zero_terminal_snr` in sqrt space.)
    """
    a = np.asarray(a, np.float64)
    return (a - a[-1]) * a[0] / (a[0] - a[-1])
