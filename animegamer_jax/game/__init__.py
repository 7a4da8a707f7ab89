"""Game generation: a game script in, a sequence of game states (videos + character states) out.

Modules (bottom to top; each imports only modules above it in this list):
  api.py               the interface: GameSystem (three per-turn functions), TurnResult, STAGES,
                       FRAME_RANGE, apply_mode (game.mode), flow_value
  script.py            game scripts (one instruction a line, or JSONL batches) -> Game / Turn
  window.py            meters, the sliding window of past turns, the MLLM token layout
                       (docs/token_layout.md) and the turn-window KV cache (CachePlan, TurnKVCache)
  release_decoding.py  the release's decoding quirks (reference mode): logits processor, text parser
  real_system.py       the real networks as a GameSystem: GameStateMLLM -> CogVideoX DiT + DPM++ 2M
                       (dynamic CFG) -> VAE; dit_sampler and vae_decoder are its sampling and VAE stages
  standin_system.py    a random stand-in GameSystem with the same interfaces (tests; labelled everywhere)
  loading.py           which system a command plays: checkpoint, stand-in, or random tiny fallback
  engine.py            GameEngine: batches of games advanced turn by turn through three jitted stages
  turn_by_turn.py      TurnByTurnGame: one game played a turn at a time, with undo (the web server's games)
  writers.py           per-turn MP4/GIF with the meters HUD, game video, game.json, index.html, contact sheet
  saving.py            save_game (engine result -> writers), resume checks, the console lines
  flags.py             the command line the game commands share (flags, --config, one-line errors)
Old module names (real, standin, system, reference, session, state) are deprecated aliases.
Entry points: ``python -m animegamer_jax.play`` (one game), ``python -m animegamer_jax.generate``
(many games, resumable) and ``python -m animegamer_jax.web`` (in the browser, animegamer_jax/web/).
"""
