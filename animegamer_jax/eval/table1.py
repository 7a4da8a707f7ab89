r"""Table 1 evaluation: plays every benchmark game on an engine and writes the Table 1 report (paper §4.2,
Table 1). The command, ``python -m animegamer_jax.commands.eval [table1]`` (commands/eval.py), builds the system
and the engine and saves the games; this module plays and scores.

Steps of :func:`run_benchmark`: play the games (a loaded benchmark, eval/table1_games.py) on the engine
(a ``game.engine.GameEngine``: ``batch_size``, ``play``, ``config``, ``compile_s``, ``system.label``) in
batches of its data-parallel size (the caller's ``batches`` function: the batch-generation path, same
seeds, same per-game outputs as ``generate``); hand each played game to the caller's ``save`` (the
command writes MP4s, game.json, gallery under ``<out>/games``); score every turn with eval/metrics.py
against the benchmark's ground truth and references; write ``report.json`` and ``report.md`` in ``<out>``.

Metrics use the raw generated frames (float [0, 1] -> uint8, ``media.to_uint8``), not the H.264
files, so video compression does not leak into the scores. ``s/turn`` is the wall time of one turn of a batched
engine call (MLLM + sampling + VAE, compilation excluded) divided by the number of games in the
call, i.e. throughput per game; the latency of one batched call is reported beside it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from animegamer_jax.io import fileio

from animegamer_jax.io import paths

from animegamer_jax.io import media
from animegamer_jax.eval import metrics
from animegamer_jax.eval.embedders import Embedder, standin_embedder
from animegamer_jax.eval.table1_games import Benchmark
from animegamer_jax.inference.vae_decode import FRAME_RANGE

# The paper's AnimeGamer row of Table 1 (docs/evaluation.md#table-1), printed beside ours for reference.
PAPER_ROW = {"CLIP-I": 0.8132, "DreamSim": 0.7403, "CLIP-T": 0.4161, "CLIP-T^E": 0.4012, "ACC-F": 0.6744,
             "MAE-F": 0.4238, "ACC-S": 0.6773, "MAE-S": 0.5872, "s/turn": 24.0}


@dataclasses.dataclass
class PlayedGame:
    """One generated benchmark game: engine result plus the wall seconds per turn per game."""

    game_id: str
    result: dict
    batch: int


def play_benchmark(engine, bench: Benchmark, batches: Callable[[list, int], list[list]],
                   save: Callable[[dict], None] | None = None, games: Sequence[str] | None = None,
                   log=print) -> list[PlayedGame]:
    """Plays the benchmark games in batches of ``engine.batch_size``.

    Args:
      engine: a ``game.engine.GameEngine`` (``batch_size``, ``play(games) -> [result]``).
      bench: the benchmark.
      batches: ``batches(games, size) -> [[game, ...], ...]``, the groups one ``engine.play`` call takes
        (``game.engine.batches``).
      save: if given, called with each game's engine result as it is played (the command writes it).
      games: optional subset of game ids (in benchmark order).

    Raises:
      KeyError: an unknown game id in ``games``.
    """
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
            if save is not None:
                save(r)
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
                frames=media.to_uint8(tr.frames, FRAME_RANGE), motion_text=rnd.turn.motion,
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


def run_benchmark(engine, bench: Benchmark, out_dir: str, batches: Callable[[list, int], list[list]], *,
                  save: Callable[[dict], None] | None = None, embedder: Embedder | None = None,
                  dreamsim: Embedder | None = None, games: Sequence[str] | None = None, scope_fn=None,
                  log=print, t_start: float | None = None) -> dict[str, Any]:
    """Plays every benchmark game on ``engine`` and writes ``report.json`` and ``report.md`` to ``out_dir``.

    Args:
      engine: the game engine on the system to evaluate (its ``config``: sections game, data, eval and the
        model sections).
      bench: the loaded benchmark (eval/table1_games.py ``load_benchmark``).
      out_dir: report folder, local or a URL.
      batches, save, games: as for :func:`play_benchmark`.
      embedder: CLIP embedder; default the labelled stand-in.
      dreamsim: optional DreamSim embedder (image side only is used).
      scope_fn: motion-scope estimator override (tests).
      t_start: ``time.perf_counter()`` when the run began (the report's ``wall_s``); default now.

    Returns:
      the report dict (also written as JSON).

    Raises:
      KeyError: an unknown game id in ``games``. OSError: ``out_dir`` not writable.
    """
    t_start = time.perf_counter() if t_start is None else t_start
    embedder = embedder or standin_embedder()
    label = engine.model.label
    log(f"benchmark {bench.name}: {len(bench.games)} games, {bench.num_rounds} rounds; system: {label}")
    played = play_benchmark(engine, bench, batches, save, games, log)
    per_game = turn_results(bench, played)
    scores = score(engine.config, bench, per_game, embedder, dreamsim, scope_fn)
    timings = [tm for p in played for tm in p.result["timings"]]
    stages = {s: float(np.mean([tm[f"{s}_s"] for tm in timings])) for s in engine.compile_s}  # the engine's stages
    report = {
        "benchmark": {"name": bench.name, "path": bench.path, "games": len(played),
                      "rounds": sum(len(v) for v in per_game.values())},
        "system": label,
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
