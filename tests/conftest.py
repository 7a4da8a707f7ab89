"""Shared test set-up: CPU only, fp32 matmuls, no persistent compilation cache, absl flags parsed (grain workers read
them), Python's Ctrl-C handler; the ``browser`` fixture (headless Chromium) of the web tests.

Shared helpers live in modules beside the tests (train_helpers.py, web_helpers.py, checkpoint_helpers.py,
dataset_helpers.py, label_helpers.py, random_weights.py, subproc.py, tpu.py): test modules do not import
each other."""

import os
import shutil
import signal

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Commands cache compiled programs in the user's cache folder by default (cli.compilation_cache): tests
# (and the commands they start, which inherit this environment) use no persistent cache at all, so
# they write nothing into the home folder and do not depend on one another's compiles.
os.environ["JAX_COMPILATION_CACHE_DIR"] = ""

import jax  # noqa: E402
import pytest  # noqa: E402
from absl import flags  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
# With this JAX's default (partitionable threefry) a 5-D jax.random.normal compiles for ~13 s on
# this CPU instead of ~0.5 s; tests need speed, not shard-local random streams.
jax.config.update("jax_threefry_partitionable", False)
if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
# Ctrl-C is KeyboardInterrupt in the tests even when the run was started in the background of a
# non-interactive shell (which starts it with SIGINT ignored, and Python then installs no handler).
signal.signal(signal.SIGINT, signal.default_int_handler)


# The headless Chromium of the web tests (tests/test_web*.py), installed by `make browser`.
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture
def browser(tmp_path):
    """A selenium driver of headless Chromium (its own profile under ``tmp_path``); skips, saying why,
    where chromium / chromedriver are not installed."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip("headless Chromium is not installed (no chromium / chromedriver on PATH). Fix: "
                    "`make browser` (apt-get install chromium chromium-driver); make test and CI run it")
    from selenium import webdriver  # optional
    from selenium.webdriver.chrome.service import Service  # optional

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", "--autoplay-policy=no-user-gesture-required",
              "--window-size=1280,1400", f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
