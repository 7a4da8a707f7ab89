"""Play's two device layouts of a config, and the process-wide JAX options of the turn programs.

* :func:`apply_layout` (``config.game.play_layout``): ``batch`` keeps the config's mesh (one game per
  data-parallel slice); ``latency`` puts ONE game on every device (:func:`latency_mesh_shape`: CFG
  halves on ``data``, the DiT's joint sequence on ``context``; :data:`LATENCY_RULES`). The game
  engine (game/engine.py), play, the compile tool (aot/programs.py) and the benchmarks use it.
* :func:`setup_jax`: the JAX options every program that plays turns sets before compiling (they
  change the compiled programs, so the compile tool sets them too).
"""

from __future__ import annotations

import copy

import jax

from animegamer_jax import parallel
from animegamer_jax.diffusion import samplers

#: play's layouts (``config.game.play_layout``; module docstring)
LAYOUTS = ("latency", "batch")

#: logical rules the latency layout sets on top of the config's (module docstring)
LATENCY_RULES = (
    ("embed", ("data", "fsdp", "context")),
    ("act_height", "context"),
    ("act_width", "data"),
)


def latency_mesh_shape(num_devices: int, guided: bool = True) -> tuple[int, int, int, int]:
    """(data, fsdp, tensor, context) of the latency layout: CFG halves on ``data`` (2) and the rest
    of the devices on ``context``; ``(1, 1, 1, n)`` for an odd count (1 device: all ones) or without
    a CFG batch (``guided=False``: the distilled student, ``diffusion.sampler="student"``)."""
    n = int(num_devices)
    return (2, 1, 1, n // 2) if guided and n % 2 == 0 else (1, 1, 1, n)


def apply_layout(config, layout: str, num_devices: int):
    """A copy of ``config`` with ``layout`` applied to ``mesh.shape`` and ``sharding_rules``.

    ``batch``: unchanged. ``latency``: mesh :func:`latency_mesh_shape` ``(num_devices)`` over the
    standard axes and :data:`LATENCY_RULES` replacing the config's entries of those names; with
    ``game.latency_weights = "replicated"`` the weights are whole on every device (``embed``
    unsharded) instead of sharded over all of them.

    Raises:
      ValueError: unknown layout or ``game.latency_weights``.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"game.play_layout must be one of {LAYOUTS}, got {layout!r}")
    config = copy.deepcopy(config)
    if layout == "latency":
        axes = tuple(config.mesh.axes)
        if axes != parallel.MESH_AXES:
            raise ValueError(f"the latency layout needs mesh axes {parallel.MESH_AXES}, the config has {axes}")
        config.mesh.shape = latency_mesh_shape(num_devices, guided=str(config.diffusion.sampler) != samplers.STUDENT)
        over = dict(LATENCY_RULES)
        weights = str(config.game.get("latency_weights", "sharded"))
        if weights not in ("sharded", "replicated"):
            raise ValueError(f"game.latency_weights must be 'sharded' or 'replicated', got {weights!r}")
        if weights == "replicated":
            over["embed"] = None
        rules = [(k, over.pop(k, v)) for k, v in parallel.rules_from_config(config)]
        config.sharding_rules = tuple(rules + list(over.items()))
    return config


def setup_jax() -> None:
    """Process-wide JAX settings of the programs that play turns (play, generate, web, eval, aot).

    ``jax_threefry_partitionable`` off: with it on (this JAX's default) every program that draws
    random numbers compiles threefry much more slowly on a CPU. Only the bit stream changes; a given
    seed still gives identical outputs run after run.
    """
    jax.config.update("jax_threefry_partitionable", False)
