"""Check a system checkpoint's files, write their integrity.json, or store components smaller.

Usage: python -m animegamer_jax.commands.checkpoint verify [--full] DIR
       python -m animegamer_jax.commands.checkpoint manifest DIR
       python -m animegamer_jax.commands.checkpoint cast SRC DST --components=mllm [--dtype=bfloat16]
           [--description="what the system is"]
       python -m animegamer_jax.commands.checkpoint add BASE DST --from=SYSTEM --components=reference
           [--description="what the system is"]

verify: check every file against integrity.json; manifest: write integrity.json for the files
there now (only for a checkpoint you trust); cast: copy SRC to the new folder DST with the float32
arrays of --components stored as --dtype (loading casts them back); --description replaces the
manifest's description of the system (shown in game outputs); add: copy BASE to the new folder DST
with the components of SYSTEM added (every file copied byte for byte; the config gains SYSTEM's
settings that BASE lacks, its train section excepted). Each subcommand takes --help.
"""

from __future__ import annotations

import time

from absl import flags

from animegamer_jax.commands import cli as cli_lib
from animegamer_jax.io import fileio
from animegamer_jax.io import paths
from animegamer_jax.checkpoint.add import add_components
from animegamer_jax.checkpoint.cast import cast_system
from animegamer_jax.checkpoint.errors import SystemCheckpointError
from animegamer_jax.checkpoint.integrity import verify_checkpoint, write_integrity

PROG = "python -m animegamer_jax.commands.checkpoint"
#: exceptions reported as one ``error: ...`` line, exit status 2
ERRORS = (SystemCheckpointError, ValueError, TypeError)


def _define_verify(fv, argv: list[str]) -> None:
    flags.DEFINE_bool("full", False, "sha256 of every byte (default --nofull: the fast check, sizes and "
                      "sampled hashes)", flag_values=fv)


def _define_cast(fv, argv: list[str]) -> None:
    flags.DEFINE_list("components", [], "the components whose float32 arrays to store as --dtype",
                      flag_values=fv)
    flags.DEFINE_string("dtype", "bfloat16", "the stored dtype", flag_values=fv)
    flags.DEFINE_string("description", None, "what the system is (trained on what, what it can show), stored in "
                        "DST's manifest and shown in game outputs (default: SRC's; --description= clears it)",
                        flag_values=fv)


def _define_add(fv, argv: list[str]) -> None:
    flags.DEFINE_string("from", None, "the system checkpoint holding the components to add (e.g. a training "
                        "run's runs/NAME/system)", flag_values=fv)
    flags.DEFINE_list("components", [], "the components of --from to add (BASE must lack them)", flag_values=fv)
    flags.DEFINE_string("description", None, "what the system is, stored in DST's manifest and shown in game "
                        "outputs (default: BASE's; --description= clears it)", flag_values=fv)


def _checkpoint_dir(directory: str) -> str:
    if not fileio.isdir(directory):
        raise cli_lib.UsageError(f"{directory}: no such checkpoint folder")
    return directory


def _verify(f, directory: str) -> int:
    t0 = time.perf_counter()
    man = verify_checkpoint(_checkpoint_dir(directory), "full" if f.full else "fast")
    total = sum(v["size"] for v in man["files"].values())
    print(f"ok: {len(man['files'])} files, {total / 2**20:.1f} MiB, {'full' if f.full else 'fast'} check "
          f"in {time.perf_counter() - t0:.2f}s")
    return 0


def _manifest(f, directory: str) -> int:
    t0 = time.perf_counter()
    path = write_integrity(str(paths.as_path(_checkpoint_dir(directory))))
    print(f"wrote {path} in {time.perf_counter() - t0:.2f}s")
    return 0


def _cast(f, src: str, dst: str) -> int:
    if not f.components:
        raise cli_lib.UsageError(f"expected 'cast SRC DST --components=NAME[,NAME]', got {['cast', src, dst]}")
    t0 = time.perf_counter()
    out = cast_system(src, dst, f.components, f.dtype, f.description)
    print(f"wrote {out} ({', '.join(f.components)} stored as {f.dtype}) in {time.perf_counter() - t0:.1f}s")
    return 0


def _add(f, base: str, dst: str) -> int:
    other = f["from"].value
    if not other or not f.components:
        raise cli_lib.UsageError(f"expected 'add BASE DST --from=SYSTEM --components=NAME[,NAME]', "
                                 f"got {['add', base, dst]}")
    t0 = time.perf_counter()
    out, keys = add_components(_checkpoint_dir(base), _checkpoint_dir(other), dst, f.components, f.description)
    print(f"wrote {out} ({', '.join(f.components)} from {other}; config gained {', '.join(keys) or 'nothing'}) "
          f"in {time.perf_counter() - t0:.1f}s")
    return 0


#: subcommand -> how it runs
COMMANDS = {
    "verify": cli_lib.Command(_define_verify, _verify, "Checks every file of the checkpoint DIR against its "
                              "integrity.json.", ("DIR",), errors=ERRORS),
    "manifest": cli_lib.Command(cli_lib.no_flags, _manifest, "Writes DIR/integrity.json for the files there now "
                                "(only for a checkpoint you trust).", ("DIR",), errors=ERRORS),
    "cast": cli_lib.Command(_define_cast, _cast, "Copies the checkpoint SRC to the new folder DST with the float32 "
                            "arrays of --components stored as --dtype (loading casts them back).", ("SRC", "DST"),
                            errors=ERRORS),
    "add": cli_lib.Command(_define_add, _add, "Copies the checkpoint BASE to the new folder DST with the "
                           "--components of --from added: every file copied byte for byte, the manifest, config and "
                           "integrity record rewritten (the config gains the settings --from has and BASE lacks, its "
                           "train section excepted).", ("BASE", "DST"), errors=ERRORS),
}


def main(argv: list[str] | None = None) -> int:
    """``python -m animegamer_jax.commands.checkpoint {verify [--full] | manifest} DIR`` or
    ``... cast SRC DST --components=...`` or ``... add BASE DST --from=SYSTEM --components=...``
    (module docstring).

    Returns the exit status (2 with a one-line message on a bad command line, an unknown subcommand or a
    damaged checkpoint; 0 for ``--help``).
    """
    return cli_lib.run(PROG, argv, COMMANDS, __doc__.strip())


def cli() -> None:
    """Console script ``animegamer-checkpoint`` (pyproject.toml)."""
    raise SystemExit(main())


if __name__ == "__main__":
    cli()
