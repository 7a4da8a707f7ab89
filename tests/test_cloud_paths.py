"""gs:// everywhere, against a real GCS API: gcp-storage-emulator (in memory) on a loopback port.

The process is pointed at it only through the Google client-library convention
``STORAGE_EMULATOR_HOST``; animegamer_jax.io.paths maps it for tensorstore (orbax's arrays), so a test
that passes here cannot have touched real GCS nor the local disk.
"""

import json
import os
import socket
import time
from http import HTTPStatus

import pytest

from animegamer_jax.io import paths
from tests.subproc import ROOT, free_port, hold_lock, probe_lock

TEXTS = ["Character: Bunny; Motion: slowly walk out of the burrow; Background: day meadow."]


def _patch_handler(name, make):
    """Replaces gcp-storage-emulator's object handler ``name`` by ``make(original)`` (the module's
    attribute, which its router calls by name, and its entries in the route table), once."""
    from gcp_storage_emulator import server as emulator_server
    from gcp_storage_emulator.handlers import objects

    original = getattr(objects, name)
    if getattr(original, "patched", False):
        return
    fn = make(original)
    fn.patched = True
    setattr(objects, name, fn)
    for _, handlers in emulator_server.HANDLERS:
        for method, h in list(handlers.items()):
            if h is original:
                handlers[method] = fn


def _send_generation_headers():
    """Real GCS answers media downloads with ``x-goog-generation`` / ``x-goog-metageneration``;
    gcp-storage-emulator omits them, and tensorstore (orbax's OCDBT manifests) needs them."""

    def make(original):
        def download(request, response, storage, *args, **kwargs):
            original(request, response, storage, *args, **kwargs)
            try:
                obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
            except Exception:  # NotFound: the 404 is already set
                return
            response["x-goog-generation"] = str(obj["generation"])
            response["x-goog-metageneration"] = str(obj["metageneration"])
        return download

    _patch_handler("download", make)  # objects.get(alt=media) calls it by name


def _honour_generation_preconditions():
    """Real GCS refuses an upload or a delete with ``ifGenerationMatch=G`` (``0``: no object) when the
    object's generation is not G (HTTP 412); gcp-storage-emulator ignores the parameter (it uploads
    over and deletes anything). Check, then act, as GCS does: the emulator serves one request at a
    time (one thread), so nothing comes between them."""
    from gcp_storage_emulator.exceptions import NotFound

    def current(storage, bucket, name):
        try:
            return str(storage.get_file_obj(bucket, name)["generation"])
        except NotFound:
            return "0"

    def conditional(original, object_name):
        def handler(request, response, storage, *args, **kwargs):
            want = request.query.get("ifGenerationMatch")
            name = object_name(request)
            if want and name and current(storage, request.params["bucket_name"], name) != want[0]:
                response.status = HTTPStatus.PRECONDITION_FAILED
                response.json({"error": {"code": 412, "message": "At least one of the pre-conditions you specified did not hold."}})
                return None
            return original(request, response, storage, *args, **kwargs)
        return handler

    def upload_name(request):
        if "name" in request.query:
            return request.query["name"][0]
        if request.query.get("uploadType") == ["multipart"]:
            return request.data["meta"].get("name")
        return None  # a resumable upload's later parts: its first request was checked

    _patch_handler("insert", lambda original: conditional(original, upload_name))
    _patch_handler("delete", lambda original: conditional(original, lambda request: request.params["object_id"]))


@pytest.fixture(scope="module")
def gcs():
    """An in-memory GCS emulator with bucket ``bucket``; yields an fsspec filesystem on it."""
    from gcp_storage_emulator.server import create_server

    _send_generation_headers()
    _honour_generation_preconditions()
    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="bucket")
    server.start()
    # clients that hang up after reading (tensorstore) make the stdlib server print tracebacks
    server._api._httpd.handle_error = lambda request, client_address: None
    keys = ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT")
    saved = {k: os.environ.get(k) for k in keys}
    for k in keys[1:]:
        os.environ.pop(k, None)
    os.environ["STORAGE_EMULATOR_HOST"] = f"127.0.0.1:{port}"
    paths.configure_gcs_emulator()
    import gcsfs

    fs = gcsfs.GCSFileSystem(token="anon", skip_instance_cache=True)
    try:
        yield fs
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_emulator_env_reaches_tensorstore():
    env = {"STORAGE_EMULATOR_HOST": "localhost:9023"}
    paths.configure_gcs_emulator(env)
    assert env["TENSORSTORE_GCS_HTTP_URL"] == env["STORAGE_EMULATOR_HOST"] == "http://localhost:9023"
    assert env["GOOGLE_AUTH_TOKEN_FOR_TESTING"] and env["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] == "false"
    env = {"STORAGE_EMULATOR_HOST": "http://h:1", "TENSORSTORE_GCS_HTTP_URL": "http://mine:2"}
    paths.configure_gcs_emulator(env)
    assert env["TENSORSTORE_GCS_HTTP_URL"] == "http://mine:2"  # the user's own setting wins
    assert paths.configure_gcs_emulator({}) is None
    assert str(paths.as_path("gs://b/runs/a2")) == "gs://b/runs/a2"  # not ./gs:/b/runs/a2
    assert paths.join("gs://b/runs", "a2", "checkpoints") == "gs://b/runs/a2/checkpoints"
    assert os.path.isabs(str(paths.as_path("rel/dir")))


def test_fileio_same_answers_local_and_gcs(gcs, tmp_path):
    """fileio's operations give the same answers on a local folder and on gs:// (one epath code path)."""
    from animegamer_jax.io import fileio
    answers = []
    for root in (str(tmp_path / "r"), "gs://bucket/fileio"):
        j = lambda *p: paths.join(root, *p)  # noqa: E731
        fileio.makedirs(j("d", "e"))
        fileio.write_text_atomic(j("d", "e", "x.txt"), "hello")
        fileio.write_bytes_atomic(j("d", "y.bin"), b"\0" * 3)
        fileio.write_bytes_atomic(j("d", "y.bin"), b"\1" * 5)  # replaced whole
        fileio.forget_listings(root)
        got = [fileio.exists(j("d", "y.bin")), fileio.exists(j("nope")), fileio.isdir(j("d")), fileio.isfile(j("d")),
               fileio.isfile(j("d", "y.bin")), fileio.listdir(j("d")), list(fileio.walk_files(j("d"))),
               fileio.size(j("d", "y.bin")), fileio.stamp(j("d", "y.bin"))[0], fileio.stamp(j("nope")),
               fileio.read_bytes(j("d", "e", "x.txt")), fileio.sha256_file(j("d", "y.bin")),
               fileio.sha256_sampled(j("d", "y.bin"), 5, 2, 2)]
        fileio.write_text_atomic(j("d", "w.part"), "a file renamed")
        fileio.rename(j("d", "w.part"), j("d", "w.txt"))
        fileio.forget_listings(root)
        got.append([fileio.exists(j("d", "w.part")), fileio.read_bytes(j("d", "w.txt"))])
        with pytest.raises(FileNotFoundError):
            fileio.read_bytes(j("nope"))
        fileio.remove(j("d", "y.bin"))
        fileio.forget_listings(root)
        got.append(fileio.exists(j("d", "y.bin")))
        fileio.rmtree(j("d"))
        fileio.rmtree(j("d"))  # absent: nothing to do
        fileio.forget_listings(root)
        got.append(fileio.exists(j("d")))
        answers.append(got)
    assert answers[0] == answers[1]
    assert answers[0][:9] == [True, False, True, False, True, ["e", "y.bin"], ["e/x.txt", "y.bin"], 5, 5]
    assert answers[0][-2:] == [False, False]


def _dead_lease(gcs, key, content=None):
    """Writes (unconditionally) the lease of a holder that died a second ago at ``key``."""
    gcs.pipe(key, content or json.dumps({"holder": "elsewhere 4242 -", "expires": time.time() - 1,
                                         "token": "dead"}).encode())


def _object(gcs, key):
    """The lease fields at ``key`` as another process would read them now; None when there is none."""
    gcs.invalidate_cache()
    return json.loads(gcs.cat(key)) if gcs.exists(key) else None


def test_gcs_lock_is_a_lease_object_a_second_holder_is_refused(gcs):
    """`locks.exclusive_lock` on gs://: a lease object naming this process with an expiry LEASE_S s on,
    shared by nested holds; another process is refused with the holder's pid and host, and this one
    is refused while another process holds it; the release deletes the object."""
    from animegamer_jax.io import locks

    url, key, me = "gs://bucket/locks/.lock-a", "bucket/locks/.lock-a", f"pid {os.getpid()} on host {socket.gethostname()}"
    before = time.time()
    with locks.exclusive_lock(url) as first:
        with locks.exclusive_lock(url) as second:
            assert (first, second) == (1, 2)
        lease = _object(gcs, key)
        assert lease["holder"].split()[:2] == [socket.gethostname(), str(os.getpid())]
        assert before + locks.LEASE_S <= lease["expires"] <= time.time() + locks.LEASE_S
        assert probe_lock(url) == (3, f"refused: {me}\n")
    assert _object(gcs, key) is None
    holder = hold_lock(url)
    try:
        with pytest.raises(locks.LockHeldError) as e:
            with locks.exclusive_lock(url):
                pass
        assert e.value.holder_words() == f"pid {holder.pid} on host {socket.gethostname()}"
    finally:
        holder.communicate("")
    assert holder.returncode == 0 and _object(gcs, key) is None
    with locks.exclusive_lock("memory://locks/.lock-a") as depth:
        assert depth == 0  # no conditional writes there: no lock (documented)


def test_gcs_stale_lease_is_taken_over_by_exactly_one_taker(gcs):
    """A lease whose expiry passed (its holder died) is taken over: by exclusive_lock, and, of two
    takers that read the same stale lease, by the first to write (the second's precondition on the
    generation they read fails, and it is then refused, the winner named). A damaged lease object
    is taken over too."""
    from animegamer_jax.io import locks

    url, key = "gs://bucket/locks/.lock-b", "bucket/locks/.lock-b"
    _dead_lease(gcs, key)
    with locks.exclusive_lock(url) as depth:
        assert depth == 1 and _object(gcs, key)["holder"].split()[1] == str(os.getpid())
    assert _object(gcs, key) is None

    _dead_lease(gcs, key)
    a, b = locks._Lease(url), locks._Lease(url)
    seen = a.read()
    assert seen == b.read() and seen[0]["token"] == "dead"
    assert a.claim(seen) is True
    assert b.claim(seen) is False  # the same observed generation: only one write can match it
    with pytest.raises(locks.LockHeldError) as e:
        b.take()
    assert e.value.holder_words() == f"pid {os.getpid()} on host {socket.gethostname()}"
    gcs.invalidate_cache()
    assert _object(gcs, key)["token"] == a.token and a.generation == str(gcs.info(key)["generation"])
    b.release()  # never held: nothing deleted
    assert _object(gcs, key)["token"] == a.token
    a.release()
    assert _object(gcs, key) is None

    _dead_lease(gcs, key, b"not a lease")
    with locks.exclusive_lock(url):
        assert _object(gcs, key)["holder"].split()[1] == str(os.getpid())
    assert _object(gcs, key) is None


def test_gcs_lease_renewal_moves_the_expiry_and_a_lost_lease_is_left_to_its_taker(gcs):
    """Driven by an injected clock, no waiting: renew() rewrites the expiry (a new generation); a lease
    not renewed past its expiry is taken over, its old holder's renew() then says it is lost and its
    release leaves the new holder's object."""
    from animegamer_jax.io import locks

    url, key, now = "gs://bucket/locks/.lock-c", "bucket/locks/.lock-c", [1000.0]
    a = locks._Lease(url, clock=lambda: now[0])
    a.take()
    assert _object(gcs, key)["expires"] == 1000.0 + locks.LEASE_S
    first = a.generation
    now[0] = 1030.0
    assert a.renew() is True and a.generation != first
    assert _object(gcs, key)["expires"] == 1030.0 + locks.LEASE_S
    b = locks._Lease(url, clock=lambda: now[0])
    now[0] = 1030.0 + locks.LEASE_S - 1  # renewed: still a's
    with pytest.raises(locks.LockHeldError):
        b.take()
    now[0] = 1030.0 + locks.LEASE_S + 1  # a stopped renewing: expired
    b.take()
    assert _object(gcs, key)["token"] == b.token
    assert a.renew() is False and a.lost
    a.release()
    assert _object(gcs, key)["token"] == b.token
    b.release()
    assert _object(gcs, key) is None


def test_play_continue_of_a_gcs_game_holds_its_lease(gcs, tmp_path, capsys):
    """`play --continue gs://...`: refused with one line and exit 2 while another process holds the
    game's lease; over a dead holder's expired lease it continues the game (2 turns, verified) and
    deletes the lease it took."""
    from animegamer_jax.commands import play
    from animegamer_jax.game.folder import layout

    (tmp_path / "g.txt").write_text(TEXTS[0] + "\n")
    (tmp_path / "more.txt").write_text(TEXTS[0].replace("slowly walk out of", "quickly run into") + "\n")
    assert play.main([str(tmp_path / "g.txt"), "--standin", "--out", "gs://bucket/leased"]) == 0
    game, key = "gs://bucket/leased/g", "bucket/leased/.lock-g"
    assert layout.lock_path(game) == "gs://" + key and _object(gcs, key) is None
    holder = hold_lock(layout.lock_path(game))
    try:
        capsys.readouterr()
        assert play.main(["--continue", game, str(tmp_path / "more.txt"), "--standin"]) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"error: {game} is being written by another process (pid {holder.pid} on host {socket.gethostname()}); "
            "a game folder has one writer at a time. Fix: wait for that process to end (or stop it), or write to "
            "another --out or --game-id"]
    finally:
        holder.communicate("")
    _dead_lease(gcs, key)
    assert play.main(["--continue", game, str(tmp_path / "more.txt"), "--standin"]) == 0
    assert _object(gcs, key) is None  # taken over, then deleted by play as it let go
    gcs.invalidate_cache()
    assert len(json.loads(gcs.cat("bucket/leased/g/game.json"))["turns"]) == 2
    assert layout.verify_game(game) is None


_OUTPUT_NAMES = {"game.json", "game.mp4", "turn_000.mp4", "contact_sheet.png", "commit_success.txt",
                 "_CHECKPOINT_METADATA", "manifest.ocdbt", "duel.txt", "metadata"}


def _local_snapshot(*dirs):
    out = set()
    for d in dirs:
        for root, subdirs, files in os.walk(d):
            subdirs[:] = [s for s in subdirs if s not in (".git", "__pycache__", ".pytest_cache", "outputs")]
            out.update(os.path.join(root, f) for f in files)
    return out


#: the training child: tiny phase a2 (3 steps, a checkpoint every step) with workdir argv[1], the
#: shipped tiny system as init checkpoint. There is no prepared dataset in a fresh clone (``make``
#: builds it), so the batches are tests/train_helpers.py's synthetic ones; with argv[2] == "stall" the data
#: source stalls at the 3rd batch, so the run is certainly mid-way when the test kills it.
_TRAIN_CHILD = r"""
import os, sys, time
from tests.train_helpers import SETUP
exec(SETUP)
from animegamer_jax.train import pipeline
cfg = phase_config("a2")
cfg.train.update(num_steps=3, checkpoint_every=1, log_every=1, progress=False,
                 init_checkpoint=os.path.join(os.environ["ROOT"], "checkpoints", "tiny_system"))

def data():
    n = 0
    while True:
        n += 1
        if sys.argv[2] == "stall" and n > 2:
            print("data source stalled", flush=True)
            time.sleep(3600)
        yield loader_example(cfg, "a2")

# --fast_compile of `python -m animegamer_jax.commands.train`
print("system:", pipeline.run_phase(cfg, sys.argv[1], data=data(),
                                    compiler_options={"xla_backend_optimization_level": 0}), flush=True)
"""


def _committed_steps(gcs, ckpts="bucket/run/checkpoints"):
    gcs.invalidate_cache()
    if not gcs.exists(ckpts):
        return []
    return sorted(int(p.rsplit("/", 2)[-2]) for p in gcs.find(ckpts)
                  if p.endswith("/commit_success.txt") and p.rsplit("/", 2)[-2].isdigit())


@pytest.mark.slow
def test_train_kill_resume_then_play_all_on_gcs(gcs, tmp_path):
    """Tiny phase a2 in a child process with workdir gs://bucket/run, SIGKILLed once a checkpoint is
    committed, resumed by a second child to the end, then `python -m animegamer_jax.commands.play
    gs://bucket/scripts/duel.txt --checkpoint gs://bucket/run/system --out gs://bucket/games`: every
    expected object is in the emulator and nothing was written to the local disk (the children's
    HOME, working directory and TMPDIR stay empty; no new file in the checkout)."""
    import signal
    import subprocess
    import sys

    from animegamer_jax import checkpoint
    from animegamer_jax.train import metrics

    home, cwd, tmp, logs = (tmp_path / n for n in ("home", "cwd", "tmp", "logs"))
    for d in (home, cwd, tmp, logs):
        d.mkdir()
    repo_before = _local_snapshot(ROOT)
    env = dict(os.environ, HOME=str(home), TMPDIR=str(tmp), ROOT=ROOT, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_THREEFRY_PARTITIONABLE="0")
    run = "gs://bucket/run"
    t0 = time.perf_counter()

    def child(args, name):
        out, err = open(logs / f"{name}.out", "w"), open(logs / f"{name}.err", "w")
        return subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=out, stderr=err), (out, err)

    def text(name):
        return (logs / f"{name}.out").read_text() + (logs / f"{name}.err").read_text()[-6000:]

    # 1. train until a checkpoint is committed, then SIGKILL (no chance to clean up or flush)
    proc, files = child(["-c", _TRAIN_CHILD, run, "stall"], "train1")
    deadline = time.time() + 600
    while not _committed_steps(gcs):
        assert proc.poll() is None, f"the first run ended (rc {proc.returncode}) before a checkpoint:\n{text('train1')}"
        assert time.time() < deadline, text("train1")
        time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(60) == -signal.SIGKILL
    [f.close() for f in files]
    killed_at = _committed_steps(gcs)
    t_kill = time.perf_counter() - t0
    assert killed_at and max(killed_at) < 3 and not gcs.exists("bucket/run/system")

    # 2. resume in a new process: from the newest committed step to step 3, then the system checkpoint
    proc, files = child(["-c", _TRAIN_CHILD, run, "go"], "train2")
    rc = proc.wait(600)
    [f.close() for f in files]
    assert rc == 0, text("train2")
    assert "system: gs://bucket/run/system" in text("train2")
    out = "gs://bucket/run/system"
    assert checkpoint.is_complete(out)
    assert 3 in _committed_steps(gcs) and set(killed_at) <= set(_committed_steps(gcs)) | {1, 2}
    events = sorted(p for p in gcs.ls("bucket/run/tensorboard") if "tfevents" in p)
    assert len(events) == 2  # one event file per process
    losses = metrics.read_scalars("gs://bucket/run/tensorboard")["loss"]
    # The resumed process logs every step after the newest committed one. The killed process's
    # summaries of the steps before it may be lost: SIGKILL leaves no chance to flush the event file.
    logged = {s for s, _ in losses}
    assert set(range(max(killed_at) + 1, 4)) <= logged <= {1, 2, 3}, (killed_at, logged)
    t_resume = time.perf_counter() - t0

    # 3. play the trained system from gs:// into gs:// (the script on gs:// too)
    gcs.pipe("bucket/scripts/duel.txt", (TEXTS[0] + "\n").encode())
    proc, files = child(["-m", "animegamer_jax.commands.play", "gs://bucket/scripts/duel.txt", "--checkpoint", out,
                         "--out", "gs://bucket/games"], "play")
    rc = proc.wait(600)
    [f.close() for f in files]
    printed = text("play")
    assert rc == 0, printed
    assert "outputs: gs://bucket/games/duel/" in printed and "checkpoint gs://bucket/run/system" in printed
    t_total = time.perf_counter() - t0
    print(f"\ntimes: killed after {t_kill:.1f} s (committed steps {killed_at}), resumed run done at "
          f"{t_resume:.1f} s, play done at {t_total:.1f} s")

    gcs.invalidate_cache()
    objects = sorted(gcs.find("bucket"))
    print("emulator objects after the test:\n" + "\n".join(objects))
    game = {p.removeprefix("bucket/games/duel/") for p in objects if p.startswith("bucket/games/duel/")}
    assert game == {"turn_000.mp4", "turn_000.gif", "game.mp4", "contact_sheet.png", "index.html", "game.json",
                    "timings.json", ".animegamer-game", "turn_000.state.npz"}
    system = {p.removeprefix("bucket/run/system/").split("/")[0] for p in objects
              if p.startswith("bucket/run/system/")}
    assert {"manifest", "config", "integrity.json", "mllm", "dit", "vae", "shot_encoder", "t5", "clip"} <= system
    assert not [p for p in objects if ".tmp" in p or "write-probe" in p]
    from animegamer_jax.game.folder import layout
    assert layout.read_video("gs://bucket/games/duel/game.mp4").shape[0] > 0
    assert layout.verify_game("gs://bucket/games/duel") is None  # sizes + sha256 of every file, read back
    assert checkpoint.verify_checkpoint(out, "full")  # integrity.json of the gs:// system
    # nothing on the local disk: the children's HOME, working directory and temp dir stay empty
    assert _local_snapshot(home) == set() and os.listdir(cwd) == [] and os.listdir(tmp) == []
    # (other tests may add files to the checkout meanwhile: look for what this run would write)
    ours = [p for p in _local_snapshot(ROOT) - repo_before
            if "gs:" in p or "bucket" in p or "tfevents" in p or os.path.basename(p) in _OUTPUT_NAMES]
    assert ours == []
    assert not os.path.exists(os.path.join(ROOT, "gs:"))


def test_dataset_urls_name_the_gcsfuse_fix():
    from animegamer_jax.data import datasets, prepare
    from configs import tiny

    with pytest.raises(datasets.DatasetError, match=r"gcsfuse --implicit-dirs bucket /gcs/bucket.*/gcs/bucket/ds"):
        datasets.open_split("gs://bucket/ds")
    with pytest.raises(ValueError, match="gcsfuse"):
        prepare.prepare_dataset([("f", "film.mp4")], "labels.jsonl", "gs://bucket/ds", tiny.get_config().data)


RELEASE_FIXTURE = os.path.join(ROOT, "..", "shared", "fixtures", "release_tiny")


@pytest.mark.paper  # ~1 min: every zarr leaf is a few requests to the single-threaded emulator; the local
# conversion is tests/test_release.py's, gs:// training, checkpoints and play test_train_kill_resume_then_play_all_on_gcs's
@pytest.mark.skipif(not os.path.isdir(os.path.join(RELEASE_FIXTURE, "release")),
                    reason="release fixture absent (CI clones shared/ beside the repo)")
def test_convert_release_from_and_to_gcs(gcs, tmp_path, monkeypatch, capsys):
    """`convert release gs://bucket/release gs://bucket/converted`: the remote files are copied into the
    local cache as they are needed (said on stdout) and memory-mapped there, the system checkpoint is
    written straight to gs:// and is byte-identical to a local conversion; a failed one leaves nothing
    at DST; the default cache is a temporary folder removed afterwards."""
    import tempfile

    from animegamer_jax import checkpoint
    from animegamer_jax.convert import check_release
    from animegamer_jax.commands.convert import main as convert_main

    config = os.path.join(ROOT, "configs", "release_tiny.py")
    gcs.put(os.path.join(RELEASE_FIXTURE, "release"), "bucket/release", recursive=True)
    cache = tmp_path / "cache"
    assert convert_main(["release", "gs://bucket/release", "gs://bucket/converted", "--config", config,
                         f"--cache_dir={cache}"]) == 0
    out = capsys.readouterr().out
    assert "copying gs://bucket/release/AnimeGamer/VDM_Decoder-Qiqi/10000/mp_rank_00_model_states.pt (" in out
    assert f"to the local cache {cache} (" in out
    assert "wrote gs://bucket/converted: " in out
    assert checkpoint.is_complete("gs://bucket/converted")
    assert (cache / "cache").is_file() and len(os.listdir(cache)) > 2  # a user-given cache is kept (fsspec filecache: metadata + copies, reused by a rerun)

    local = str(tmp_path / "local")
    assert convert_main(["release", os.path.join(RELEASE_FIXTURE, "release"), local, "--config", config]) == 0
    assert "copying" not in capsys.readouterr().out  # local files are memory-mapped in place
    remote_files = checkpoint.verify_checkpoint("gs://bucket/converted", "fast")["files"]
    local_files = checkpoint.verify_checkpoint(local, "fast")["files"]
    assert sorted(remote_files) == sorted(local_files)
    differ = sorted(k for k in local_files if local_files[k]["sha256"] != remote_files[k]["sha256"])
    # only the files that record the directory or the time differ
    assert {os.path.basename(k) for k in differ} <= {"commit_success.txt", "_CHECKPOINT_METADATA"}, differ
    assert checkpoint.read_manifest(local) == checkpoint.read_manifest("gs://bucket/converted")

    # the default cache: a temporary folder, removed afterwards; a failure leaves nothing at DST
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    paper = os.path.join(ROOT, "configs", "animegamer_2b_7b.py")  # sizes that do not fit the tiny weights
    assert convert_main(["release", "gs://bucket/release", "gs://bucket/bad", "--config", paper]) == 1
    err = capsys.readouterr().err
    assert "error: gs://bucket/release/AnimeGamer/MLLM-Qiqi/pytorch_model.bin: key" in err
    assert "nothing written at gs://bucket/bad" in err
    gcs.invalidate_cache()
    assert not gcs.exists("bucket/bad") and os.listdir(tmp) == []
    assert convert_main(["release", "gs://bucket/nope", "gs://bucket/bad2", "--config", config]) == 2
    assert "error: gs://bucket/nope: release folder not found" in capsys.readouterr().err

    # check-release reads a case from a URL too (its noise floors beside the cases folder)
    gcs.put(os.path.join(RELEASE_FIXTURE, "noise_floor.json"), "bucket/fixture/noise_floor.json")
    case = sorted(os.listdir(os.path.join(RELEASE_FIXTURE, "cases")))[0].rsplit(".", 1)[0]
    assert check_release.tolerances(f"gs://bucket/fixture/cases/{case}.npz") == \
        check_release.tolerances(os.path.join(RELEASE_FIXTURE, "cases", f"{case}.npz"))


@pytest.mark.slow
def test_training_checkpoint_integrity_and_damaged_step_on_gcs(gcs, capsys):
    """On gs:// (orbax's commit file instead of a rename) every step carries integrity.json written before
    its commit_success.txt; a damaged newest step is kept aside (copied, then removed) and the older
    step resumed."""
    import fsspec
    import jax
    import numpy as np
    from flax import nnx

    from animegamer_jax import checkpoint
    from animegamer_jax.train import loop, optim
    from tests.train_helpers import Toy, one_device_mesh, toy_data, toy_loss, toy_trainable, train_cfg

    tx, sched = optim.make_optimizer(train_cfg())
    tr = loop.Trainer(lambda: Toy(nnx.Rngs(0)), toy_loss, tx, toy_trainable, one_device_mesh(), schedule=sched)
    kw = dict(num_steps=4, global_batch_size=4, checkpoint_every=2, progress=False)
    full = loop.fit(tr, toy_data(4), workdir="gs://bucket/toy", **kw)
    assert _committed_steps(gcs, "bucket/toy/checkpoints") == [2, 4]
    man = checkpoint.verify_checkpoint("gs://bucket/toy/checkpoints/4", "full")
    assert "data/process_0-of-1.json" in man["files"] and "commit_success.txt" not in man["files"]
    gcs.pipe("bucket/toy/checkpoints/4/data/process_0-of-1.json", b"")
    fsspec.core.url_to_fs("gs://bucket")[0].invalidate_cache()  # as a new process would see it
    capsys.readouterr()
    r = loop.fit(tr, toy_data(4), workdir="gs://bucket/toy", **kw)
    assert capsys.readouterr().err.strip().splitlines() == [
        "checkpoint gs://bucket/toy/checkpoints/4 is damaged: file data/process_0-of-1.json is truncated (0 bytes, "
        f"{man['files']['data/process_0-of-1.json']['size']} when saved); kept aside as "
        "gs://bucket/toy/checkpoints/4.damaged-1; resuming from step 2"]
    assert r.start_step == 2
    for a, b in zip(jax.tree.leaves(r.state), jax.tree.leaves(full.state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    gcs.invalidate_cache()
    assert gcs.cat("bucket/toy/checkpoints/4.damaged-1/data/process_0-of-1.json") == b""
    assert _committed_steps(gcs, "bucket/toy/checkpoints") == [2, 4]
