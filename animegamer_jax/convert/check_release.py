"""Replaying a recorded release turn on a converted system (``convert check-release DST CASE.npz``).

In the spirit of maxtext's forward-pass logit checker: the system checkpoint written by
``convert release`` plays the case's turn in ``reference`` mode (inference/release_decoding.py: W = 1, last-226
read-out, free greedy pass A + the release's text parser, release DynamicCFG, bf16 s_a, VAE chunks
[0:3] [3:5]) with the case's recorded noise (its initial latents and every sampler draw, reordered
by ``release_decoding.release_step_noise``), and every stage is compared with the recording:

=============  ======================================  ===========================================
stage          ours                                    tolerance
=============  ======================================  ===========================================
ids            the turn's token ids                    exact
masks          attention / ids_gen / ids_cmp masks     exact
state tokens   pass-A generated ids (up to ``</s>``)   exact
states         parsed [ML, SC, ET, ST], and the flow   exact
s_a            pass-B representation (float32)         FACTOR x the case's float32-vs-float64 floor
latents        sampled latents, end to end             FACTOR x floor
frames float   decoded frames in [0, 1]                FACTOR x floor
frames uint8   truncated uint8 frames                  |diff| <= 1 on <= 0.1 % of values
=============  ======================================  ===========================================

The floors are the fixture's ``noise_floor.json`` ``float32_vs_float64`` figures for the case (the
recording replayed in float64); FACTOR = 10, the fixture README's suggestion. Exit status 0 only
when every stage holds. Runs in float32 at the highest matmul precision. The command
(commands/convert.py) builds the engine and prints; :func:`check_release` takes the engine.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from animegamer_jax.io import paths
from animegamer_jax.inference import release_decoding
from animegamer_jax.inference.clip_sampler import turn_key
from animegamer_jax.inference.turn_inputs import encode_instruction, stack_inputs
from animegamer_jax.models.cogvideox.dit import flow_value

FACTOR = 10.0
#: fixture README "Noise floor and tolerances", used when noise_floor.json is not beside the case
README_TOLERANCES = {"s_a": 2e-4, "latents": 3e-4, "frames float": 1e-4}
UINT8_MAX_FRACTION = 1e-3
FLOOR_KEYS = {"s_a": "s_a", "latents": "latents_sampled", "frames float": "frames_float"}


@dataclasses.dataclass
class Stage:
    """One compared stage: ``ok`` iff ``diff <= tol`` (``detail`` says what was compared)."""

    name: str
    diff: float
    tol: float
    ok: bool
    detail: str = ""

    def line(self) -> str:
        mark = "ok  " if self.ok else "FAIL"
        return f"{mark} {self.name:<13} max|diff| {self.diff:<10.3g} tol {self.tol:<10.3g} {self.detail}"


def _exact(name: str, ours: np.ndarray, ref: np.ndarray, detail: str = "") -> Stage:
    ours, ref = np.asarray(ours), np.asarray(ref)
    if ours.shape != ref.shape:
        return Stage(name, float("inf"), 0.0, False, f"shape {ours.shape} vs recorded {ref.shape} {detail}")
    d = float(np.max(np.abs(ours.astype(np.float64) - ref.astype(np.float64)))) if ours.size else 0.0
    return Stage(name, d, 0.0, d == 0.0, detail)


def _close(name: str, ours: np.ndarray, ref: np.ndarray, tol: float, detail: str = "") -> Stage:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    if ours.shape != ref.shape:
        return Stage(name, float("inf"), tol, False, f"shape {ours.shape} vs recorded {ref.shape}")
    d = float(np.max(np.abs(ours - ref)))
    return Stage(name, d, tol, bool(d <= tol), detail)


def tolerances(case_path: str) -> dict[str, tuple[float, str]]:
    """``{stage: (tolerance, how it was set)}`` for the float stages of one case."""
    case_p = paths.as_path(case_path)
    floor_file = case_p.parent.parent / "noise_floor.json"  # <fixture>/cases/<name>.npz -> <fixture>/
    floors: dict[str, Any] = {}
    if floor_file.exists():
        floors = json.loads(floor_file.read_text()).get("float32_vs_float64", {}).get(case_p.stem, {})
    out = {}
    for stage, key in FLOOR_KEYS.items():
        if key in floors:
            fl = float(floors[key]["max_abs"])
            out[stage] = (FACTOR * fl, f"(= {FACTOR:g} x float64 floor {fl:.2g})")
        else:
            out[stage] = (README_TOLERANCES[stage], "(fixture README table)")
    return out


def check_release(engine: Any | Callable[[], Any], case_path: str, log: Callable[[str], None] | None = None) -> list[Stage]:
    """Plays the case's turn on a converted system and compares every stage (module docstring).

    Args:
      engine: a game engine (game/engine.py ``GameEngine``) on one device playing the converted system
        in ``reference`` mode with float32 matmuls at highest precision (the command builds it:
        commands/convert.py ``reference_engine``); reused across cases, the stages compile once. Used:
        its ``config``, ``params``, ``spec``, ``tok``, ``new_run()``, ``_shard`` and the stage functions
        ``mllm_fn``, ``sample_fn``, ``decode_fn``. Or a function of no arguments that returns one,
        called once the case file is read (a missing case is reported before a system loads).
      case_path: ``cases/<name>.npz`` (local or a URL); its ``.json`` sidecar gives the instruction.
      log: called with each stage's line (:meth:`Stage.line`) after the comparison; None: nothing.

    Returns:
      the compared stages, in the order of the module docstring's table.

    Raises:
      FileNotFoundError: the case file is missing.
    """
    case_p = paths.as_path(case_path)  # local or a URL (gs://...): read through epath
    if not case_p.is_file():
        raise FileNotFoundError(f"{case_path}: case file not found. Fix: pass a cases/*.npz of the fixture")
    with case_p.open("rb") as f:
        rec = dict(np.load(io.BytesIO(f.read())))
    meta = json.loads(case_p.with_suffix(".json").read_text())
    if callable(engine):  # the engine's factory (a GameEngine is not callable)
        engine = engine()
    config = engine.config
    tols = tolerances(case_path)
    stages: list[Stage] = []

    run = engine.new_run()
    text_ids = encode_instruction(meta["instruction"], engine.spec, engine.tok)
    inp = run.next_input(text_ids)
    valid = inp.attention_mask != 0
    stages.append(_exact("ids", inp.ids[valid], rec["input_ids"], f"({int(valid.sum())} tokens)"))
    masks = np.concatenate([inp.attention_mask[valid], inp.gen_mask[valid], inp.cmp_mask[valid]])
    ref_masks = np.concatenate([rec["attention_mask"], rec["ids_gen_mask"], rec["ids_cmp_mask"]])
    stages.append(_exact("masks", masks, ref_masks, "(attention, ids_gen, ids_cmp)"))

    batch = engine._shard(stack_inputs([inp]))
    tokens, rep = engine.mllm_fn(engine.params, batch)
    gen = release_decoding.trim_at_eos(np.asarray(tokens)[0])
    stages.append(_exact("state tokens", np.asarray(gen), rec["passA_generated_ids"], f"({len(gen)} ids)"))
    states = release_decoding.states_from_generated(np.asarray(tokens), engine.tok)
    flow = float(np.asarray(flow_value(np.asarray(states[:, 0]), tuple(config.dit.flow_table)))[0])
    st = _exact("states", np.concatenate([states[0], [flow]]), np.concatenate([rec["states"], [rec["flow"]]]),
                f"({list(map(int, states[0]))}, flow {flow:g})")
    stages.append(st)
    rep = np.asarray(rep, np.float32)
    tol, how = tols["s_a"]
    stages.append(_close("s_a", rep, rec["s_a"], tol, how))

    n = int(rec["sampler_timesteps"].shape[0]) - 1
    noise = {"initial": rec["noise_initial"].astype(np.float32),
             "steps": release_decoding.release_step_noise(rec["noise_draws"], n).transpose(1, 0, 2, 3, 4, 5)}
    keys = engine._shard(np.stack([turn_key(0, 0)]))
    latents = engine.sample_fn(engine.params, jax.numpy.asarray(rep), jax.numpy.asarray(states[:, 0]), keys,
                               engine._shard(noise))
    latents = np.asarray(latents, np.float32)
    tol, how = tols["latents"]
    stages.append(_close("latents", latents, rec["latents_sampled"], tol, how))

    frames = np.asarray(engine.decode_fn(engine.params, jax.numpy.asarray(latents)), np.float32)  # [1, T, 8h, 8w, 3]
    tol, how = tols["frames float"]
    stages.append(_close("frames float", frames.transpose(0, 1, 4, 2, 3), rec["frames_float"], tol, how))
    ours8 = release_decoding.release_uint8(frames[0]).astype(np.int16)
    ref8 = rec["frames_uint8"].astype(np.int16)
    if ours8.shape != ref8.shape:
        stages.append(Stage("frames uint8", float("inf"), 1.0, False, f"shape {ours8.shape} vs {ref8.shape}"))
    else:
        d = np.abs(ours8 - ref8)
        frac = float(np.mean(d > 0))
        stages.append(Stage("frames uint8", float(d.max()), 1.0, bool(d.max() <= 1 and frac <= UINT8_MAX_FRACTION),
                            f"({int((d > 0).sum())} of {d.size} values differ = {100 * frac:.3f} %, "
                            f"limit {100 * UINT8_MAX_FRACTION:.1f} %)"))
    if log is not None:
        for s in stages:
            log(s.line())
    return stages

