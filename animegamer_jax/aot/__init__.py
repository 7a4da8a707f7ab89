"""Ahead-of-time compilation for the chips users run ("will it fit?"), on a host without them.

``python -m animegamer_jax.commands.aot --topology=v5p-64 --program=a2`` (console script ``animegamer-aot``)
compiles the train command's step or play's turn stages with the real TPU compiler (libtpu) or
XLA:GPU for compile-only devices (``parallel.target.compile_devices``) and prints per-chip memory,
FLOPs, the attention kernels chosen and a roofline time. Modules: ``programs`` (what is compiled),
``pieces`` (the turn stages as pure functions), ``hlo_cost`` (trip-count-aware FLOPs / bytes),
``report`` (the table, the roofline). The command is animegamer_jax/commands/aot.py.
"""
