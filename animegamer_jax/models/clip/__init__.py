"""CLIP: the vision tower for f_v and the full model for evaluation (docs/encoders.md)."""
