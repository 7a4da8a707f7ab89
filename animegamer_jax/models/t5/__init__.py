"""The T5 v1.1 encoder: the DiT's action text states f_md (docs/encoders.md)."""
