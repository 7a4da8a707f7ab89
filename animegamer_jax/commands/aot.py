"""Will it fit? Compile the paper config's programs for the chips you plan to rent, on this host.

  python -m animegamer_jax.commands.aot --topology=v5p-64 --program=train --config.train.global_batch_size=64
                                                  # phases vae a1 a2 b c d r on 32 chips (FSDP needs >= 32)
  python -m animegamer_jax.commands.aot --topology=v6e-8 --program=turn              # play's stages, latency layout
  python -m animegamer_jax.commands.aot --topology=v6e-1 --program=turn --config.diffusion.sampler=student \
      --config.diffusion.num_sampling_steps=4                               # the few-step student's turn
  python -m animegamer_jax.commands.aot --topology=v6e-1 --program=turn --games_per_chip=4 \
      --config.diffusion.sampler=student --config.diffusion.num_sampling_steps=4  # 4 players batched on one chip
  python -m animegamer_jax.commands.aot --topology=v5p-8 --program=generate          # the turn in generate's batch layout
  python -m animegamer_jax.commands.aot --topology=4xh100-8 --program=a2 --config.train.global_batch_size=64
  python -m animegamer_jax.commands.aot --topology=v6e-1 --program=dit,dit_reference,reference_encode  # what a
                                                  # --character adds: reference tokens per turn, encode per game
  python -m animegamer_jax.commands.aot --topology=v5e-4 --config=configs/tiny.py --program=all --json=out.json

Topologies: Cloud TPU names (v4-8, v5e-16, v5p-64, v6e-8, v6e-1; v4 / v5p names count two TensorCores
per chip, so v5p-64 is 32 chips; v5e / v6e names count chips; --num_slices for multislice), GPU nodes
(a100-8, h100-8, h200-8, b200-8; 4xh100-8 = 4 nodes) and cpu-N (fake CPU devices). Nothing is
allocated and no accelerator is needed: the TPU compiler comes with `pip install 'jax[tpu]==0.10.2'`
(`make tpu-compiler`), XLA:GPU with jax[cuda12] (`make aot-gpu`). Programs: vae a1 a2 b c d r (the train
command's step with the config's settings: batch, remat, precomputed features, latents; d = the
few-step student's distillation; --config.train.remat=auto compiles each policy (none, save_dots, full)
and keeps the fastest that fits) and prefill decode pass_b dit vae_decode (play's turn; --layout
latency = one game on all chips, batch = one game per data-parallel slice; dit is the student's N
steps without a CFG batch under --config.diffusion.sampler=student); groups train, turn, generate
(turn in the batch layout), all. Outside the groups: preview_decode, dit_reference (play's DiT sampling
for a turn that names a --character: the reference latent's tokens and the phase-r adapter; with dit
in the same run the added time and memory per turn are printed) and reference_encode (the --character
image's VAE encode, once per character per game). --games_per_chip=B batches B games in each turn program (the game
engine's rows, web / generate --max_batch): with --topology=v6e-1 the turn of B players on one chip,
its resident bytes (weights once, B KV caches, the largest stage's activations) against the HBM.

Prints, per program and per chip: arguments / temporaries / outputs / aliased / peak bytes against the
chip's HBM (a program fits at <= 80 %), FLOPs and bytes accessed (loop trip counts included), the
collectives priced on the chip's links, model FLOPs and MFU of train steps, the attention kernel of every
call, and a roofline time per run, per train step and per turn, with its assumptions. --json writes it all with the commit; --save writes each serialized executable. Exit
status 1 when a program fails to compile, 2 for a bad command line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import sys
from typing import Any

import jax
from absl import flags
from jax.experimental import serialize_executable
from ml_collections import config_flags

from animegamer_jax import parallel

from animegamer_jax.io import fileio

from animegamer_jax.io import paths
from animegamer_jax.aot import programs, report
from animegamer_jax.commands.cli import Command, UsageError, compilation_cache, run
from animegamer_jax.game.stage_executables import save_engine_stages
from animegamer_jax.parallel import target

GROUPS = {"train": programs.TRAIN_PROGRAMS, "turn": programs.TURN_PROGRAMS}


def _define(fv: flags.FlagValues, argv: list[str]) -> None:
    config_flags.DEFINE_config_file("config", paths.resource("configs/animegamer_2b_7b.py"),
                                    "Config to compile (default: the paper's); --config.a.b=v overrides a field.",
                                    flag_values=fv, lock_config=False, sys_argv=argv)
    flags.DEFINE_string("topology", None, "Target: v5p-64, v6e-8, v5e-4, h100-8, 4xh100-8, cpu-8, ...",
                        flag_values=fv)
    flags.DEFINE_integer("num_slices", 1, "TPU multislice: slices of --topology.", lower_bound=1, flag_values=fv)
    flags.DEFINE_list("program", ["all"], "Programs or groups: vae,a1,a2,b,c,d,r,preview,prefill,decode,pass_b,dit,vae_decode,"
                      "preview_decode,dit_reference,reference_encode; "
                      "train, turn, generate, all.", flag_values=fv)
    flags.DEFINE_enum("layout", "", ["", "latency", "batch"], "Turn programs' layout (default game.play_layout).",
                      flag_values=fv)
    flags.DEFINE_integer("games_per_chip", 1, "Turn programs: games batched in one program (the game engine's "
                         "rows, web / generate --max_batch): latency: B games on all chips (v6e-1: B players per "
                         "chip); batch: B per data-parallel slice.", lower_bound=1, flag_values=fv)
    flags.DEFINE_string("json", "", "Write the report as JSON here (path or URL).", flag_values=fv)
    flags.DEFINE_string("save", "", "Folder for the serialized executables (one file per program).", flag_values=fv)


def _programs(names: list[str], default_layout: str) -> list[tuple[str, str]]:
    """[(program, layout)] in order, groups expanded; raises UsageError for an unknown name."""
    out: list[tuple[str, str]] = []
    if not [n for n in names if n.strip()]:
        raise UsageError("--program is empty; name programs or groups, e.g. --program=train or --program=a2,dit")
    for n in names:
        if not n.strip():
            continue
        n = n.strip()
        if n == "all":
            items = [(p, default_layout) for p in GROUPS["train"] + GROUPS["turn"]]
        elif n == "generate":
            items = [(p, "batch") for p in GROUPS["turn"]]
        elif n in GROUPS:
            items = [(p, default_layout) for p in GROUPS[n]]
        elif n in GROUPS["train"] or n in GROUPS["turn"] or n in programs.EXTRA_TURN_PROGRAMS:
            items = [(n, default_layout)]
        else:
            raise UsageError(f"unknown --program {n!r}; use "
                             f"{', '.join(GROUPS['train'] + GROUPS['turn'] + programs.EXTRA_TURN_PROGRAMS)}, "
                                 f"or train, turn, generate, all")
        out += [i for i in items if i not in out]
    return out


def commit() -> str:
    """The checkout's commit, 12 hex digits (``+dirty`` with uncommitted changes), or "unknown"."""
    head, dirty = paths.checkout_commit()
    return "unknown" if dirty is None else head[:12] + ("+dirty" if dirty else "")


def _saver(folder: str, topology: str):
    folder = str(paths.as_path(folder))  # the report names absolute files
    fileio.makedirs(folder)

    def save(name: str, compiled: Any) -> str:
        path = paths.join(folder, f"{topology}_{name}.xla.pkl")
        try:
            payload = serialize_executable.serialize(compiled)
        except Exception as e:  # some backends cannot serialize compile-only executables
            return f"not saved ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
        fileio.write_bytes_atomic(path, pickle.dumps(payload))
        return path

    return save


def _check_outputs(json_path: str, save_dir: str) -> None:
    """Before any compile: the --json folder exists, and a file already at --json is a report of this
    command (which a rerun replaces), never some other file or a folder; --save is a folder or nothing
    yet. Raises UsageError naming the fix."""
    if save_dir and fileio.exists(save_dir) and not fileio.isdir(save_dir):
        raise UsageError(f"--save={save_dir} is a file; give a folder (it is created if missing)")
    if not json_path:
        return
    if json_path.endswith("/") or fileio.isdir(json_path):
        raise UsageError(f"--json={json_path} is a folder; give a file path, e.g. {json_path.rstrip('/')}/aot.json")
    folder = os.path.dirname(json_path)
    if folder and not fileio.isdir(folder):
        raise UsageError(f"--json={json_path}: folder {folder} does not exist; create it or choose another path")
    if fileio.exists(json_path):
        try:
            old = json.loads(fileio.read_bytes(json_path))
            ours = isinstance(old, dict) and {"topology", "programs", "assumptions"} <= set(old)
        except (ValueError, UnicodeDecodeError):
            ours = False
        if not ours:
            raise UsageError(f"--json={json_path} exists and is not an animegamer-aot report; "
                                 f"choose another path (it is left as it is)")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run(f: flags.FlagValues) -> int:
    if not f.topology:
        raise UsageError("--topology is required, e.g. --topology=v5p-64 (see --help)")
    try:
        topo = target.parse_topology(f.topology, f.num_slices)
    except ValueError as e:
        raise UsageError(str(e)) from None
    # cpu-N programs run on this host and go to the persistent compilation cache like every command's;
    # a TPU / GPU target's are compile-only (and of the full-size config): kept out of the cache
    with compilation_cache("") if topo.kind != "cpu" else contextlib.nullcontext():
        return _compile_all(f, topo)


def _compile_all(f: flags.FlagValues, topo: target.Topology) -> int:
    config = f.config
    layout = f.layout or str(config.game.get("play_layout", "latency"))
    todo = _programs(list(f.program), layout)
    _check_outputs(f.json, f.save)
    if topo.kind == "cpu":
        try:  # cpu-N: N host devices, set before the CPU backend starts
            jax.config.update("jax_num_cpu_devices", topo.num_devices)
        except RuntimeError:  # backends already started (in-process use): compile_devices says what to do
            pass
    devices = target.compile_devices(topo)
    chip = topo.chip
    _say(f"animegamer-aot: {topo.name} ({len(devices)} x {getattr(devices[0], 'device_kind', '?')}, {topo.spec}), "
         f"config {config.get('name', '?')}")
    train = [n for n, _ in todo if n in GROUPS["train"]]
    if train:  # a batch the mesh cannot split is the user's setting to fix: say so before compiling anything
        try:
            mesh = parallel.mesh_from_config(config, devices=devices)
            parallel.check_global_batch(int(config.train.global_batch_size) // int(config.train.grad_accum_steps),
                                        mesh, parallel.rules_from_config(config))
        except parallel.ShardingConfigError as e:
            raise UsageError(f"{e} (train programs {', '.join(train)} on {topo.name}: "
                                 f"--config.train.global_batch_size=N or --config.mesh.shape=...)") from None
    save = _saver(f.save, topo.name) if f.save else None
    rows = []
    for name, lay in todo:
        _say(f"compiling {name}{f' ({lay} layout)' if name not in GROUPS['train'] else ''} ...")
        auto = name in GROUPS["train"] and str(config.train.get("remat", "")).lower() == "auto"
        try:
            if auto:  # each policy of train.model.AUTO_REMAT until one fits
                row = report.compile_auto_remat(config, name, devices, chip, save, say=_say)
            else:
                prog = (programs.train_program(config, name, devices) if name in GROUPS["train"]
                        else programs.turn_programs(config, [name], devices, lay, f.games_per_chip)[0])
                row = report.compile_program(prog, chip, save)
        except (parallel.ShardingConfigError, ValueError) as e:
            turn = name not in GROUPS["train"]
            rows.append(report.Row(name, "turn" if turn else "train", "", status=f"FAILED {type(e).__name__}: {e}",
                                   layout=lay if turn else ""))
            continue
        rows.append(row)
        _say(f"  {name}: {row.status}" + (f", peak {row.peak / 2**30:.2f} GiB per chip, compile {row.compile_s:.0f} s"
                                         if row.status == "ok" else ""))
    layouts = sorted({r.layout for r in rows if r.layout})
    engine_saved = []
    if f.save and topo.kind == "cpu":  # what play / generate / web --executables load: the engine's stages
        for lay in layouts:
            _say(f"compiling the game engine's stages ({lay} layout) for --executables ...")
            n, h = save_engine_stages(config, lay, devices, str(paths.as_path(f.save)))
            engine_saved.append(f"game engine stages ({lay} layout, config hash {h}): {n} program(s) saved in "
                                f"{f.save} (play / generate / web --executables={f.save})")
    turns = {lay: report.turn_estimate(rows, lay) for lay in layouts}
    refs = {lay: report.reference_added(rows, lay) for lay in layouts}
    residents = {lay: report.turn_resident(rows, lay) for lay in layouts}
    ttffs = {lay: report.turn_ttff(rows, lay) for lay in layouts}
    print(f"\n## animegamer-aot {topo.name} ({len(devices)} x {getattr(devices[0], 'device_kind', '?')}), "
          f"config {config.get('name', '?')}, commit {commit()}, jax {jax.__version__}\n")
    if chip is not None:
        print(f"chip {chip.name}: HBM {chip.hbm_bytes / 2**30:.1f} GiB, {chip.bf16_flops / 1e12:.0f} TFLOP/s bf16 "
              f"dense, {chip.hbm_bytes_per_s / 1e9:.0f} GB/s ({chip.source})\n")
    print(report.table(rows, chip))
    for r in rows:
        if r.status == "ok":
            print(f"- {r.label}: {r.note}" + (f"; saved {r.saved}" if r.saved else "") +
                  (f"; {r.unknown_trip_counts} loop(s) of unknown trip count counted once" if r.unknown_trip_counts
                   else ""))
    print("\nattention kernels (traced calls; a scanned layer traces once):")
    for line in report.kernel_lines(rows) or ["(none)"]:
        print(f"- {line}")
    for r in rows:
        if r.kind == "train" and r.status == "ok" and r.roofline_s is not None:
            step = r.roofline_s * r.runs
            comm = ("communication not priced (no link figures)" if r.exposed_comm_s is None else
                    f"compute {r.compute_s * r.runs:.3f} s + exposed communication {r.exposed_comm_s * r.runs:.3f} s "
                    f"of {r.comm_s * r.runs:.3f} s")
            print(f"roofline train step {r.program}: {step:.3f} s at 100 % of peak, {step / 0.4:.3f} s at 40 % ({comm})")
        if r.kind == "train" and r.status == "ok" and r.model_flops is not None:
            mfu = f"; MFU at the roofline {100 * r.mfu:.1f} %" if r.mfu is not None else ""
            print(f"model FLOPs {r.program}: {r.model_flops * r.runs / 1e12:.3f} TFLOP per chip per step (model / "
                  f"compiled {r.model_flops / r.flops if r.flops else 0:.2f}); frozen forwards "
                  f"{r.frozen_flops * r.runs / 1e12:.3f} TFLOP per chip{mfu}")
    for r in rows:
        if r.status == "ok" and r.collectives:
            parts = [f"{op} x{n:g} {b / 1e9:.2f} GB {1e3 * t:.1f} ms" for op, (n, b, t) in sorted(r.collectives.items())]
            print(f"collectives {r.label} (per run): " + ", ".join(parts))
    for lay in layouts:
        if turns[lay] is not None:
            print(f"roofline turn ({lay} layout): {turns[lay]:.3f} s at 100 % of peak, "
                  f"{turns[lay] / 0.4:.3f} s at 40 %")
        if ttffs[lay] is not None:
            secs, how = ttffs[lay]
            print(f"roofline time to first frame ({lay} layout): {secs:.3f} s at 100 % of peak, {secs / 0.4:.3f} s "
                  f"at 40 % ({how})")
        if residents[lay] is not None:
            share = f", {100 * residents[lay] / chip.hbm_bytes:.0f} % of HBM" if chip else ""
            print(f"one turn resident per chip ({lay} layout): {residents[lay] / 2**30:.2f} GiB (every stage's "
                  f"weights and caches + the largest stage's temporaries{share})")
        if turns[lay] is not None and residents[lay] is not None and f.games_per_chip > 1:
            b = f.games_per_chip
            fit = (f", {'fits' if residents[lay] <= report.FIT_FRACTION * chip.hbm_bytes else 'over'} "
                   f"{100 * report.FIT_FRACTION:.0f} % of HBM") if chip else ""
            print(f"{b} games batched ({lay} layout): each player's turn takes the batch's turn, {turns[lay]:.3f} s "
                  f"at 100 % / {turns[lay] / 0.4:.3f} s at 40 % of peak ({turns[lay] / b:.3f} / "
                  f"{turns[lay] / 0.4 / b:.3f} s of chip time per player-turn); resident "
                  f"{residents[lay] / 2**30:.2f} GiB per chip{fit}")
        if refs[lay] is not None:
            ref = refs[lay]
            with_ref = (f"; a turn with it {turns[lay] + ref['added_s']:.3f} s at 100 % of peak"
                        if turns[lay] is not None else "")
            enc = (f"; reference_encode {1e3 * ref['encode_s']:.1f} ms once per character per game"
                   if "encode_s" in ref else "")
            print(f"reference tokens ({lay} layout, dit_reference - dit): +{1e3 * ref['added_s']:.1f} ms per turn at "
                  f"100 % of peak (+{1e3 * ref['added_s'] / 0.4:.1f} ms at 40 %), +{ref['added_flops'] / 1e12:.3f} "
                  f"TFLOP, +{ref['added_bytes'] / 1e9:.1f} GB, peak +{ref['added_peak'] / 2**30:.2f} GiB per chip "
                  f"(arguments +{ref['added_arguments'] / 2**30:.2f} GiB: the adapter and the latent){with_ref}{enc}")
    for line in engine_saved:
        print(line)
    print("assumptions:\n" + "\n".join(f"- {a}" for a in report.ASSUMPTIONS))
    if f.json:
        doc = {"commit": commit(), "jax": jax.__version__, "topology": topo.name, "spec": topo.spec,
               "num_devices": len(devices), "device_kind": getattr(devices[0], "device_kind", ""),
               "chip": dataclasses.asdict(chip) if chip else None, "config": config.get("name", ""),
               "layouts": layouts, "games_per_chip": f.games_per_chip, "fit_fraction": report.FIT_FRACTION, "assumptions": list(report.ASSUMPTIONS),
               "turn_roofline_s": turns, "turn_resident_bytes": residents, "reference_added": refs,
               "turn_ttff_roofline_s": {k: v[0] if v else None for k, v in ttffs.items()},
               "programs": [dict(dataclasses.asdict(r), fits=r.fits) for r in rows]}
        fileio.write_text_atomic(f.json, json.dumps(doc, indent=1))
        print(f"wrote {f.json}")
    return 0 if all(r.status == "ok" for r in rows) else 1


def _host_compiles() -> None:
    """The host compiles; TPU / GPU devices are compile-only (set before any backend starts)."""
    jax.config.update("jax_platforms", "cpu")


#: ``aot [flags]``
COMMAND = Command(_define, _run, __doc__, errors=(RuntimeError, FileNotFoundError), setup=_host_compiles)


def main(argv: list[str] | None = None) -> int:
    """``python -m animegamer_jax.commands.aot [flags]``; returns the exit status."""
    return run("python -m animegamer_jax.commands.aot", argv, COMMAND)


def cli() -> None:
    """Console script ``animegamer-aot``."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
