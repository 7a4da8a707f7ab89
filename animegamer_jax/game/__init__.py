"""Game generation: a game script in, a sequence of game states (videos + character states) out.

Modules:
  script.py    game scripts (one instruction a line, or JSONL batches) -> Game / Turn
  state.py     meters, the sliding window of past turns and the MLLM token layout (docs/token_layout.md)
  engine.py    GameEngine: batches of games advanced turn by turn through three jitted stages
  session.py   TurnByTurnGame: one game played a turn at a time, with undo (the web server's games)
  real.py      the real stages: GameStateMLLM -> CogVideoX DiT + DPM++ 2M (dynamic CFG) -> VAE
  standin.py   a random stand-in system with the same interfaces (tests; labelled everywhere)
  system.py    which system a command plays: checkpoint, stand-in, or random tiny fallback
  writers.py   per-turn MP4/GIF with the meters HUD, game video, game.json, index.html, contact sheet
Entry points: ``python -m animegamer_jax.play`` (one game), ``python -m animegamer_jax.generate``
(many games, resumable) and ``python -m animegamer_jax.serve`` (in the browser, animegamer_jax/web/).
"""
