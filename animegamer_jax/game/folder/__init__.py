"""A game folder: its layout, atomic writes, fingerprint, HUD videos, gallery, saving and reading games back."""
