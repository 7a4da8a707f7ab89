"""SystemWriter: a system checkpoint written leaf by leaf, or one layer of a stacked leaf at a time.

For conversions whose weights do not fit in memory (``convert release``). The files are the ones
orbax writes for :func:`~animegamer_jax.checkpoint.store.save_system`'s layout without OCDBT, so
:func:`~animegamer_jax.checkpoint.store.load_system` reads them like any other checkpoint.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np
import tensorstore

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.config import config_to_json
from animegamer_jax.checkpoint.errors import SystemCheckpointError
from animegamer_jax.checkpoint.integrity import write_integrity
from animegamer_jax.checkpoint.store import FORMAT_VERSION, pure_dict

#: orbax's handler names recorded in ``_CHECKPOINT_METADATA`` (what orbax's own writer records)
PYTREE_HANDLER = "orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler"
JSON_HANDLER = "orbax.checkpoint._src.handlers.json_checkpoint_handler.JsonCheckpointHandler"


class SystemWriter:
    """Writes a system checkpoint (the ``save_system`` layout) leaf by leaf, or layer by layer.

    Each component is an orbax PyTree item stored without OCDBT: one zarr array per leaf (named by
    its key path, zstd, as orbax writes a ``np.ndarray`` leaf) plus ``_METADATA``; ``load_system``
    restores it like any other item (orbax detects the format). A stacked ``[L, ...]`` leaf can be
    written one layer at a time, so memory is bounded by one layer of one leaf. Nothing is final
    until :meth:`finish`::

        w = SystemWriter(tmp_dir, config)
        w.add("vae", ("decoder", "conv_in", "conv", "kernel"), array)     # a whole leaf
        put = w.stacked("dit", ("blocks", "attn1", "to_q", "kernel"), (30, 1920, 30, 64), "float32")
        for l in range(30): put(l, layer_l)                              # one layer at a time
        w.finish()                                                       # then rename tmp_dir

    Args:
      directory: new directory (must not exist), normally a temporary sibling of the target; or a
        URL (``gs://bucket/system``: tensorstore's ``gcs`` kvstore, other schemes as tensorstore
        URLs), written in place since object stores cannot rename a folder; ``integrity.json``,
        written last by :meth:`finish`, marks it complete (``store.is_complete``).
      config: the config every component was built from (saved as JSON).

    Raises:
      SystemCheckpointError: ``directory`` exists, a leaf path given twice, a write after
        :meth:`finish`.
    """

    #: target size of one zarr chunk of a whole leaf (bytes); :meth:`add` waits once 4 x this is in flight
    CHUNK_BYTES = 64 << 20

    def __init__(self, directory: str, config: ml_collections.ConfigDict):
        self.directory = str(paths.as_path(directory))
        if fileio.exists(self.directory):
            raise SystemCheckpointError(f"{self.directory} exists; SystemWriter writes a new directory")
        fileio.makedirs(self.directory)
        self.config = config
        self._tree: dict[str, dict[str, Any]] = {}
        self.counts: dict[str, int] = {}
        self._pending: list[tuple[Any, Any]] = []  # (write future, source array kept alive)
        self._pending_bytes = 0
        self._done = False

    def _open(self, name: str, path: tuple, shape: tuple[int, ...], dtype: Any, chunks: tuple[int, ...]):
        if self._done:
            raise SystemCheckpointError("SystemWriter: write after finish")
        keys = tuple(str(k) for k in path)
        tree = self._tree.setdefault(name, {})
        if str(keys) in tree:
            raise SystemCheckpointError(f"component {name!r}: leaf {'/'.join(keys)} written twice")
        tree[str(keys)] = {"key_metadata": [{"key": k, "key_type": 2} for k in keys],
                           "value_metadata": {"value_type": "np.ndarray", "skip_deserialize": False}}
        self.counts[name] = self.counts.get(name, 0) + int(np.prod(shape))
        dt = np.dtype(dtype)
        spec = {"driver": "zarr", "kvstore": _kvstore(paths.join(self.directory, name, ".".join(keys))),
                "metadata": {"shape": list(shape), "chunks": list(chunks),
                             "dtype": "bfloat16" if dt.name == "bfloat16" else dt.str,
                             "compressor": {"id": "zstd", "level": 1}, "dimension_separator": "."},
                "create": True}
        return tensorstore.open(spec).result(), dt

    def _chunks(self, shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
        """Whole rows of the leading axis, up to :attr:`CHUNK_BYTES` per chunk."""
        if len(shape) < 2:
            return tuple(shape) or ()
        row = int(np.prod(shape[1:])) * itemsize
        return (max(1, min(shape[0], self.CHUNK_BYTES // max(row, 1))),) + tuple(shape[1:])

    def add(self, name: str, path: tuple, array: Any) -> None:
        """Writes one whole leaf of component ``name`` (numpy / jax array, stored in its dtype)."""
        arr = np.asarray(array, order="C")  # (ascontiguousarray would make a 0-d leaf 1-d)
        store, _ = self._open(name, path, arr.shape, arr.dtype, self._chunks(arr.shape, arr.dtype.itemsize))
        self._pending.append((store.write(arr), arr))
        self._pending_bytes += arr.nbytes
        if self._pending_bytes > self.CHUNK_BYTES * 4:
            self.wait()

    def wait(self) -> None:
        """Waits for every pending write (:meth:`add` waits by itself past 4 x :attr:`CHUNK_BYTES` in flight)."""
        for fut, _ in self._pending:
            fut.result()
        self._pending, self._pending_bytes = [], 0

    def stacked(self, name: str, path: tuple, shape: tuple[int, ...], dtype: Any) -> Callable[[int, Any], None]:
        """Opens a ``[L, ...]`` leaf; returns ``put(l, value)`` writing layer ``l`` (cast to ``dtype``)."""
        dt = np.dtype(dtype)
        store, dt = self._open(name, path, tuple(shape), dt, (1,) + tuple(shape[1:]))

        def put(l: int, value: Any) -> None:
            store[l].write(np.asarray(value).astype(dt, copy=False)).result()

        return put

    def add_state(self, name: str, state: Any) -> None:
        """Writes every leaf of an ``nnx.State`` / module / pure dict."""
        for path, leaf in jax.tree_util.tree_flatten_with_path(pure_dict(state))[0]:
            self.add(name, tuple(getattr(p, "key", getattr(p, "idx", p)) for p in path), leaf)

    def finish(self) -> str:
        """Writes each item's ``_METADATA``, the config, the manifest, orbax's checkpoint metadata and,
        last, ``integrity.json``; returns the directory."""
        self.wait()
        handlers = {}
        d = self.directory
        for n, tree in self._tree.items():
            fileio.write_text_atomic(paths.join(d, n, "_METADATA"), json.dumps(
                {"tree_metadata": tree, "use_ocdbt": False, "use_zarr3": False,
                 "store_array_data_equal_to_fill_value": True, "custom_metadata": None}))
            _commit(paths.join(d, n))
            handlers[n] = PYTREE_HANDLER
        manifest = {"format": FORMAT_VERSION, "components": sorted(self._tree), "param_counts": self.counts}
        for n, payload in (("config", config_to_json(self.config)), ("manifest", manifest)):
            fileio.makedirs(paths.join(d, n))
            fileio.write_text_atomic(paths.join(d, n, "metadata"), json.dumps(payload))
            _commit(paths.join(d, n))
            handlers[n] = JSON_HANDLER
        now = time.time_ns()
        fileio.write_text_atomic(paths.join(d, "_CHECKPOINT_METADATA"), json.dumps(
            {"item_handlers": handlers, "metrics": {}, "performance_metrics": {},
             "init_timestamp_nsecs": now, "commit_timestamp_nsecs": now, "custom_metadata": {}}))
        _commit(d)
        write_integrity(self.directory)  # last, as save_system does (load_system requires it)
        self._done = True
        return self.directory


def _commit(directory: str) -> None:
    """orbax's marker of a finished item / checkpoint (``commit_success.txt``)."""
    fileio.write_text_atomic(paths.join(directory, "commit_success.txt"),
                             f"Checkpoint commit was successful to {directory}")


def _kvstore(path: str) -> dict | str:
    """tensorstore kvstore spec of a local path or a URL (``gs://b/p``: the ``gcs`` driver, which
    honours ``TENSORSTORE_GCS_HTTP_URL``, paths.configure_gcs_emulator; else a tensorstore URL)."""
    if not paths.is_url(path):
        return {"driver": "file", "path": path}
    if path.startswith("gs://"):
        bucket, _, key = path[len("gs://"):].partition("/")
        return {"driver": "gcs", "bucket": bucket, "path": key.rstrip("/") + "/"}
    return path.rstrip("/") + "/"
