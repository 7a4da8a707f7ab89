"""convert release's cache of remote release files (fsspec ``filecache::``), without the release fixture."""

import os

import pytest


def test_remote_files_go_through_fsspec_filecache(tmp_path, monkeypatch):
    """A remote release file is read from fsspec's whole-file cache: copied once (one log line), reused
    from a user-given folder by a later run while the remote object is unchanged, fetched again when it
    changed; a download that failed part-way is dropped, not reused; an own temporary folder is removed."""
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    from animegamer_jax.convert.release_files import LocalCache

    remote = fsspec.filesystem("memory")
    url = "memory://release_cache_test/vae/3d-vae.pt"
    remote.pipe(url, b"a" * 10)
    logs = []
    cache = LocalCache(str(tmp_path / "cache"), logs.append)
    copy = cache.local(url)
    assert open(copy, "rb").read() == b"a" * 10 and cache.local(url) == copy and cache.local("/x/y.pt") == "/x/y.pt"
    assert len(logs) == 1 and logs[0].startswith(f"copying {url} (0.00 GiB) to the local cache {tmp_path / 'cache'}")
    cache.close()
    with open(copy, "wb") as f:  # marks the copy: a reuse keeps it, a new download replaces it
        f.write(b"z" * 10)
    assert open(LocalCache(str(tmp_path / "cache")).local(url), "rb").read() == b"z" * 10
    remote.pipe(url, b"b" * 12)  # the remote object changed
    assert open(LocalCache(str(tmp_path / "cache")).local(url), "rb").read() == b"b" * 12

    url2 = "memory://release_cache_test/AnimeGamer/mllm.bin"
    remote.pipe(url2, b"c" * 8)
    real_get = MemoryFileSystem.get_file

    def broken_get(self, rpath, lpath, **kwargs):
        with open(lpath, "wb") as f:
            f.write(b"c" * 3)
        raise OSError("connection reset")

    monkeypatch.setattr(MemoryFileSystem, "get_file", broken_get)
    with pytest.raises(OSError, match="connection reset"):
        LocalCache(str(tmp_path / "cache")).local(url2)
    monkeypatch.setattr(MemoryFileSystem, "get_file", real_get)
    assert open(LocalCache(str(tmp_path / "cache")).local(url2), "rb").read() == b"c" * 8

    own = LocalCache()
    copy = own.local(url2)
    assert os.path.isfile(copy) and own.directory != str(tmp_path / "cache")
    own.close()
    assert not os.path.exists(own.directory)
    remote.rm("memory://release_cache_test", recursive=True)
