"""The commands: each module parses a command line, calls the library and prints (the top layer).

One module per command, each run as ``python -m animegamer_jax.commands.<module>`` (console scripts
in pyproject.toml ``[project.scripts]``):
  play.py        one game, from a script file or typed instructions (animegamer-play)
  generate.py    many games from a JSONL file, resumable (animegamer-generate)
  web.py         the browser app over the game engine (animegamer-web)
  game_flags.py  the flags play, generate and web share (--checkpoint, --config, --standin, ...)
  character.py   fit a character LoRA into a system checkpoint (animegamer-character)
  checkpoint.py  verify / manifest / cast / add on system checkpoints (animegamer-checkpoint)
  train.py       training phases, toy-world (animegamer-train)
  eval.py        Table 1, identity, representation, decoder, vae (animegamer-eval)
  aot.py         ahead-of-time compiles for a target topology; saved stage programs (animegamer-aot)
  convert.py     outside checkpoints -> our layout; release, check-release (animegamer-convert)
  data.py        sample, caption, prepare, extract-features, tiny-t5-spiece (animegamer-prepare, ...)
  check.py       the multi-host smoke test a launcher runs before an expensive job
Only these modules import ``animegamer_jax.cli`` (flags, the command pattern, one-line errors);
the library below returns values and raises.
"""
