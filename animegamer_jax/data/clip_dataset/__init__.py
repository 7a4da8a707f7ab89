"""The tfds datasets built on Apache Beam: ``builder.py`` (the clip dataset, described in README.md)
and ``features.py`` (per-clip f_v / f_md). A package of its own because tfds reads a builder's
README.md and CITATIONS.bib from the builder's package folder.
"""
