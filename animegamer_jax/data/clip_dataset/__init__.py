"""The tfds datasets built on Apache Beam (a package of its own: tfds reads a builder's README.md from it)."""
