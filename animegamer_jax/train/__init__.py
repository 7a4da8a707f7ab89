"""Training of AnimeGamer's phases: the phase records, losses, optimizer, loop, pipeline (docs/training.md)."""
