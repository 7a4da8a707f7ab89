"""The game engine's own stage programs, compiled and saved for ``play`` / ``generate`` / ``web --executables``.

The turn programs of the compile tool (aot/programs.py) (prefill, decode, pass B, DiT, VAE) are the
turn's pieces with their own argument trees; the engine runs them fused into its stages (the MLLM
stage holds prefill + decode loop + pass B) with every component's weights as one argument. What
a command can load is therefore the engine's stage programs themselves: :func:`save_engine_stages`
builds the engine as ``play --demo`` does (``config.game.checkpoint`` when it exists, else random
weights of the config's sizes: the programs depend on shapes only) in ``layout``, and plays a short
game while :func:`animegamer_jax.inference.executables.recording` serializes every stage program it
compiles (MLLM, sampling, whole-clip VAE decode, and the streaming decode's chunks that ``web``
runs). This plays the turns on the host's devices, so it is for ``cpu-N`` targets (the devices
that run play here); TPU / GPU targets compile their stages on the machine that plays them.
"""

from __future__ import annotations

from typing import Any

from animegamer_jax import parallel
from animegamer_jax.game.engine import GameEngine
from animegamer_jax.game.loading import resolve_system
from animegamer_jax.inference import executables
from animegamer_jax.inference.instructions import Game, parse_instruction
from animegamer_jax.inference.layout import apply_layout, setup_jax
from animegamer_jax.inference.mode import apply_mode
from animegamer_jax.inference.turn_inputs import encode_instruction

#: the two turns played (the second has a history, as every later turn)
_TURNS = ("Character: Bunny; Motion: slowly walk out of the burrow; Background: day meadow.",
          "Character: Bunny; Motion: happily stretch in the sun; Background: day meadow.")


def save_engine_stages(config: Any, layout: str, devices: list[Any], folder: str) -> tuple[int, str]:
    """Compiles and saves the engine's stage programs for ``config`` in ``layout`` on ``devices``
    into ``folder``; returns (programs saved, the engine config's hash)."""
    setup_jax()  # the game commands' JAX options (they change the compiled programs)
    cfg = apply_layout(config, layout, len(devices))
    mesh = parallel.mesh_from_config(cfg, devices=devices)
    system = resolve_system(apply_mode(cfg), mesh=mesh, random_fallback=True)
    with executables.recording(folder) as store:
        engine = GameEngine(cfg, system, mesh=mesh, latency=layout == "latency")
        game = Game("aot", [parse_instruction(t) for t in _TURNS], None)
        engine.play([game])
        b = engine.batch_size  # web's turn: the streaming decode
        text = encode_instruction(game.turns[0].text, engine.spec, engine.tok)
        engine.step([engine.new_run() for _ in range(b)], [0] * b, [text] * b, [0] * b,
                    on_frames=lambda start, frames: None)
        return store.saved, executables.config_hash(engine.config)


__all__ = ["save_engine_stages"]
