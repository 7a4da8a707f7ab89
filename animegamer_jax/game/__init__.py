"""Game generation: a game script in, a sequence of game states (videos + character states) out.

Modules (bottom to top; each imports only modules above it in this list):
  script.py            game script files (one instruction a line, or JSONL batches) -> Game
                       (the instruction grammar, Game and Turn: inference/instructions.py)
  run.py               one game's run: meters and the finished turns its MLLM window is built from; TurnResult
  loading.py           which system a command plays (a TurnModel): checkpoint, stand-in, or random tiny fallback
  engine.py            GameEngine: batches of games advanced turn by turn through a TurnModel's three jitted stages
  turn_by_turn.py      TurnByTurnGame: one game played a turn at a time, with undo (the web server's games)
  stage_executables.py the engine's stage programs compiled while playing a short game, saved for --executables
  writers.py           per-turn MP4/GIF with the meters HUD, game video, game.json, index.html, contact sheet
  saving.py            save_game (engine result -> game_record -> writers), resume checks, the console lines
  errors.py            GAME_ERRORS: the errors a game reports as one line (commands/game_flags.py)
One turn's computations (token layout, MLLM turn, sampler, VAE decoder, release decoding) and the
TurnModel the engine plays (the real networks, the random stand-in) are the inference layer's
(animegamer_jax/inference/).
Entry points: ``python -m animegamer_jax.commands.play`` (one game), ``python -m animegamer_jax.commands.generate``
(many games, resumable) and ``python -m animegamer_jax.commands.web`` (in the browser, animegamer_jax/web/).
"""
