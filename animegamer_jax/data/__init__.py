"""The data pipeline: films -> scene cuts -> clips -> labels -> tfds (Beam, ArrayRecord) -> Grain (docs/data.md)."""
