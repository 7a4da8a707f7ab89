"""Training observability: clu metric averages, TensorBoard summaries, throughput and MFU.

Decision (README "Environment notes"): ``clu.metric_writers`` imports TensorFlow, which we do not
install, so summaries are written with ``tensorboardX`` (pure Python, same event format; open with
``tensorboard --logdir WORKDIR/tensorboard``). ``clu.metrics`` (no TF) averages the per-step scalars
between summaries. Only process 0 writes.

MFU = (model FLOPs of one train step per device) / (step seconds x peak FLOP/s per device). The FLOPs
are counted on the loss's jaxpr (train/model_flops.py: each matmul once, forward + backward of what
trains and passes gradients; no remat recompute, no frozen forwards; XLA's own cost analysis counts a
scanned layer once); the peak comes from
``config.train.peak_tflops_per_device`` or the device kind (dense bf16 figures); unknown kinds
(CPU) report no MFU.
"""

from __future__ import annotations

import io
import struct
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from clu import metrics as clu_metrics
from tensorboardX import record_writer
from tensorboardX import summary as tbx_summary
from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto import summary_pb2
from tensorboardX.proto import event_pb2

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.parallel import target

def peak_flops_per_device(configured_tflops: float = 0.0, device: jax.Device | None = None) -> float | None:
    """Peak FLOP/s of one device: the configured value if > 0, else its chip's dense bf16 peak
    (``parallel.target.CHIPS``, by device kind), else None."""
    if configured_tflops > 0:
        return configured_tflops * 1e12
    chip = target.of_device(device or jax.devices()[0]).chip
    return None if chip is None else chip.bf16_flops


def make_collection(names: Sequence[str]) -> type[clu_metrics.Collection]:
    """A clu ``Collection`` averaging every named scalar (``Average.from_output(name)``)."""
    return clu_metrics.Collection.create(**{n: clu_metrics.Average.from_output(n) for n in names})


class MetricAverager:
    """Accumulates per-step scalar dicts with clu ``Average`` metrics and hands out their means."""

    def __init__(self):
        self._coll = None
        self._cls = None

    def update(self, values: Mapping[str, Any]) -> None:
        values = {k: np.asarray(v, np.float32) for k, v in values.items()}
        if self._cls is None:
            self._cls = make_collection(sorted(values))
        single = self._cls.single_from_model_output(**values)
        self._coll = single if self._coll is None else self._coll.merge(single)

    def compute_and_reset(self) -> dict[str, float]:
        if self._coll is None:
            return {}
        out = {k: float(v) for k, v in self._coll.compute().items()}
        self._coll = None
        return out


class _URLRecordWriter:
    """tensorboardX record writer for URLs (``gs://`` ...) through epath/fsspec.

    Object stores cannot append, so every flush uploads the whole event file again (what
    tensorboardX's own GCS writer does); one object per run phase, a few hundred KB at most. Used
    instead of tensorboardX's google-cloud-storage writer so that every GCS access of this package
    goes through one client (and honours ``STORAGE_EMULATOR_HOST`` the same way).
    """

    def __init__(self, path: str):
        self.path = paths.as_path(path)
        self.buffer = io.BytesIO()

    def write(self, data: bytes) -> None:
        self.buffer.write(data)

    def flush(self) -> None:
        self.path.write_bytes(self.buffer.getvalue())

    def close(self) -> None:
        self.flush()


class _URLRecordWriterFactory:
    def open(self, path: str) -> _URLRecordWriter:
        return _URLRecordWriter(path)

    def directory_check(self, path: str) -> None:
        fileio.makedirs(path)


def _register_url_writers() -> None:
    for scheme in ("gs", "s3", "az", "hf"):
        record_writer.register_writer_factory(scheme, _URLRecordWriterFactory())


class SummaryWriter:
    """TensorBoard scalars under ``logdir`` (a local path or a URL); no-op on processes != 0.

    Every :meth:`write_scalars` / :meth:`write_text` is on disk when it returns (the event file
    flushed): events go straight to tensorboardX's ``EventsWriter``, not through
    ``tensorboardX.SummaryWriter``'s queue and logger thread, whose ``flush`` does not wait for the
    queue, so a run killed after a checkpoint could lose the summaries of the steps before it.
    """

    def __init__(self, logdir: str):
        self.logdir = str(paths.as_path(logdir))
        self._writer = None
        if jax.process_index() == 0:
            _register_url_writers()
            fileio.makedirs(self.logdir)
            self._writer = EventsWriter(paths.join(self.logdir, "events"), "")
            self._writer.flush()  # the event file exists from the start (on object stores too)

    def _write(self, step: int, summary: Any) -> None:
        self._writer.write_event(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))
        self._writer.flush()

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        if self._writer is None:
            return
        self._write(step, summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=k, simple_value=float(v))
                                                     for k, v in scalars.items()]))

    def write_text(self, step: int, tag: str, text: str) -> None:
        if self._writer is not None:
            self._write(step, tbx_summary.text(tag, text))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """All scalars of the event files under ``logdir`` as ``{tag: [(step, value), ...]}``.

    Parses the TFRecord framing (u64 length, u32 crc, payload, u32 crc) with tensorboardX's
    ``Event`` proto, so no TensorFlow / tensorboard install is needed (for tests and tools).
    """
    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(paths.as_path(logdir).iterdir()):
        if "tfevents" not in path.name:
            continue
        data = path.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            payload = data[pos + 12:pos + 12 + length]
            pos += 12 + length + 4
            event = event_pb2.Event.FromString(payload)
            for v in event.summary.value:
                if v.HasField("simple_value"):
                    out.setdefault(v.tag, []).append((int(event.step), float(v.simple_value)))
    return out
