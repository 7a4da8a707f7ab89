"""Bring your own character: fitting a LoRA of the DiT for one character (``character fit``)."""
