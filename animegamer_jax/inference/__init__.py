"""One turn's computations: what play, training's sample videos, eval, the compile tool and the release check run.

Modules (bottom to top; each imports only modules above it in this list, ``models``, ``diffusion``
and the layers below them):
  instructions.py      the instruction grammar and text policy: parse_instruction -> Turn; Game (a game's inputs)
  mode.py              the ``game.mode`` rule (apply_mode): default, or the release's reference settings
  layout.py            play's device layouts (apply_layout: latency / batch) and the turn programs' JAX options
  turn_inputs.py       the MLLM token layout of a turn and its window of past turns (docs/token_layout.md),
                       instruction encoding and checks, the turn-window KV cache (CachePlan, TurnKVCache)
  release_decoding.py  the release's decoding quirks (reference mode): logits processor, text parser,
                       recorded noise, uint8 frames
  mllm_turn.py         the MLLM turn: pass B (s_a) and pass A (state decoding with a KV cache), also on
                       the game's persistent cache (mllm_turn_cached)
  action_representation.py  E_a's s_a of a batch (frozen T5 / CLIP features through the shot encoder)
  clip_sampler.py      the DiT sampler (teacher with CFG, or the distilled student): s_a + ML -> latents
  vae_decode.py        the VAE decoder step (tiled / chunked): latents -> frames in FRAME_RANGE
  turn_model.py        TurnModel, what the game engine plays (a Protocol: the stages as methods, five
                       optional capabilities), and RealTurnModel, the real networks on loaded modules
  standin_model.py     StandinTurnModel, a random stand-in TurnModel (tests, --standin; labelled everywhere)
The game engine (game/engine.py) plays a TurnModel; nothing here reads script files, checkpoints
or other files.
"""
