"""Shared test set-up: CPU only, fp32 matmuls, one persistent compilation cache per test run, absl flags parsed (grain workers read
them); the ``browser`` fixture (headless Chromium) of the web tests.

Shared helpers live in modules beside the tests (train_helpers.py, web_helpers.py, checkpoint_helpers.py,
dataset_helpers.py, label_helpers.py, random_weights.py, subproc.py, tpu.py): test modules do not import
each other."""

import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# One persistent compilation cache for the whole test run, in a temporary folder (never the user's cache
# folder, cli.compilation_cache's default): the pytest workers and every process a test starts (they
# inherit this environment) load a program another test already compiled instead of compiling it again
# (about -12 % of wall time on the training tests). JAX keys an entry by the program and every compile
# option, so no output depends on it. The controller creates the folder before the workers start and
# removes it at the end (pytest_unconfigure). A size limit (far above what a run writes) makes JAX take
# a file lock around every read and write of an entry, so the two workers and their children never read
# one half-written. Processes that a test kills get no cache (subproc.NO_CACHE; faults.run without
# compile_cache): JAX writes an entry in place, and one cut short reads back as a warning and a
# recompile. Tests of the cache itself (test_compilation_cache.py, faults' compile_cache) name their own.
if "AGJ_TEST_JAX_CACHE" not in os.environ:
    os.environ["AGJ_TEST_JAX_CACHE"] = tempfile.mkdtemp(prefix="agj-test-jax-cache-")
    _CACHE_OWNER = True
else:
    _CACHE_OWNER = False
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["AGJ_TEST_JAX_CACHE"]
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # the tiny programs compile in < 1 s each
os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(64 << 30)  # bytes; > 0 turns on the file lock (jax lru_cache)

import jax  # noqa: E402
import pytest  # noqa: E402
from absl import flags  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
# With this JAX's default (partitionable threefry) a 5-D jax.random.normal compiles for ~13 s on
# this CPU instead of ~0.5 s; tests need speed, not shard-local random streams.
jax.config.update("jax_threefry_partitionable", False)
if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def pytest_unconfigure(config):
    """The process that made the run's compilation cache folder (the xdist controller, or the one pytest
    process) removes it."""
    if _CACHE_OWNER:
        shutil.rmtree(os.environ["AGJ_TEST_JAX_CACHE"], ignore_errors=True)


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
