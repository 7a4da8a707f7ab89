"""launch/*.sh: the exact commands of --dry_run (TPU v5p-64 slice, 2-node GPU, SLURM), and a real
2-process CPU job through the multi-node script (jax.distributed + a cross-process collective)."""

import os
import shlex
import subprocess
import sys

import pytest

from tests.subproc import ROOT, free_port, json_results

LAUNCH = os.path.join(ROOT, "launch")
TRAIN = ["--config=configs/animegamer_2b_7b.py", "--config.train.phase=b", "--workdir=gs://bucket/runs/b"]


def _dry(script, *args, **env):
    full = {k: v for k, v in os.environ.items() if k not in ("MODULE", "PROJECT", "REPO_DIR", "SETUP")}
    full.update(env)
    res = subprocess.run(["bash", os.path.join(LAUNCH, script), "--dry_run", *args], capture_output=True,
                         text=True, env=full, timeout=60, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_tpu_pod_v5p_64_copies_code_sets_up_env_and_runs(tmp_path):
    out = _dry("tpu_pod.sh", "my-v5p-64", "us-east5-a", *TRAIN, STAGE_DIR=str(tmp_path), PROJECT="proj")
    print(out)
    lines = out.strip().splitlines()
    assert len(lines) == 4
    tar = f"{tmp_path}/animegamer-jax-code.tar.gz"
    assert lines[0] == (f"cd {ROOT} && git ls-files -z --cached --others --exclude-standard | "
                        f"tar -czf {tar} --null -T -")
    where = ["--zone=us-east5-a", "--project=proj", "--worker=all"]
    gcloud = ["gcloud", "compute", "tpus", "tpu-vm"]
    assert shlex.split(lines[1]) == gcloud + ["scp", tar, "my-v5p-64:~/animegamer-jax-code.tar.gz", *where]
    assert shlex.split(lines[2]) == gcloud + ["ssh", "my-v5p-64", *where, (
        "--command=set -e; mkdir -p ~/animegamer-jax && tar -xzf ~/animegamer-jax-code.tar.gz -C ~/animegamer-jax"
        " && cd ~/animegamer-jax && (test -x .venv/bin/python || python3 -m venv .venv)"
        " && .venv/bin/pip install -q -e '.[tpu]'")]
    run = shlex.split(lines[3])
    assert run[:-1] == gcloud + ["ssh", "my-v5p-64", *where]
    remote = shlex.split(run[-1].removeprefix("--command="))
    assert remote == ["cd", "~/animegamer-jax", "&&", ".venv/bin/python", "-m", "animegamer_jax.commands.train", *TRAIN]
    # the tarball command really packs the checkout (run it)
    subprocess.run(["bash", "-c", lines[0]], check=True, timeout=120)
    names = subprocess.run(["tar", "-tzf", tar], capture_output=True, text=True, check=True).stdout.split()
    assert {"pyproject.toml", "animegamer_jax/commands/train.py", "configs/tiny.py", "launch/tpu_pod.sh"} <= set(names)
    assert not any(n.startswith((".venv", ".git/")) for n in names)


def test_tpu_pod_wheel_and_xpk_modes():
    wheel = _dry("tpu_pod.sh", "--mode=wheel", "my-v5p-64", "us-east5-a", "--workdir=gs://b/r", STAGE_DIR="/stage")
    print(wheel)
    w = [shlex.split(line) for line in wheel.strip().splitlines()]
    assert w[0] == ["python3", "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", "/stage", ROOT]
    assert w[1][4:7] == ["scp", "/stage/animegamer_jax-0.1.0-py3-none-any.whl",
                         "my-v5p-64:~/animegamer_jax-0.1.0-py3-none-any.whl"]
    assert w[2][-1].endswith("agj-venv/bin/pip install -q './animegamer_jax-0.1.0-py3-none-any.whl[tpu]' && agj-venv/"
                             "bin/pip install -q --force-reinstall --no-deps './animegamer_jax-0.1.0-py3-none-any.whl'")
    assert w[3][-1] == "--command=~/agj-venv/bin/python -m animegamer_jax.commands.train --workdir=gs://b/r"
    xpk = _dry("tpu_pod.sh", "--mode=xpk", "my-cluster", "us-east5-a", *TRAIN, IMAGE="gcr.io/p/agj:1", WORKLOAD="w1")
    print(xpk)
    x = [shlex.split(line) for line in xpk.strip().splitlines()]
    assert x[0] == ["docker", "build", "-f", f"{LAUNCH}/Dockerfile", "-t", "gcr.io/p/agj:1", ROOT]
    assert x[1] == ["docker", "push", "gcr.io/p/agj:1"]
    assert x[2] == ["xpk", "workload", "create", "--cluster=my-cluster", "--zone=us-east5-a", "--workload=w1",
                    "--docker-image=gcr.io/p/agj:1", "--tpu-type=v5p-64", "--num-slices=1",
                    "--command=python -m animegamer_jax.commands.train " + " ".join(TRAIN)]
    res = subprocess.run(["bash", f"{LAUNCH}/tpu_pod.sh", "--dry_run", "--mode=xpk", "c", "z"], capture_output=True,
                         text=True, env={k: v for k, v in os.environ.items() if k != "IMAGE"})
    assert res.returncode != 0 and "set IMAGE" in res.stderr


def test_two_node_gpu_and_slurm_dry_run():
    out = _dry("multinode_gpu.sh", *TRAIN, NODE_RANK="1", NUM_NODES="2", COORDINATOR="10.0.0.1:1234")
    print(out)
    assert out.strip().splitlines() == [
        "export JAX_COORDINATOR_ADDRESS=10.0.0.1:1234", "export JAX_NUM_PROCESSES=2", "export JAX_PROCESS_ID=1",
        "export XLA_PYTHON_CLIENT_MEM_FRACTION=0.92", "python3 -m animegamer_jax.commands.train " + " ".join(TRAIN)]
    slurm = _dry("slurm_gpu.sh", *TRAIN)
    print(slurm)
    assert slurm.strip().splitlines() == [
        "export XLA_PYTHON_CLIENT_MEM_FRACTION=0.92",
        "srun --ntasks-per-node=1 python3 -m animegamer_jax.commands.train " + " ".join(TRAIN)]
    res = subprocess.run(["bash", f"{LAUNCH}/multinode_gpu.sh", "--dry_run"], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k not in ("NODE_RANK",)})
    assert res.returncode != 0 and "NODE_RANK" in res.stderr


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_process_cpu_job_through_the_multinode_script():
    port = free_port()
    base = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, MODULE="animegamer_jax.commands.check",
                PYTHON=sys.executable,
                NUM_NODES="2", COORDINATOR=f"127.0.0.1:{port}", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    procs = [subprocess.Popen(["bash", f"{LAUNCH}/multinode_gpu.sh"], env=dict(base, NODE_RANK=str(i)), cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    res = json_results(procs, 300, key="process")
    assert [r["process"] for r in res] == [0, 1]
    for r in res:
        assert r["processes"] == 2 and r["devices"] == 2 and r["gathered"] == [0, 1] and r["backend"] == "cpu"
