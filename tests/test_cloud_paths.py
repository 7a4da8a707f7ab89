"""gs:// everywhere, against a real GCS API: gcp-storage-emulator (in memory) on a loopback port.

The process is pointed at it only through the Google client-library convention
``STORAGE_EMULATOR_HOST``; animegamer_jax.paths maps it for tensorstore (orbax's arrays), so a test
that passes here cannot have touched real GCS nor the local disk.
"""

import os
import socket

import pytest

from animegamer_jax import paths
from tests.subproc import ROOT

TEXTS = ["Character: Bunny; Motion: slowly walk out of the burrow; Background: day meadow."]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _send_generation_headers():
    """Real GCS answers media downloads with ``x-goog-generation`` / ``x-goog-metageneration``;
    gcp-storage-emulator omits them, and tensorstore (orbax's OCDBT manifests) needs them."""
    from gcp_storage_emulator import server as srv
    from gcp_storage_emulator.handlers import objects

    original = objects.download
    if getattr(original, "sends_generation", False):
        return

    def download(request, response, storage, *args, **kwargs):
        original(request, response, storage, *args, **kwargs)
        try:
            obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        except Exception:  # NotFound: the 404 is already set
            return
        response["x-goog-generation"] = str(obj["generation"])
        response["x-goog-metageneration"] = str(obj["metageneration"])

    download.sends_generation = True
    objects.download = download  # objects.get(alt=media) calls it by name
    for _, handlers in srv.HANDLERS:
        for method, fn in list(handlers.items()):
            if fn is original:
                handlers[method] = download


@pytest.fixture(scope="module")
def gcs():
    """An in-memory GCS emulator with bucket ``bucket``; yields an fsspec filesystem on it."""
    from gcp_storage_emulator.server import create_server

    _send_generation_headers()
    port = _free_port()
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


_OUTPUT_NAMES = {"game.json", "game.mp4", "turn_000.mp4", "contact_sheet.png", "commit_success.txt",
                 "_CHECKPOINT_METADATA", "manifest.ocdbt", "duel.txt", "metadata"}


def _local_snapshot(*dirs):
    out = set()
    for d in dirs:
        for root, subdirs, files in os.walk(d):
            subdirs[:] = [s for s in subdirs if s not in (".git", "__pycache__", ".pytest_cache", "outputs")]
            out.update(os.path.join(root, f) for f in files)
    return out


@pytest.mark.slow
def test_train_kill_resume_then_play_all_on_gcs(gcs, tmp_path, monkeypatch, capsys):
    """Tiny phase a2 with workdir gs://bucket/run, stopped after step 1 and resumed to step 2, then
    `play --checkpoint gs://bucket/run/system --out gs://bucket/games` with the script on gs:// too:
    every expected object is in the emulator and no file appeared on the local disk."""
    from animegamer_jax import play, system_checkpoint
    from animegamer_jax.train import metrics, pipeline
    from tests.test_train_phases import FAST, loader_example, test_config

    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir(), tmp.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    repo_before = _local_snapshot(ROOT)

    cfg = test_config("a2")
    cfg.train.update(num_steps=2, checkpoint_every=1, log_every=1, progress=False,
                     init_checkpoint=os.path.join(ROOT, "checkpoints", "tiny_system"))
    run = "gs://bucket/run"

    def data():
        return iter(lambda: loader_example(cfg, "a2"), None)

    assert pipeline.run_phase(cfg, run, data=data(), compiler_options=FAST, stop_after=1) == ""
    assert gcs.exists("bucket/run/checkpoints/1") and not gcs.exists("bucket/run/system")
    out = pipeline.run_phase(cfg, run, data=data(), compiler_options=FAST)  # resumes at step 1
    assert out == "gs://bucket/run/system" and system_checkpoint.is_complete(out)
    steps = sorted(int(p.rsplit("/", 1)[1]) for p in gcs.ls("bucket/run/checkpoints") if p.rsplit("/", 1)[1].isdigit())
    assert steps == [1, 2]
    events = sorted(p for p in gcs.ls("bucket/run/tensorboard") if "tfevents" in p)
    assert len(events) == 2  # one event file per run: the first logged step 1, the resumed one step 2
    assert [s for s, _ in metrics.read_scalars("gs://bucket/run/tensorboard")["loss"]] == [1, 2]

    gcs.pipe("bucket/scripts/duel.txt", (TEXTS[0] + "\n").encode())
    capsys.readouterr()
    assert play.main(["gs://bucket/scripts/duel.txt", "--checkpoint", out, "--out", "gs://bucket/games"]) == 0
    printed = capsys.readouterr().out
    assert "outputs: gs://bucket/games/duel/" in printed and "checkpoint gs://bucket/run/system" in printed

    objects = sorted(gcs.find("bucket"))
    print("\nemulator objects after the test:\n" + "\n".join(objects))
    game = {p.removeprefix("bucket/games/duel/") for p in objects if p.startswith("bucket/games/duel/")}
    assert game == {"turn_000.mp4", "turn_000.gif", "game.mp4", "contact_sheet.png", "index.html", "game.json",
                    "timings.json", ".animegamer-game"}
    system = {p.removeprefix("bucket/run/system/").split("/")[0] for p in objects
              if p.startswith("bucket/run/system/")}
    assert {"manifest", "config", "integrity.json", "mllm", "dit", "vae", "shot_encoder", "t5", "clip"} <= system
    assert not [p for p in objects if ".tmp" in p or "write-probe" in p]
    from animegamer_jax.game import writers

    assert writers.read_video("gs://bucket/games/duel/game.mp4").shape[0] > 0
    assert writers.verify_game("gs://bucket/games/duel") is None  # sizes + sha256 of every file, read back
    assert system_checkpoint.verify_checkpoint(out, "full")  # integrity.json of the gs:// system
    # nothing on the local disk: no new file in the working directory, temp dir or the checkout
    assert os.listdir(cwd) == [] and os.listdir(tmp) == []
    # (other tests may add files to the checkout meanwhile: look for what this run would write)
    ours = [p for p in _local_snapshot(ROOT) - repo_before
            if "gs:" in p or "bucket" in p or "tfevents" in p or os.path.basename(p) in _OUTPUT_NAMES]
    assert ours == []
    assert not os.path.exists(os.path.join(ROOT, "gs:"))


def test_dataset_urls_name_the_gcsfuse_fix():
    from animegamer_jax.data import prepare, storage
    from configs import tiny

    with pytest.raises(storage.DatasetError, match=r"gcsfuse --implicit-dirs bucket /gcs/bucket.*/gcs/bucket/ds"):
        storage.shard_paths("gs://bucket/ds", index={"shards": [{"file": "clips.array_record-00000-of-00001"}]})
    with pytest.raises(ValueError, match="gcsfuse"):
        prepare.prepare_dataset([("f", "film.mp4")], "labels.jsonl", "gs://bucket/ds", tiny.get_config().data)
