r"""Table 1 evaluation: plays every benchmark game and writes the Table 1 report (paper §4.2, Table 1).

    python -m animegamer_jax.eval --config configs/tiny.py --checkpoint DIR \
        --benchmark data/benchmark/benchmark.json --out outputs/eval [--clip HF_CLIP_DIR]

Steps: load the benchmark (eval/table1_games.py); build the game engine (game/engine.py) on the
system; play the games in batches of the engine's data-parallel size (the batch-generation path,
same seeds, same per-game outputs as ``generate``); optionally write each game's outputs
(game/writers.py: MP4s, game.json, gallery) under ``<out>/games``; score every turn with
eval/metrics.py against the benchmark's ground truth and references; write ``report.json`` and
``report.md`` in ``<out>``.

Metrics use the raw generated frames (float [0, 1] -> uint8, ``video_io.to_uint8``), not the H.264
files, so video compression does not leak into the scores. ``s/turn`` is the wall time of one turn of a batched
engine call (MLLM + sampling + VAE, compilation excluded) divided by the number of games in the
call, i.e. throughput per game; the latency of one batched call is reported beside it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from animegamer_jax import fileio, paths, video_io
from animegamer_jax.eval import metrics
from animegamer_jax.eval.embedders import Embedder, standin_embedder
from animegamer_jax.eval.table1_games import Benchmark, load_benchmark
from animegamer_jax.game import writers
from animegamer_jax.game.api import STAGES
from animegamer_jax.game.engine import GameEngine, batches
from animegamer_jax.game.loading import resolve_system
from animegamer_jax.game.saving import save_game
from animegamer_jax.game.standin_system import build_standin
from animegamer_jax.inference.vae_decode import FRAME_RANGE

# The paper's AnimeGamer row of Table 1 (docs/evaluation.md#table-1), printed beside ours for reference.
PAPER_ROW = {"CLIP-I": 0.8132, "DreamSim": 0.7403, "CLIP-T": 0.4161, "CLIP-T^E": 0.4012, "ACC-F": 0.6744,
             "MAE-F": 0.4238, "ACC-S": 0.6773, "MAE-S": 0.5872, "s/turn": 24.0}


def build_system(config, checkpoint: str = "", standin: bool = False):
    """The game system to evaluate: a system checkpoint, or the labelled random stand-in.

    Raises:
      ValueError: neither given.
    """
    if standin:
        return build_standin(config, seed=int(config.seed))
    return resolve_system(config, checkpoint, False)


@dataclasses.dataclass
class PlayedGame:
    """One generated benchmark game: engine result plus the wall seconds per turn per game."""

    game_id: str
    result: dict
    batch: int


def play_benchmark(engine, bench: Benchmark, out_dir: str | None = None,
                   games: Sequence[str] | None = None, log=print) -> list[PlayedGame]:
    """Plays the benchmark games in batches of ``engine.batch_size``.

    Args:
      engine: a :class:`animegamer_jax.game.engine.GameEngine`.
      bench: the benchmark.
      out_dir: if given, each game's outputs are written to ``out_dir/<game_id>`` (game/writers.py).
      games: optional subset of game ids (in benchmark order).

    Raises:
      KeyError: an unknown game id in ``games``.
    """
    # the batch-generation path of ``python -m animegamer_jax.generate``: same grouping, same writer
    todo = list(bench.games)
    if games:
        known = {g.game_id for g in todo}
        unknown = [g for g in games if g not in known]
        if unknown:
            raise KeyError(f"unknown game id(s) {unknown}; the benchmark has {sorted(known)}")
        todo = [g for g in todo if g.game_id in set(games)]
    played = []
    for chunk in batches([g.to_game() for g in todo], engine.batch_size):
        t0 = time.perf_counter()
        results = engine.play(chunk)
        log(f"played {', '.join(g.game_id for g in chunk)} ({sum(len(g.turns) for g in chunk)} turns) "
            f"in {time.perf_counter() - t0:.1f} s")
        for g, r in zip(chunk, results):
            if out_dir is not None:
                save_game(engine, r, out_dir, overwrite=True)  # a rerun replaces its own games
            played.append(PlayedGame(g.game_id, r, len(chunk)))
    order = {g.game_id: i for i, g in enumerate(todo)}
    return sorted(played, key=lambda p: order[p.game_id])


def turn_results(bench: Benchmark, played: Sequence[PlayedGame]) -> dict[str, list[metrics.ScoredTurn]]:
    """Pairs every generated turn with its benchmark round: game id -> metric inputs."""
    by_id = {g.game_id: g for g in bench.games}
    out = {}
    for p in played:
        game = by_id[p.game_id]
        rows = []
        for rnd, tr, tm in zip(game.rounds, p.result["turns"], p.result["timings"]):
            secs = (tm["mllm_s"] + tm["sampling_s"] + tm["vae_s"]) / max(1, p.batch)
            rows.append(metrics.ScoredTurn(
                frames=video_io.to_uint8(tr.frames, FRAME_RANGE), motion_text=rnd.turn.motion,
                background_text=rnd.turn.background,
                characters=rnd.turn.characters, predicted_states=np.asarray(tr.states, np.int64),
                target_states=np.asarray(rnd.states, np.int64), seconds=secs))
        out[p.game_id] = rows
    return out


def score(config, bench: Benchmark, per_game: dict[str, list[metrics.ScoredTurn]], embedder: Embedder,
          dreamsim: Embedder | None = None, scope_fn=None) -> dict[str, Any]:
    """Table 1 columns over all turns and per game."""
    refs = bench.reference_images()
    kw = dict(image_embed=embedder.image, text_embed=embedder.text, references=refs,
              motion_bins=tuple(config.data.motion_bins), flow_threshold=float(config.data.flow_threshold),
              clip_frames=int(config.eval.clip_frames), scope_fn=scope_fn,
              dreamsim_embed=dreamsim.image if dreamsim is not None else None)
    all_turns = [t for rows in per_game.values() for t in rows]
    return {"overall": metrics.evaluate_turns(all_turns, **kw),
            "games": {gid: metrics.evaluate_turns(rows, **kw) for gid, rows in per_game.items()}}


def _cell(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 100 else f"{v:.1f}"
    return str(v)


def render_markdown(report: dict) -> str:
    """The Markdown report: Table 1 row (ours and the paper's), per-game rows, run facts."""
    cols = metrics.TABLE1_COLUMNS
    head = "| system | " + " | ".join(cols) + " |\n|---|" + "---:|" * len(cols)
    lines = [f"# AnimeGamer benchmark report: {report['benchmark']['name']}", "",
             f"- system: {report['system']}",
             f"- config: {report['config']} (mode {report['mode']}, history window {report['history_window']}, "
             f"{report['sampling_steps']} sampling steps)",
             f"- CLIP: {report['clip']}",
             f"- DreamSim: {report['dreamsim'] or 'not computed (no weights given)'}",
             f"- games: {report['benchmark']['games']}, rounds: {report['benchmark']['rounds']}",
             f"- devices: {report['devices']}, games per engine call: {report['batch_size']}",
             "", "## Table 1 columns", "", head,
             "| this run | " + " | ".join(_cell(report["metrics"][c]) for c in cols) + " |",
             "| paper AnimeGamer (Table 1) | " + " | ".join(_cell(PAPER_ROW[c]) for c in cols) + " |",
             "", "## Per game", "", head.replace("| system |", "| game |")]
    for gid, m in report["per_game"].items():
        lines.append(f"| {gid} | " + " | ".join(_cell(m[c]) for c in cols) + " |")
    m = report["metrics"]
    if "ACC-ML" in m:
        lines += ["", "## Predicted states per field vs the majority-class baseline", "",
                  "| field | accuracy | majority baseline (class) | above baseline |", "|---|---:|---:|---|"]
        for name in metrics.STATE_FIELDS:
            acc, base = m[f"ACC-{name}"], m[f"majority-{name}"]
            lines.append(f"| {name} | {acc:.3f} | {base:.3f} ({m[f'majority-class-{name}']:+d}) | "
                         f"{'yes' if acc > base else 'no'} |")
    t = report["timing"]
    lines += ["", "## Time", "",
              f"- s/turn per game (throughput): {_cell(report['metrics']['s/turn'])}; latency of one batched "
              f"turn: {_cell(t['turn_latency_s'])} s",
              "- per stage, mean s per batched turn: " + ", ".join(f"{k} {v:.3f}" for k, v in t["stages_s"].items()),
              f"- compilation (once): {t['compile_s']:.1f} s; wall of the whole run: {t['wall_s']:.1f} s", "",
              "Definitions: animegamer_jax/eval/metrics.py. CLIP-I compares whole frames with the reference "
              "(the paper crops detected characters), so absolute values are not the paper's."]
    return "\n".join(lines) + "\n"


def run_benchmark(config, benchmark_path: str, out_dir: str, *, system=None, checkpoint: str = "",
                  standin: bool = False, embedder: Embedder | None = None, dreamsim: Embedder | None = None,
                  games: Sequence[str] | None = None, write_games: bool = True, scope_fn=None,
                  log=print) -> dict[str, Any]:
    """Generates every benchmark game and writes ``report.json`` and ``report.md`` to ``out_dir``.

    Args:
      config: full config (sections game, data, eval and the model sections).
      benchmark_path: benchmark JSON (eval/table1_games.py format).
      out_dir: report folder (games go to ``out_dir/games`` when ``write_games``).
      system: a ready :class:`GameSystem` (tests); else from ``checkpoint`` / ``standin``.
      embedder: CLIP embedder; default the labelled stand-in.
      dreamsim: optional DreamSim embedder (image side only is used).
      games: optional subset of game ids.
      scope_fn: motion-scope estimator override (tests).

    Returns:
      the report dict (also written as JSON).

    Raises:
      BenchmarkError: a malformed benchmark (before anything is generated).
      OutputError / OSError: ``out_dir`` not writable.
    """
    t_start = time.perf_counter()
    bench = load_benchmark(benchmark_path)
    writers.check_writable(out_dir)
    embedder = embedder or standin_embedder()
    if system is None:
        system = build_system(config, checkpoint, standin)
    engine = GameEngine(config, system)
    log(f"benchmark {bench.name}: {len(bench.games)} games, {bench.num_rounds} rounds; system: {system.label}")
    games_dir = str(paths.as_path(paths.join(out_dir, "games"))) if write_games else None  # absolute, as logged
    played = play_benchmark(engine, bench, games_dir, games, log)
    per_game = turn_results(bench, played)
    scores = score(engine.config, bench, per_game, embedder, dreamsim, scope_fn)
    timings = [tm for p in played for tm in p.result["timings"]]
    stages = {s: float(np.mean([tm[f"{s}_s"] for tm in timings])) for s in STAGES}
    report = {
        "benchmark": {"name": bench.name, "path": bench.path, "games": len(played),
                      "rounds": sum(len(v) for v in per_game.values())},
        "system": system.label,
        "config": engine.config.name,
        "mode": engine.config.game.mode,
        "history_window": int(engine.config.mllm.history_window),
        "sampling_steps": int(engine.config.diffusion.num_sampling_steps),
        "clip": embedder.label,
        "dreamsim": dreamsim.label if dreamsim is not None else None,
        "devices": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
        "batch_size": engine.batch_size,
        "metrics": scores["overall"],
        "per_game": scores["games"],
        "paper_animegamer": PAPER_ROW,
        "timing": {"stages_s": stages, "turn_latency_s": float(sum(stages.values())),
                   "compile_s": float(sum(engine.compile_s.values())),
                   "wall_s": time.perf_counter() - t_start},
        "predictions": {p.game_id: [list(t.states) for t in p.result["turns"]] for p in played},
    }
    fileio.makedirs(out_dir)  # a local folder or a URL (gs://...)
    for name, text in (("report.json", json.dumps(report, indent=2)), ("report.md", render_markdown(report))):
        fileio.write_text_atomic(paths.join(out_dir, name), text)
    log(f"report: {paths.as_path(paths.join(out_dir, 'report.md'))}")
    return report
