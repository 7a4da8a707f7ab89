"""The networks (Flax NNX), one folder per family with its converter's key table, and what they share."""
