"""Fit a character LoRA and store it in a system checkpoint under the character's name.

Usage: python -m animegamer_jax.commands.character fit --images=DIR --name=NAME --checkpoint=SYSTEM --out=NEW_SYSTEM
           [--film=FILE instead of --images] [--steps=300] [--rank=4] [--learning_rate=2e-3] [--overwrite]

fit: trains a rank --rank LoRA of the DiT's attention on still clips made from the pictures (every
PNG / JPEG of --images, whose other files are skipped with one line naming them, or the frames of
--film; flipped and cropped), with phase a2's diffusion loss
conditioned on E_a of "Character: NAME; Motion: calmly stands still; Background: a plain background.",
then writes --out: a copy of --checkpoint whose component "characters" holds the LoRA under NAME
(and the characters it stored already; --overwrite replaces one of the same name). play, generate and
web with --checkpoint=NEW_SYSTEM decode every turn whose Character field is NAME with that LoRA; the
other turns decode exactly as with --checkpoint. --checkpoint is never modified; --out must not exist.
"""

from __future__ import annotations

from absl import flags

from animegamer_jax.commands import cli as cli_lib
from animegamer_jax.character.fit import FitError, fit_character, read_images
from animegamer_jax.checkpoint.errors import SystemCheckpointError
from animegamer_jax.game.characters import CharacterError, check_name

PROG = "python -m animegamer_jax.commands.character"
#: exceptions reported as one ``error: ...`` line, exit status 2
ERRORS = (FitError, CharacterError, SystemCheckpointError)


def _define_fit(fv, argv: list[str]) -> None:
    flags.DEFINE_string("images", None, "folder of PNG / JPEG pictures of the character", flag_values=fv)
    flags.DEFINE_string("film", None, "a video of the character whose frames are used (instead of --images)",
                        flag_values=fv)
    flags.DEFINE_string("name", None, "the character's name, as the script's 'Character:' field writes it",
                        flag_values=fv)
    flags.DEFINE_string("checkpoint", None, "the system checkpoint to start from (never modified)", flag_values=fv)
    flags.DEFINE_string("out", None, "the new system folder to write (must not exist)", flag_values=fv)
    flags.DEFINE_integer("steps", 300, "training steps (tiny size: about 0.5 s each on 2 CPU cores)",
                         flag_values=fv)
    flags.DEFINE_integer("rank", 4, "LoRA rank", flag_values=fv)
    flags.DEFINE_float("learning_rate", 2e-3, "Adam learning rate", flag_values=fv)
    flags.DEFINE_integer("batch_size", 4, "still clips per step", flag_values=fv)
    flags.DEFINE_integer("variants", 32, "augmented still clips made from the pictures", flag_values=fv)
    flags.DEFINE_integer("seed", 0, "seed of the augmentation, the LoRA init and the noise", flag_values=fv)
    flags.DEFINE_bool("overwrite", False, "replace a character of the same name stored in --checkpoint",
                      flag_values=fv)
    cli_lib.define_verbosity(fv)


def _fit(f) -> int:
    for flag in ("name", "checkpoint", "out"):
        if not f[flag].value:
            raise cli_lib.UsageError(f"--{flag} is required (see --help)")
    check_name(f.name, f"--name {f.name}")
    pictures = read_images(f.images, f.film, f.name, log=lambda s: cli_lib.status("%s", s))
    res = fit_character(f.checkpoint, f.out, f.name, pictures, steps=f.steps, rank=f.rank,
                        learning_rate=f.learning_rate, batch_size=f.batch_size, variants=f.variants, seed=f.seed,
                        overwrite=f.overwrite, log=lambda s: cli_lib.status("%s", s))
    print(f"wrote {res['out']} (characters: {', '.join(res['names'])}; {res['steps']} steps, v-MSE "
          f"{res['loss_first']:.4f} -> {res['loss_last']:.4f}) in {res['seconds']:.0f}s")
    return 0


#: subcommand -> how it runs
COMMANDS = {"fit": cli_lib.Command(_define_fit, _fit, __doc__.strip(), errors=ERRORS)}


def main(argv: list[str] | None = None) -> int:
    """``python -m animegamer_jax.commands.character fit ...`` (module docstring); returns the exit status (2 with
    one ``error: ...`` line on a bad input)."""
    return cli_lib.run(PROG, argv, COMMANDS, __doc__.strip())


def cli() -> None:
    """Console script ``animegamer-character`` (pyproject.toml)."""
    raise SystemExit(main())


if __name__ == "__main__":
    cli()
