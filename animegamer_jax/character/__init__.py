"""Bring your own character, the per-character route: ``python -m animegamer_jax.commands.character fit``
trains a LoRA of the DiT for one character and stores it, by name, in a new system folder (fit.py)."""
