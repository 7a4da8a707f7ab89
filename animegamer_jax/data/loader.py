"""Grain input pipelines over a prepared clip dataset (a tfds dataset, data/datasets.py), read through
tfds data sources.

Two kinds of example:
- mode "clips" (decoder training, phases a1/a2/c): one clip per example,
    frames uint8 [T, H, W, 3], first_frame uint8 [H, W, 3], frame_times float32 [T],
    states int32 [4] = [ML, SC, ET, ST], motion_level int32 [], motion_scope float32 [],
    index / film clip_index / scene_id int32 [], start_time / end_time float32 [] (s),
    instruction / action / background / film_id str, characters str (names joined by ", "),
    plus every precomputed feature field of the dataset.
- mode "turns" (MLLM training, phase b): a run of 1..max_turns consecutive clips of ONE film (paper
  Sec. 3.4 / App. C: "random-length subset"; docs/data.md#multi-turn-examples). The length is drawn per
  example from grain's per-record RNG (so it changes across epochs yet is reproducible from the
  seed). Fields are padded to max_turns so examples batch:
    num_turns int32 [], turn_mask bool [max_turns], index int32 [max_turns] (dataset index, -1 pad),
    clip_index int32 [max_turns] (index in the film, -1 pad), states int32 [max_turns, 4] (0 pad),
    instruction str [max_turns] ("" pad), action str [max_turns] ("" pad: the clip's action text, which
    E_a's T5 input is in every phase, docs/encoders.md#t5-action-text), film_id str, feature fields
    [max_turns, ...] (0 pad),
    and with include_frames=True frames [max_turns, T, H, W, 3], first_frame [max_turns, H, W, 3].
  The last turn is the one to predict; earlier turns are its history. Tokenizing into the MLLM layout
  is a separate transform (`TokenizeTurns`), since the MLLM owns the exact sequence / mask layout.

Sharding: grain's IndexSampler splits the record range into `shard_count` contiguous, disjoint parts
(drop_remainder=True, so every process gets the same number of examples); by default one part per JAX
process (ShardByJaxProcess). In "turns" mode the sequence STARTS are sharded; a sequence may read up
to max_turns-1 clips past its shard's end.
Shuffling: a seeded global shuffle per epoch. Workers: `worker_count` grain worker processes (spawned;
every transform here is a top-level class). Checkpointing: `it = iter(loader)`; `it.get_state()` returns
bytes to save beside the training checkpoint; `it.set_state(state)` on a fresh iterator of an identically
built loader resumes exactly at the next batch. In an orbax CheckpointManager the iterator is one more
item: `args=ocp.args.Composite(..., data_iter=grain.checkpoint.CheckpointSave(it))` to save and
`grain.checkpoint.CheckpointRestore(it)` to restore (one JSON file per process).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import grain
import numpy as np

from animegamer_jax.tokenizers import mllm_tokenizer

from animegamer_jax.io import paths
from animegamer_jax.data import datasets

#: metadata.json format of a feature dataset (clip_dataset/features.py FORMAT)
FEATURES_FORMAT = "animegamer_jax.features/2"

# Per-clip fields that are not precomputed features; turns mode carries only the per-turn ones.
_CLIP_ARRAYS = ("frames", "first_frame", "frame_times", "states", "motion_scope")


class ClipSource(grain.sources.RandomAccessDataSource):
    """Random access to the clips of one split of a prepared dataset (picklable for grain workers: the
    tfds data sources are opened again in each process).

    Records are returned as today's loaders read them: text fields as str, ``characters`` joined by
    ", ", ``first_frame`` = frames[0], ``index`` the record index in the split, and with
    ``features_dir`` every field of the feature dataset's record of the same index (f_v, f_md).

    Args:
      dataset_dir: prepared dataset (``datasets.find``).
      skip_fields: record fields not to return (e.g. ("frames",) when only features are needed).
      split: "train" or "heldout".
      features_dir: a feature dataset of this split (data/extract_features.py), or "".

    Raises:
      datasets.DatasetError: no dataset / split, or a feature dataset of another size.
    """

    def __init__(self, dataset_dir: str, skip_fields: Sequence[str] = (), split: str = "train",
                 features_dir: str = ""):
        self.dataset_dir = dataset_dir if "://" in dataset_dir else os.path.abspath(paths.resource(dataset_dir))
        self.split, self.features_dir = split, features_dir
        self.index = datasets.read_index(self.dataset_dir, split)
        self.skip_fields = tuple(skip_fields)
        self._open()
        if len(self._src) != self.index["num_clips"]:
            raise datasets.DatasetError(f"{self.dataset_dir}: split {split} holds {len(self._src)} records, "
                                        f"its metadata says {self.index['num_clips']}")
        if features_dir:
            self._check_features()
        if self._features is not None and len(self._features) != len(self._src):
            raise datasets.DatasetError(f"{features_dir}: {len(self._features)} feature records for the "
                                        f"{len(self._src)} clips of {self.dataset_dir} ({split}); extract them again")
        if self._features is not None:
            self.index = {**self.index, "feature_fields": sorted(k for k in self._features[0] if k != "index")}

    def _check_features(self) -> None:
        """The feature dataset must be one (format) of this very split (its recorded clip fingerprint)."""
        meta = datasets.metadata(self.features_dir)
        if meta.get("format") != FEATURES_FORMAT:
            raise datasets.DatasetError(f"{self.features_dir}: not a feature dataset (format {meta.get('format')!r}); "
                                        f"build one with `python -m animegamer_jax.commands.data extract-features`")
        want = datasets.dataset_fingerprint(self.index)
        have = meta.get("splits", {}).get(self.split, {}).get("fingerprint")
        if have != want:
            raise datasets.DatasetError(
                f"{self.features_dir}: features of another clip dataset ({meta.get('dataset')}, split {self.split} "
                f"{have}) than {self.dataset_dir} ({want}); extract them again with "
                f"`python -m animegamer_jax.commands.data extract-features --dataset={self.dataset_dir}`")

    def _open(self) -> None:
        self._src = datasets.open_split(self.dataset_dir, self.split)
        self._features = datasets.open_split(self.features_dir, self.split) if self.features_dir else None

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_src", "_features")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._open()

    def __len__(self) -> int:
        return int(self.index["num_clips"])

    def __getitem__(self, record_key: int) -> dict:
        raw = self._src[int(record_key)]
        rec = {k: (v.decode("utf-8") if isinstance(v, bytes) else v) for k, v in raw.items()}
        rec["characters"] = ", ".join(c.decode("utf-8") if isinstance(c, bytes) else str(c)
                                      for c in raw["characters"])
        rec["first_frame"] = rec["frames"][0]
        rec["index"] = np.int32(record_key)
        for name in ("scene_id", "clip_index", "motion_level"):  # tfds data sources give Python scalars
            rec[name] = np.int32(rec[name])
        for name in ("start_time", "end_time", "motion_scope"):
            rec[name] = np.float32(rec[name])
        if self._features is not None:
            feats = self._features[int(record_key)]
            if int(feats["index"]) != int(record_key):
                raise datasets.DatasetError(f"{self.features_dir}: record {record_key} holds the features of "
                                            f"clip {int(feats['index'])}; extract them again")
            rec.update({k: v for k, v in feats.items() if k != "index"})
        for name in self.skip_fields:
            rec.pop(name, None)
        return rec

    def __repr__(self) -> str:
        return f"ClipSource({self.dataset_dir!r}, {self.split}, {len(self)} clips)"


class StartSource(grain.sources.RandomAccessDataSource):
    """Record i = the index of the clip that starts multi-turn sequence i (every clip starts one)."""

    def __init__(self, num_clips: int):
        self.num_clips = int(num_clips)

    def __len__(self) -> int:
        return self.num_clips

    def __getitem__(self, record_key: int) -> int:
        return int(record_key)

    def __repr__(self) -> str:
        return f"StartSource({self.num_clips})"


@dataclasses.dataclass
class SampleTurns(grain.transforms.RandomMap):
    """Start clip index -> padded multi-turn example (see the module docstring for the fields).

    The number of turns is 1 + rng.integers(min(max_turns, clips left in the film from the start)).
    """

    dataset_dir: str
    max_turns: int = 5
    include_frames: bool = False
    split: str = "train"
    features_dir: str = ""

    def __post_init__(self):
        skip = () if self.include_frames else ("frames", "first_frame")
        self._clips = ClipSource(self.dataset_dir, skip_fields=skip, split=self.split, features_dir=self.features_dir)
        rows = self._clips.index["clips"]
        films = [r["film_id"] for r in rows]
        # Clips left in the same film from each index (films are contiguous runs of records).
        left = np.ones(len(rows), np.int64)
        for i in range(len(rows) - 2, -1, -1):
            if films[i] == films[i + 1]:
                left[i] = left[i + 1] + 1
        self._left = left
        self._features = tuple(self._clips.index.get("feature_fields", ()))

    def random_map(self, element: int, rng: np.random.Generator) -> dict:
        start = int(element)
        n = 1 + int(rng.integers(min(self.max_turns, int(self._left[start]))))
        recs = [self._clips[start + k] for k in range(n)]
        m = self.max_turns
        out = {
            "num_turns": np.int32(n),
            "turn_mask": np.arange(m) < n,
            "index": np.full(m, -1, np.int32),
            "clip_index": np.full(m, -1, np.int32),
            "states": np.zeros((m, 4), np.int32),
            "instruction": np.array([""] * m, dtype=object),
            "action": np.array([""] * m, dtype=object),
            "film_id": recs[0]["film_id"],
        }
        arrays = list(self._features) + (["frames", "first_frame"] if self.include_frames else [])
        for name in arrays:
            first = np.asarray(recs[0][name])
            out[name] = np.zeros((m, *first.shape), first.dtype)
        for k, rec in enumerate(recs):
            out["index"][k] = rec["index"]
            out["clip_index"][k] = rec["clip_index"]
            out["states"][k] = rec["states"]
            out["instruction"][k] = rec["instruction"]
            out["action"][k] = rec["action"]
            for name in arrays:
                out[name][k] = rec[name]
        out["instruction"] = out["instruction"].astype(str)
        out["action"] = out["action"].astype(str)
        return out


def _shard_options(shard_index: int | None, shard_count: int | None):
    if shard_index is None and shard_count is None:
        return grain.sharding.ShardByJaxProcess(drop_remainder=True)
    if shard_index is None or shard_count is None or not 0 <= shard_index < shard_count:
        raise ValueError(f"need 0 <= shard_index < shard_count, got {shard_index}, {shard_count}")
    return grain.sharding.ShardOptions(shard_index=shard_index, shard_count=shard_count, drop_remainder=True)


def make_loader(dataset_dir: str, *, mode: str = "clips", batch_size: int | None = None, seed: int = 0,
                shuffle: bool = True, num_epochs: int | None = None, shard_index: int | None = None,
                shard_count: int | None = None, worker_count: int = 0, max_turns: int = 5,
                include_frames: bool | None = None, drop_remainder: bool = True,
                extra_operations: Sequence = (), read_threads: int = 2,
                prefetch: int = 16, split: str = "train", features_dir: str = "") -> grain.DataLoader:
    """Builds a grain DataLoader over a prepared dataset.

    Args:
      dataset_dir: prepared dataset (prepare.py).
      mode: "clips" (one clip per example) or "turns" (multi-turn sequences of one film).
      batch_size: examples per batch per process (None: unbatched examples).
      seed: shuffle seed (also seeds the per-example turn counts).
      shuffle: global seeded shuffle per epoch.
      num_epochs: None = repeat forever.
      shard_index, shard_count: this process's shard; both None = one shard per JAX process.
      worker_count: grain worker processes (0 = in this process).
      max_turns: longest multi-turn example ("turns" mode).
      include_frames: "turns" mode: also return frames (default False); "clips" mode: frames always.
      drop_remainder: drop the last incomplete batch.
      extra_operations: grain transforms applied per example before batching (e.g. TokenizeTurns).
      read_threads, prefetch: grain ReadOptions (threads reading records, examples read ahead); grain's
        defaults (16, 500) would decode hundreds of clips ahead of need.
      split: the dataset's split ("train", or "heldout" where the config names held-out films).
      features_dir: precomputed f_v / f_md of the same split (data/extract_features.py), or "".

    Raises:
      datasets.DatasetError: not a prepared dataset (or split); ValueError: bad mode / shard arguments.
    """
    shard = _shard_options(shard_index, shard_count)
    if mode == "clips":
        source = ClipSource(dataset_dir, split=split, features_dir=features_dir)
        ops: list = []
    elif mode == "turns":
        source = StartSource(datasets.read_index(dataset_dir, split)["num_clips"])
        ops = [SampleTurns(dataset_dir if "://" in dataset_dir else os.path.abspath(paths.resource(dataset_dir)),
                           max_turns, bool(include_frames), split, features_dir)]
    else:
        raise ValueError(f"mode must be 'clips' or 'turns', got {mode!r}")
    ops.extend(extra_operations)
    if batch_size:
        ops.append(grain.transforms.Batch(batch_size, drop_remainder=drop_remainder))
    sampler = grain.samplers.IndexSampler(len(source), shard_options=shard, shuffle=shuffle,
                                          num_epochs=num_epochs, seed=seed)
    read = grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=prefetch)
    return grain.DataLoader(data_source=source, sampler=sampler, operations=ops, worker_count=worker_count,
                            read_options=read)


def make_loader_from_config(cfg, *, mode: str, batch_size: int | None, **kwargs) -> grain.DataLoader:
    """make_loader with dataset_dir, split, features_dir, seed, workers and max_turns from the `data` config
    section."""
    d = cfg.data if "data" in cfg else cfg
    kwargs.setdefault("seed", int(d.get("shuffle_seed", 0)))
    kwargs.setdefault("worker_count", int(d.num_workers))
    kwargs.setdefault("max_turns", int(d.max_turns))
    kwargs.setdefault("split", str(d.get("split", "train")))
    kwargs.setdefault("features_dir", str(d.get("features_dir", "")))
    return make_loader(d.dataset_dir, mode=mode, batch_size=batch_size, **kwargs)


@dataclasses.dataclass
class TokenizeTurns(grain.transforms.Map):
    """Adds token ids to a "turns" example (thin: the MLLM module assembles the full sequence).

    Added fields (padding turns are all PAD_ID = 0, length 0):
      turn_ids int32 [max_turns, max_text_tokens]: `<TURN>` + the instruction's tokens, exactly as the
        release tokenizes "<TURN>" + instruction (docs/token_layout.md#instruction-text,
        docs/token_layout.md#per-turn-layout), PAD_ID padded.
      turn_len int32 [max_turns]: valid length of each row of turn_ids.
      world_ids int32 [max_turns, 14]: the turn's state string
        `<ML><S_ml></ML><SC><S_sc></SC><ET><S_et></ET><ST><S_st></ST></ST></TURN>` built from its
        labelled states [ML, SC, ET, ST] (mllm_tokenizer.world_ids): the CE targets of the predicted turn and
        the true-state history of earlier turns.

    Args:
      max_text_tokens: row length of turn_ids; a longer instruction raises ValueError naming it.
      model_path: sentencepiece model (default: Mistral v0.1's from mistral-common).
    """

    max_text_tokens: int = 64
    model_path: str | None = None

    def map(self, element: dict) -> dict:
        tok = mllm_tokenizer.get_tokenizer(self.model_path)
        m = element["turn_mask"].shape[0]
        turn_ids = np.full((m, self.max_text_tokens), mllm_tokenizer.PAD_ID, np.int32)
        turn_len = np.zeros(m, np.int32)
        world = np.full((m, 14), mllm_tokenizer.PAD_ID, np.int32)
        for k in range(int(element["num_turns"])):
            text = str(element["instruction"][k])
            ids = [mllm_tokenizer.TURN_ID, *tok.encode_plain(text)]
            if len(ids) > self.max_text_tokens:
                raise ValueError(f"instruction of dataset clip {int(element['index'][k])} has {len(ids)} "
                                 f"tokens > max_text_tokens={self.max_text_tokens}: {text!r}")
            turn_ids[k, :len(ids)] = ids
            turn_len[k] = len(ids)
            world[k] = tok.world_ids(*(int(v) for v in element["states"][k]))
        return {**element, "turn_ids": turn_ids, "turn_len": turn_len, "world_ids": world}
