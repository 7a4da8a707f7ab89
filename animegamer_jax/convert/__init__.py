"""The converters of outside checkpoints: the release, ``check-release``, old DiT checkpoints migrated."""
