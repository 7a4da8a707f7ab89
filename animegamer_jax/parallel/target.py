"""The hardware a program is compiled for: chip facts, the target of the active mesh, named topologies.

"What you compile is what runs" (docs/design.md): choices that depend on the hardware (attention
kernel, VAE tile budget, decode layout) read :func:`current` (the devices of the mesh the program is
traced under, ``jax.set_mesh`` / :func:`animegamer_jax.parallel.sharding_context`), never the host's
``jax.default_backend()``. A program traced on a CPU host for a mesh of compile-only TPU devices
(:func:`compile_devices`) therefore picks the TPU's kernels.

:data:`CHIPS` holds per-chip figures for memory budgets and roofline estimates, each with its source.
:func:`parse_topology` reads the names users rent (Cloud TPU: ``v5p-64``, ``v6e-8``, ``v5e-16``,
``v4-8``; GPU nodes: ``h100-8``, ``4xh100-8`` for 4 nodes; ``cpu-8`` for fake CPU devices) and
:func:`compile_devices` gives compile-only devices for them (jax.experimental.topologies: the real
TPU compiler from libtpu, the real XLA:GPU compiler from jax[cuda12], no accelerator needed).

Knows no model.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys
from typing import Any

import jax
from jax.experimental import topologies


@dataclasses.dataclass(frozen=True)
class Chip:
    """Figures of one accelerator chip (one jax device).

    name: short name (``v5p``, ``h100``); device_kinds: ``jax.Device.device_kind`` strings of this
    chip (exact match, case-insensitive); hbm_bytes: device memory; bf16_flops: dense bf16 peak
    FLOP/s; hbm_bytes_per_s: memory bandwidth; source: where the three figures come from.
    """

    name: str
    device_kinds: tuple[str, ...]
    hbm_bytes: float
    bf16_flops: float
    hbm_bytes_per_s: float
    source: str
    #: links (:data:`LINKS`): the chip's fast interconnect (TPU ICI, GPU NVLink), bidirectional bytes/s per
    #: chip, and its ports (TPU torus links; 0 = a switched fabric, GPU NVLink); the network between slices
    #: / nodes (TPU DCN, GPU InfiniBand), bytes/s per chip in one direction; None = no figure
    fast_bytes_per_s: float | None = None
    fast_ports: int = 0
    network_bytes_per_s: float | None = None
    link_source: str = ""


GIB, GB, TB = 2**30, 1e9, 1e12
#: Per-chip figures (vendor pages; dense, i.e. without structured sparsity). TPU v4 / v5p chips are
#: one jax device each (megacore), though their Cloud names count two TensorCores per chip.
CHIPS: tuple[Chip, ...] = (
    Chip("v4", ("TPU v4",), 32 * GIB, 275e12, 1200 * GB, "cloud.google.com/tpu/docs/v4 (system architecture table)"),
    Chip("v5e", ("TPU v5 lite", "TPU v5e"), 16 * GIB, 197e12, 819 * GB, "cloud.google.com/tpu/docs/v5e (chip specs)"),
    Chip("v5p", ("TPU v5", "TPU v5p"), 95 * GIB, 459e12, 2765 * GB, "cloud.google.com/tpu/docs/v5p (chip specs)"),
    Chip("v6e", ("TPU v6 lite", "TPU v6e"), 32 * GIB, 918e12, 1640 * GB, "cloud.google.com/tpu/docs/v6e (chip specs)"),
    # GPU memory: the device's bytes as XLA's target specs give them (parallel/gpu_targets/*.txtpb,
    # from openxla/xla xla/backends/gpu/target_config/specs/), a little below the marketed size
    Chip("a100", ("NVIDIA A100-SXM4-80GB", "NVIDIA A100"), 85100068864, 312e12, 2039 * GB,
         "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB: BF16 312 TFLOPS dense, 2039 GB/s)"),
    Chip("h100", ("NVIDIA H100 80GB HBM3", "NVIDIA H100"), 84942979072, 989e12, 3.35 * TB,
         "NVIDIA H100 Tensor Core GPU datasheet (SXM5: BF16 1979 TFLOPS with sparsity = 989 dense, 3.35 TB/s)"),
    Chip("h200", ("NVIDIA H200", "H200"), 151397597184, 989e12, 4.8 * TB,
         "NVIDIA H200 Tensor Core GPU datasheet (SXM: BF16 1979 TFLOPS with sparsity = 989 dense, 4.8 TB/s)"),
    Chip("b200", ("NVIDIA B200",), 191514411008, 2250e12, 7.7 * TB,
         "NVIDIA HGX B200 datasheet (per GPU: BF16 4.5 PFLOPS with sparsity = 2.25 dense, 7.7 TB/s)"),
    Chip("v3", ("TPU v3",), 32 * GIB, 123e12, 900 * GB, "cloud.google.com/tpu/docs/v3 (system architecture)"),
    Chip("l40s", ("NVIDIA L40S",), 48 * GB, 362e12, 864 * GB,
         "NVIDIA L40S datasheet (BF16 733 TFLOPS with sparsity = 362 dense, 48 GB GDDR6, 864 GB/s)"),
    Chip("a10g", ("NVIDIA A10G",), 24 * GB, 125e12, 600 * GB,
         "NVIDIA A10 datasheet (BF16 250 TFLOPS with sparsity = 125 dense, 24 GB, 600 GB/s; A10G is AWS's A10)"),
)


#: chip -> (fast interconnect bidirectional bytes/s per chip, its ports, network bytes/s per chip one way,
#: source). TPU ICI is a torus (v5p 3D: 6 links a chip; v6e 2D: 4); GPU NVLink a switched fabric; the
#: network: TPU DCN between slices, the node's InfiniBand NICs between GPU nodes (one NIC per GPU).
LINKS: dict[str, tuple[float, int, float | None, str]] = {
    "v5p": (1200 * GB, 6, 50e9 / 8, "cloud.google.com/tpu/docs/v5p (bidirectional ICI 1200 GBps per chip, "
                                    "3D torus; DCN 50 Gbps per chip)"),
    "v5e": (400 * GB, 4, 2 * 100e9 / 8 / 8, "cloud.google.com/tpu/docs/v5e (bidirectional ICI 400 GBps per chip, "
                                            "4 ICI ports, 2D torus; 2 x 100 Gbps NICs per 8-chip host)"),
    "v6e": (800 * GB, 4, None, "cloud.google.com/tpu/docs/v6e (bidirectional ICI 800 GBps per chip, 4 ICI ports, "
                               "2D torus; no DCN figure)"),
    "a100": (600 * GB, 0, 200e9 / 8, "NVIDIA A100 datasheet (NVLink 600 GB/s); DGX A100 (8 x 200 Gb/s HDR "
                                     "InfiniBand, one per GPU)"),
    "h100": (900 * GB, 0, 400e9 / 8, "NVIDIA H100 datasheet (SXM5 NVLink 900 GB/s); DGX H100 (8 x 400 Gb/s "
                                     "ConnectX-7, one per GPU)"),
    "h200": (900 * GB, 0, 400e9 / 8, "NVIDIA H200 datasheet (NVLink 900 GB/s); DGX H200 (8 x 400 Gb/s "
                                     "ConnectX-7, one per GPU)"),
    "b200": (1800 * GB, 0, 400e9 / 8, "NVIDIA HGX B200 datasheet (NVLink 1.8 TB/s per GPU); DGX B200 (8 x "
                                      "400 Gb/s ConnectX-7, one per GPU)"),
}
CHIPS = tuple(dataclasses.replace(c, fast_bytes_per_s=LINKS[c.name][0], fast_ports=LINKS[c.name][1],
                                  network_bytes_per_s=LINKS[c.name][2], link_source=LINKS[c.name][3])
              if c.name in LINKS else c for c in CHIPS)


def chip_of(device_kind: str) -> Chip | None:
    """The :data:`CHIPS` entry whose ``device_kinds`` holds ``device_kind`` (case-insensitive), else the
    one with the longest kind contained in it ("NVIDIA A100-SXM4-40GB" -> a100, "NVIDIA GH200 480GB" ->
    h200: the family's peak and bandwidth; memory sizes of such variants differ), else None."""
    kind = (device_kind or "").strip().lower()
    for c in CHIPS:
        if kind in (k.lower() for k in c.device_kinds):
            return c
    hits = [(len(k), c) for c in CHIPS for k in c.device_kinds if kind and k.lower() in kind]
    return max(hits, key=lambda h: h[0])[1] if hits else None


def chip_named(name: str) -> Chip:
    """The :data:`CHIPS` entry called ``name`` (``v5p``, ``h100``...). Raises KeyError naming the known ones."""
    for c in CHIPS:
        if c.name == name.lower():
            return c
    raise KeyError(f"unknown chip {name!r}; known: {', '.join(c.name for c in CHIPS)}")


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a program runs: ``platform`` ("tpu", "gpu" or "cpu"), the device kind and its chip figures."""

    platform: str
    device_kind: str
    chip: Chip | None

    @property
    def hbm_bytes(self) -> float | None:
        return None if self.chip is None else self.chip.hbm_bytes


def _platform(name: str) -> str:
    name = (name or "").lower()
    return "gpu" if name in ("gpu", "cuda", "rocm") else name


def of_device(device: Any) -> Target:
    """The :class:`Target` of a ``jax.Device`` (or an ``AbstractDevice``)."""
    kind = str(getattr(device, "device_kind", "") or "")
    return Target(_platform(getattr(device, "platform", "")), kind, chip_of(kind))


def current(mesh: Any = None) -> Target:
    """The target of ``mesh`` (a ``Mesh`` or ``AbstractMesh``), else of the active mesh (inside
    ``jax.set_mesh`` / ``sharding_context``, also inside its ``shard_map``), else of ``jax.devices()[0]``
    (a program with no mesh runs on the default device)."""
    if mesh is None:
        m = jax.sharding.get_abstract_mesh()
        mesh = None if m is None or m.empty else m
    if mesh is not None:
        dev = getattr(mesh, "abstract_device", None)
        if dev is None and getattr(mesh, "devices", None) is not None:
            dev = mesh.devices.flat[0]
        if dev is not None and getattr(dev, "platform", None):
            return of_device(dev)
    return of_device(jax.devices()[0])


def of_arrays(tree: Any) -> Target:
    """The target of the devices holding the first array of ``tree`` (e.g. a model's parameters),
    else :func:`current`."""
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.core.Tracer):  # traced: the mesh the program is traced under decides
            break
        sharding = getattr(leaf, "sharding", None)
        try:
            devices = getattr(sharding, "device_set", None) if sharding is not None else None
        except ValueError:  # a sharding over an abstract mesh has no devices: the active mesh decides
            break
        if devices:
            return of_device(next(iter(devices)))
    return current()


# ---------------------------------------------------------------------------------------------
# Named topologies and compile-only devices.


@dataclasses.dataclass(frozen=True)
class Topology:
    """A named target: ``kind`` ("tpu", "gpu", "cpu"), ``chip`` (None for cpu), ``num_devices`` in
    all (over every slice / node), ``spec`` (what jax.experimental.topologies takes: ``v5p:2x4x4`` for
    TPU, ``1x4x8`` = partitions x hosts x devices per host for GPU), ``num_slices`` (TPU multislice),
    and ``name`` as the user wrote it."""

    name: str
    kind: str
    chip: Chip | None
    num_devices: int
    spec: str
    num_slices: int = 1


#: TPU chips per slice -> physical topology (Cloud TPU docs' default shapes)
_TPU_2D = {4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_TPU_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8",
           512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16", 4096: "16x16x16"}
#: Cloud TPU names count TensorCores for v4 / v5p (2 per chip) and chips for v5e / v6e
_CORES_PER_CHIP = {"v4": 2, "v5p": 2, "v5e": 1, "v6e": 1}
_TPU_PREFIX = {"v4": "v4", "v5p": "v5p", "v5e": "v5e", "v5litepod": "v5e", "v6e": "v6e"}
_GPU = {"a100", "h100", "h200", "b200"}


def parse_topology(name: str, num_slices: int = 1) -> Topology:
    """Reads ``v5p-64`` (Cloud TPU accelerator type), ``h100-8`` / ``4xh100-8`` (nodes x GPUs per node)
    or ``cpu-8`` (fake CPU devices); ``num_slices`` > 1 for TPU multislice.

    Raises: ValueError naming the accepted forms.
    """
    n = name.strip().lower()
    m = re.fullmatch(r"(v4|v5p|v5e|v5litepod|v6e)-(\d+)", n)
    if m:
        chip = chip_named(_TPU_PREFIX[m.group(1)])
        count = int(m.group(2))
        per = _CORES_PER_CHIP[chip.name]
        if count % per:
            raise ValueError(f"topology {name!r}: {chip.name} names count {per} cores per chip; "
                             f"use a multiple of {per}")
        chips = count // per
        shapes = _TPU_3D if chip.name in ("v4", "v5p") else _TPU_2D
        if chips == 1 and chip.name in ("v5e", "v6e"):
            spec = f"{chip.name}:2x2"  # a 1x1 topology is refused; one chip is the first of a 2x2
        elif chips in shapes:
            spec = f"{chip.name}:{shapes[chips]}"
        else:
            raise ValueError(f"topology {name!r}: no {chip.name} slice of {chips} chips; use one of "
                             f"{', '.join(f'{chip.name}-{c * per}' for c in shapes)}")
        return Topology(name, "tpu", chip, chips * max(1, num_slices), spec, max(1, num_slices))
    m = re.fullmatch(r"(?:(\d+)x)?(a100|h100|h200|b200)-(\d+)", n)
    if m:
        nodes, per = int(m.group(1) or 1), int(m.group(3))
        if num_slices != 1:
            raise ValueError(f"topology {name!r}: --num_slices is for TPU; write {num_slices * nodes}x"
                             f"{m.group(2)}-{per} for {num_slices * nodes} GPU nodes")
        return Topology(name, "gpu", chip_named(m.group(2)), nodes * per, f"1x{nodes}x{per}")
    m = re.fullmatch(r"cpu-(\d+)", n)
    if m:
        if int(m.group(1)) < 1 or num_slices != 1:
            raise ValueError(f"topology {name!r}: cpu-N takes N >= 1 fake CPU devices and no --num_slices")
        return Topology(name, "cpu", None, int(m.group(1)), f"cpu:{m.group(1)}")
    raise ValueError(f"unknown topology {name!r}; use a Cloud TPU name (v4-8, v5e-16, v5p-64, v6e-8, v6e-1: v4 / v5p "
                     f"names count 2 TensorCores per chip, v5e / v6e count chips), a GPU node "
                     f"({', '.join(sorted(_GPU))}-8, or 4xh100-8 for 4 nodes) or cpu-N (fake CPU devices)")


def _gpu_target_text(chip: Chip) -> str:
    path = os.path.join(os.path.dirname(__file__), "gpu_targets", f"{chip.name}.txtpb")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no GPU target spec for {chip.name}")
    with open(path, encoding="utf-8") as f:
        return f.read()


#: where ``make tpu-compiler`` puts libtpu: beside the environment, not on its import path, so that
#: ordinary CPU runs do not probe for a TPU (an importable libtpu makes every jax start look for one)
SIDE_LIBTPU = os.path.join(sys.prefix, "tpu-compiler", "libtpu", "libtpu.so")


def tpu_compiler_available() -> bool:
    """True when libtpu (the TPU compiler) can be loaded: ``TPU_LIBRARY_PATH``, the ``libtpu`` package
    (``pip install 'jax[tpu]==0.10.2'``) or :data:`SIDE_LIBTPU`; sets ``TPU_LIBRARY_PATH`` for the last."""
    path = os.environ.get("TPU_LIBRARY_PATH")
    if path and os.path.isfile(path):
        return True
    if importlib.util.find_spec("libtpu") is not None:
        return True
    if os.path.isfile(SIDE_LIBTPU):
        os.environ["TPU_LIBRARY_PATH"] = SIDE_LIBTPU
        return True
    return False


def _quiet_libtpu(topo: Topology) -> None:
    """Environment for loading libtpu on a host that is no TPU VM (defaults only; a user's values win):
    several processes may load it (compiles only), no metadata-server query (this host has none), and
    the worker / accelerator type it would otherwise probe for and warn about (the topology's own)."""
    chip, dims = topo.spec.split(":")
    chips = 1
    for d in dims.split("x"):
        chips *= int(d)
    accel = f"v5litepod-{chips}" if chip == "v5e" else f"{chip}-{chips * _CORES_PER_CHIP[chip]}"
    for k, v in (("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"), ("TPU_SKIP_MDS_QUERY", "1"), ("TPU_ACCELERATOR_TYPE", accel),
                 ("TPU_WORKER_HOSTNAMES", "localhost"), ("TPU_WORKER_ID", "0")):
        os.environ.setdefault(k, v)


def compile_devices(topo: Topology) -> list[Any]:
    """Compile-only devices of ``topo`` (nothing runs on them; ``jit(...).lower(...).compile()`` does),
    or the host's CPU devices for ``cpu-N`` (which need ``--xla_force_host_platform_device_count``).

    Raises: RuntimeError naming the install that is missing (libtpu for TPU, jax[cuda12] for GPU) or
    the device-count flag.
    """
    if topo.kind == "cpu":
        devs = [d for d in jax.devices("cpu")]
        if len(devs) < topo.num_devices:
            raise RuntimeError(f"topology {topo.name}: {len(devs)} CPU devices; set XLA_FLAGS="
                               f"--xla_force_host_platform_device_count={topo.num_devices} before jax starts")
        return devs[:topo.num_devices]
    if topo.kind == "tpu":
        if not tpu_compiler_available():
            raise RuntimeError("the TPU compiler (libtpu) is not installed: pip install 'jax[tpu]==0.10.2' "
                               "(or `make tpu-compiler`)")
        _quiet_libtpu(topo)
        kw = {"num_slices": topo.num_slices} if topo.num_slices > 1 else {}
        devs = list(topologies.get_topology_desc(platform="tpu", topology_name=topo.spec, **kw).devices)
        return devs[:topo.num_devices]
    try:
        # the CUDA plugin takes the shape as its "topology" option (topology_name is only a label)
        desc = topologies.get_topology_desc(platform="cuda", topology=topo.spec,
                                            target_config=_gpu_target_text(topo.chip))
    except (RuntimeError, NotImplementedError, ValueError) as e:
        raise RuntimeError(f"topology {topo.name}: XLA:GPU compile-only devices need jax[cuda12]==0.10.2 "
                           f"(`make aot-gpu`): {type(e).__name__}: {str(e).splitlines()[0]}") from e
    return list(desc.devices)


__all__ = ["CHIPS", "Chip", "LINKS", "Target", "Topology", "chip_named", "chip_of", "compile_devices", "current",
           "of_arrays", "of_device", "parse_topology", "tpu_compiler_available"]
