"""The MLLM family: Mistral-7B and the AnimeGamer MLLM that wraps it.

- ``model.py``: :class:`Mistral` (decoder with the one LoRA module of ``models/lora.py``).
- ``mllm.py``: :class:`GameStateMLLM` (Mistral + input / output resamplers) and ``turn_layout``,
  the one per-turn token layout that training and play both build their sequences from.
- ``convert.py``: the HF Mistral key table (``mistral_leaves``).
- ``mllm_convert.py``: the release MLLM ``.bin`` (peft names) on top of that table.

One folder for both: the MLLM is Mistral plus two small MLPs, and its converter is the Mistral key
table after a peft rename, so the two key tables stay side by side. Command line:
``python -m animegamer_jax.commands.convert {mistral,animegamer-mllm}`` (``animegamer_jax/convert/``).
"""
