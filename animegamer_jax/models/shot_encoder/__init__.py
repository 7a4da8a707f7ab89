"""The shot encoder E_a: T5 + CLIP features -> the action representation s_a (docs/encoders.md)."""
