"""Compile-only TPU devices for tests (the real TPU compiler, deviceless)."""

import os


def tpu_devices(topology: str = "v5e-4"):
    """Compile-only devices of a TPU ``topology`` (the real TPU compiler, libtpu, no TPU needed).

    Skips where libtpu is not installed (``make tpu-compiler``), except under CI (``CI=true``), where
    the Makefile installs it and its absence is a failure."""
    import pytest

    from animegamer_jax.parallel import target

    if not target.tpu_compiler_available():
        if os.environ.get("CI"):
            pytest.fail("the TPU compiler (libtpu) is missing under CI: `make tpu-compiler` installs it")
        pytest.skip("the TPU compiler (libtpu) is not installed: make tpu-compiler")
    return target.compile_devices(target.parse_topology(topology))
