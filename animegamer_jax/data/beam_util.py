"""Apache Beam helpers of the data commands (data.caption, the dataset builder).

`beam_options(flag_value)` parses a `--beam_pipeline_options` flag: comma-separated Beam options, as
tfds' CLI takes them (`--runner=DirectRunner,--direct_num_workers=2,--direct_running_mode=multi_processing`;
"" = in this process). Beam 2.77's DirectRunner first tries the Prism runner, a binary it downloads
from GitHub at run time; nothing here downloads at run time, so DirectRunner (and no runner) run on
Beam's FnApiRunner, the local runner DirectRunner falls back to, which takes the same
`--direct_num_workers` / `--direct_running_mode`. `counters(result)` reads the counters a finished
pipeline's DoFns incremented (`beam.metrics.Metrics.counter(NAMESPACE, name)`).
"""

from __future__ import annotations

import contextlib
import io

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

#: the namespace of the data commands' Beam counters
NAMESPACE = "animegamer"


def beam_options(flag_value: str) -> PipelineOptions:
    """PipelineOptions of a comma-separated option list ("" or blanks: Beam's defaults); DirectRunner
    (the default) runs as FnApiRunner (the module docstring says why).

    Raises:
      ValueError: an item that is not `--name` or `--name=value` (Beam itself would drop it silently), a
        value Beam's parser refuses, or an unknown runner: one line, before any pipeline runs.
    """
    args = [a.strip() for a in (flag_value or "").split(",") if a.strip()]
    bad = [a for a in args if not a.startswith("--")]
    if bad:
        raise ValueError(f"--beam_pipeline_options: {bad} are not Beam options; give comma-separated "
                         "--name=value items, e.g. --runner=DirectRunner,--direct_num_workers=2")
    runner = [a for a in args if a.startswith("--runner=")]
    if not runner or runner[-1].split("=", 1)[1] in ("DirectRunner", "SwitchingDirectRunner"):
        args = [a for a in args if not a.startswith("--runner=")] + ["--runner=FnApiRunner"]
    options = PipelineOptions(args)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):  # argparse prints its whole usage before exiting
            options.get_all_options()
    except SystemExit:
        raise ValueError(f"--beam_pipeline_options: {err.getvalue().strip().splitlines()[-1]}") from None
    runner = options.view_as(StandardOptions).runner
    if "." not in runner and runner not in StandardOptions.KNOWN_RUNNER_NAMES:
        raise ValueError(f"--beam_pipeline_options: unknown runner {runner!r}; Beam knows "
                         f"{', '.join(StandardOptions.KNOWN_RUNNER_NAMES)}")
    return options


def counters(result: beam.runners.runner.PipelineResult, namespace: str = NAMESPACE) -> dict[str, int]:
    """{counter name: value} of a finished pipeline's counters in `namespace`, summed over steps
    (committed values; attempted ones where the runner does not commit)."""
    out: dict[str, int] = {}
    for r in result.metrics().query(MetricsFilter().with_namespace(namespace))["counters"]:
        value = r.committed if r.committed is not None else r.attempted
        out[r.key.metric.name] = out.get(r.key.metric.name, 0) + int(value or 0)
    return out
