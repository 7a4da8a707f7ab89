"""animegamer_jax.models: one folder per model family, each holding the network and its converter's
key table (``mistral/``: Mistral + the MLLM; ``cogvideox/``: DiT + VAE; ``clip/``; ``t5/``;
``shot_encoder/``), and the pieces they share: ``attention.py`` (the one attention entry point),
``lora.py`` (the one LoRA module), ``remat.py`` (named remat policies), ``common.py``.
"""
