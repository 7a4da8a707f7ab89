"""The one shard writer of the tfds datasets built here (clip dataset, features).

Each Beam element writes one shard of its own, streaming: examples are encoded by the dataset's tfds
features, serialised and appended to an ArrayRecord file ``<data_dir>/<split>-<part>.array_record.part``
as they come, so a worker holds one example at a time and nothing is shuffled through the runner
(tfds' generic Beam writer groups every serialised example by shard, which local runners hold in
memory). Each element also yields JSON report lines (what it wrote, what it skipped); the builder runs the pipeline with
:func:`run`, then names the parts ``<name>-<split>.array_record-0000k-of-0000N`` in its order and
sets the splits with :func:`assemble`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence

import apache_beam as beam
import tensorflow_datasets as tfds
from etils import epath
from tensorflow_datasets.core import example_serializer
from tensorflow_datasets.core import writer as writer_lib

from animegamer_jax.data import beam_util


class PartWriter:
    """Writes examples (feature dicts) to one part file; picklable (Beam ships it to the workers)."""

    def __init__(self, features: tfds.features.FeaturesDict, file_format, data_dir: str):
        self.features, self.file_format, self.data_dir = features, file_format, os.fspath(data_dir)
        self._serializer = None

    def path(self, split: str, part: str) -> str:
        """Where part ``part`` of ``split`` is written."""
        return os.path.join(self.data_dir, f"{split}-{part}.array_record.part")

    def write(self, path: str, examples: Iterable[dict]) -> int:
        """Appends ``examples`` to the new file ``path`` one at a time; returns how many (0: no file left)."""
        if self._serializer is None:
            self._serializer = example_serializer.ExampleSerializer(self.features.get_serialized_info())
        count = [0]

        def serialized():
            for example in examples:
                count[0] += 1
                yield count[0], self._serializer.serialize_example(self.features.encode_example(example))

        writer_lib.ExampleWriter(file_format=self.file_format).write(path, serialized())
        if not count[0]:
            epath.Path(path).unlink(missing_ok=True)
        return count[0]


def run(jobs: Sequence, dofn: beam.DoFn, options, report_path: str) -> tuple[list[dict], dict[str, int]]:
    """Runs ``jobs | Reshuffle | ParDo(dofn) | report lines`` with the Beam ``options``; returns the report
    lines (``dofn`` yields JSON strings; the report file is removed) and the ``animegamer`` counters."""
    pipeline = beam.Pipeline(options=options)
    _ = (pipeline
         | "Jobs" >> beam.Create(list(jobs))
         | "SpreadOverWorkers" >> beam.Reshuffle()  # one job per worker at a time, not all on one
         | "WriteShards" >> beam.ParDo(dofn)
         | "WriteReport" >> beam.io.WriteToText(report_path, num_shards=1, shard_name_template=""))
    result = pipeline.run()
    result.wait_until_finish()
    report = epath.Path(report_path)
    lines = [json.loads(x) for x in report.read_text().splitlines() if x.strip()]
    report.unlink()
    return lines, beam_util.counters(result)


def assemble(builder: tfds.core.DatasetBuilder, split: str, parts: Sequence[tuple[str, int]]) -> tfds.core.SplitInfo:
    """Renames the ``(part path, num examples)`` of ``split`` (in record order, none empty) to the split's
    shard names and returns its SplitInfo."""
    template = builder._get_filename_template(split)  # noqa: SLF001 - the shard names tfds readers expect
    lengths, size = [], 0
    for k, (part, n) in enumerate(parts):
        target = template.sharded_filepath(shard_index=k, num_shards=len(parts))
        epath.Path(part).rename(target)
        lengths.append(int(n))
        size += target.stat().length
    return tfds.core.SplitInfo(name=split, shard_lengths=lengths, num_bytes=size, filename_template=template)
