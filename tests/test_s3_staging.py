"""S3 staging against a real S3 endpoint (moto_server over HTTP): preflight, once per node, safe."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import boto3
import pytest

from sweep.data.synthetic import write_synthetic_glue
from sweep.errors import StagingError
from sweep.storage.archive import UnsafeArchiveError
from sweep.storage.node_cache import MARKER, download_prefix
from sweep.storage.s3 import S3Error, fetch
from sweep.storage.staging import ensure_local, preflight
from sweep.testing.services import SECRET_KEY
from tests.helpers.configs import demo_settings
from tests.helpers.s3 import s3_env, stage_in_process

BUCKET = "sweep-test"


@pytest.fixture
def s3(moto_server, monkeypatch, tmp_path, tiny_roberta_dir):
    """The bucket holding tiny-roberta (a .tgz object) and glue_data (a .tgz object), uploaded by our helper."""
    s3_env(monkeypatch, moto_server)
    boto3.client("s3").create_bucket(Bucket=BUCKET)
    data = write_synthetic_glue(tmp_path / "src", ["WNLI"])
    model = tmp_path / "src" / "tiny-roberta"
    subprocess.run(["cp", "-r", str(tiny_roberta_dir), str(model)], check=True)
    upload(model, "--key", "tiny-roberta")
    upload(data / "glue_data")
    return moto_server


def upload(folder: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "sweep", "upload", str(folder), "--bucket", BUCKET, *args],
                       capture_output=True, text=True, timeout=120)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def settings_for(cache: Path, *overrides: str):
    return demo_settings("storage=s3", f"storage.bucket={BUCKET}", f"storage.cache_dir={cache}", *overrides)


def test_staged_once_then_never_again_then_again_when_replaced(s3, tmp_path):
    settings = settings_for(tmp_path / "node")
    first = ensure_local(settings)
    assert (first.model_dir / "config.json").is_file()
    assert (first.data_dir / "glue_data" / "WNLI" / "train.tsv").is_file()
    assert first.downloaded > 0
    assert (s3.gets(BUCKET, "tiny-roberta"), s3.gets(BUCKET, "glue_data")) == (1, 1)

    second = ensure_local(settings)  # unchanged objects: staged copies reused, nothing downloaded
    assert second == replace(first, downloaded=0)
    assert (s3.gets(BUCKET, "tiny-roberta"), s3.gets(BUCKET, "glue_data")) == (1, 1)

    # Pinned by the driver's preflight, a staged node makes no request at all (not even a HEAD).
    pins = preflight(settings)
    lines = len(s3.log.read_text().splitlines())
    assert ensure_local(settings, pins).downloaded == 0
    assert len(s3.log.read_text().splitlines()) == lines

    # A new version of the data (new ETag): staged again, and the new content is what is seen.
    new = write_synthetic_glue(tmp_path / "src2", ["WNLI", "RTE"])
    upload(new / "glue_data")
    third = ensure_local(settings)
    assert s3.gets(BUCKET, "glue_data") == 2 and s3.gets(BUCKET, "tiny-roberta") == 1
    assert (third.data_dir / "glue_data" / "RTE" / "train.tsv").is_file()
    assert not list(third.data_dir.parent.glob(".*partial*")) and not list(third.data_dir.parent.glob(".*old*"))


def test_a_prefix_of_plain_objects_is_staged_like_an_archive(s3, tmp_path, tiny_roberta_dir):
    upload(tiny_roberta_dir, "--key", "models/tiny-plain", "--plain")
    settings = settings_for(tmp_path / "node", "storage.model_key=models/tiny-plain")
    sources = ensure_local(settings)
    assert sorted(p.name for p in sources.model_dir.iterdir()) == sorted(p.name for p in tiny_roberta_dir.iterdir())
    assert s3.gets(BUCKET, "models/tiny-plain") == len(list(tiny_roberta_dir.iterdir()))
    # The serving side stages a URI the same way.
    served = download_prefix(f"s3://{BUCKET}/models/tiny-plain", tmp_path / "serve")
    assert served == tmp_path / "serve" / "tiny-plain" and (served / "config.json").is_file()


@pytest.mark.parametrize("plain", [False, True], ids=["archive", "prefix"])
def test_a_download_reports_its_progress_in_lines(s3, tmp_path, tiny_roberta_dir, capsys, plain):
    key = "models/tiny-plain" if plain else "tiny-roberta"
    if plain:  # several objects, fetched on several threads into one count
        upload(tiny_roberta_dir, "--key", key, "--plain")
    source = preflight(settings_for(tmp_path / "node", f"storage.model_key={key}")).model
    capsys.readouterr()
    moved = fetch(boto3.client("s3"), source, tmp_path / "target", 2**30, progress_every_s=0)
    lines = capsys.readouterr().out.splitlines()
    assert moved == source.size and lines and all(line.startswith(f"staging: {source.uri}: ") for line in lines)
    done = [float(line.split(": ")[2].split(" / ")[0]) for line in lines]
    mib = f"{source.size / 2**20:.1f}"
    assert done == sorted(done) and lines[-1].split(": ")[2].startswith(f"{mib} / {mib} MiB (100%)")
    # At the default pace a download this small prints nothing: the driver reports the total after.
    fetch(boto3.client("s3"), source, tmp_path / "again", 2**30)
    assert capsys.readouterr().out == ""


@pytest.mark.ray
def test_the_nodes_progress_reaches_the_driver(s3, tmp_path, capsys):
    import ray

    from sweep.cluster.stage_nodes import Staging, stage_all_nodes

    settings = settings_for(tmp_path / "node", "storage.progress_every_s=0")
    pins = preflight(settings)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)  # as the sweep: workers' output not forwarded
    try:
        (staged,) = stage_all_nodes(settings, Staging(pins=pins))
    finally:
        ray.shutdown()
    out = capsys.readouterr().out
    node = staged.node_id[:8]
    for source in (pins.model, pins.data):
        mib = f"{source.size / 2**20:.1f}"
        assert f"staging: node {node}: {source.uri}: {mib} / {mib} MiB (100%)" in out, out
    assert f"staging: node {node} (" in out and "MiB downloaded" in out


def test_eight_processes_at_once_on_one_node_make_one_download(s3, tmp_path):
    overrides = ["storage=s3", f"storage.bucket={BUCKET}", f"storage.cache_dir={tmp_path / 'node'}"]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Manager().Barrier(8)
    with ctx.Pool(8) as pool:
        results = pool.starmap(stage_in_process, [(overrides, barrier)] * 8)
    assert len({(m, d) for m, d, _ in results}) == 1  # everyone got the same folders
    # every object fetched by exactly one process (under load two processes may each win one object's
    # lock, so "one process downloaded" is not the rule; each byte once is)
    client = boto3.client("s3")
    sizes = sum(client.head_object(Bucket=BUCKET, Key=key)["ContentLength"] for key in ("tiny-roberta", "glue_data"))
    assert sum(moved for _, _, moved in results) == sizes
    assert sum(1 for _, _, moved in results if moved) <= 2
    assert (s3.gets(BUCKET, "tiny-roberta"), s3.gets(BUCKET, "glue_data")) == (1, 1)


def test_a_download_killed_halfway_is_staged_cleanly_next_time(s3, tmp_path):
    big = tmp_path / "src" / "big_data" / "glue_data" / "WNLI"
    big.mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv"):
        (big / name).write_text((tmp_path / "src" / "glue_data" / "WNLI" / name).read_text())
    (big / "padding.bin").write_bytes(os.urandom(96 * 2**20))  # incompressible: the GET takes a while
    upload(big.parent, "--key", "big")
    cache = tmp_path / "node"
    script = ("from tests.helpers.configs import demo_settings; from sweep.storage.staging import ensure_local; "
              f"ensure_local(demo_settings('storage=s3', 'storage.bucket={BUCKET}', 'storage.data_key=big', "
              f"'storage.cache_dir={cache}'))")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # the repository: tests.helpers
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    download = cache / "s3" / BUCKET / ".big.partial-"
    deadline = time.monotonic() + 120
    while not any(p.stat().st_size > 2**20 for p in download.parent.glob(".big.partial-*.download")):
        assert proc.poll() is None, "the download finished before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    target = cache / "s3" / BUCKET / "big"
    assert not (target / MARKER).exists()  # nothing looks complete

    sources = ensure_local(settings_for(cache, "storage.data_key=big"))
    assert (sources.data_dir / "glue_data" / "WNLI" / "padding.bin").stat().st_size == 96 * 2**20
    assert (sources.data_dir / MARKER).is_file()
    assert [p.name for p in target.parent.iterdir() if p.name.startswith(".big.")] == [".big.lock"]


def test_an_object_changed_after_preflight_is_an_error_not_a_mix(s3, tmp_path):
    settings = settings_for(tmp_path / "node")
    pins = preflight(settings)
    upload(write_synthetic_glue(tmp_path / "src2", ["WNLI"]) / "glue_data")  # replaced mid-sweep
    with pytest.raises(S3Error, match="s3://sweep-test/glue_data: the object changed since the sweep started"):
        ensure_local(settings, pins)
    assert not (tmp_path / "node" / "s3" / BUCKET / "glue_data").exists()


def test_an_unsafe_archive_in_the_bucket_is_refused(s3, tmp_path):
    import tarfile

    evil = tmp_path / "evil.tgz"
    with tarfile.open(evil, "w:gz") as tar:
        tar.add(tmp_path / "src" / "glue_data", arcname="glue_data")
        info = tarfile.TarInfo("glue_data/../../escaped.txt")
        info.size = 0
        tar.addfile(info)
    boto3.client("s3").upload_file(str(evil), BUCKET, "evil")
    with pytest.raises(UnsafeArchiveError, match="s3://sweep-test/evil: member 'glue_data/../../escaped.txt'"):
        ensure_local(settings_for(tmp_path / "node", "storage.data_key=evil"))
    assert not list(tmp_path.rglob("escaped.txt"))
    assert not (tmp_path / "node" / "s3" / BUCKET / "evil").exists()


@pytest.mark.parametrize(
    "change, message",
    [
        ("no credentials", "no S3 credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
        ("no bucket", "bucket 'missing-bucket' does not exist at http://127.0.0.1:"),
        ("no data key", "s3://sweep-test/glue_datta not found: neither an object nor a prefix glue_datta/"),
        ("no model key", "s3://sweep-test/tiny-robertta not found"),
        ("unreachable", "cannot reach the S3 endpoint http://127.0.0.1:9; check storage.endpoint"),
        ("output bucket", "bucket 'nowhere' does not exist"),
    ],
)
def test_preflight_names_what_is_wrong_quickly_and_never_the_secret(s3, tmp_path, monkeypatch, change, message):
    overrides = {
        "no credentials": [], "no bucket": ["storage.bucket=missing-bucket"],
        "no data key": ["storage.data_key=glue_datta"], "no model key": ["storage.model_key=tiny-robertta"],
        "unreachable": ["storage.endpoint=http://127.0.0.1:9"], "output bucket": ["storage.output_prefix=s3://nowhere/x"],
    }[change]
    if change == "no credentials":
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(name)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    started = time.monotonic()
    with pytest.raises(StagingError) as err:
        preflight(settings_for(tmp_path / "node", *overrides))
    assert message in str(err.value)
    assert time.monotonic() - started < 15
    assert SECRET_KEY not in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "node").exists()  # nothing staged


def test_upload_helper_refuses_what_it_cannot_upload(s3, tmp_path):
    r = upload(tmp_path / "missing", check=False)
    assert r.returncode == 2 and "is not a folder" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "sweep", "upload", str(tmp_path / "src" / "glue_data"),
                        "--bucket", "nope"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "bucket 'nope' does not exist" in r.stderr
    assert SECRET_KEY not in r.stderr + r.stdout


@pytest.mark.parametrize("status, fail, staged", [(503, 2, True), (403, 1, False)])
def test_transient_errors_are_retried_and_permanent_ones_are_not(s3, tmp_path, status, fail, staged):
    from sweep.testing.services import FaultyProxy

    proxy = FaultyProxy(s3.endpoint, f"/{BUCKET}/glue_data", status, fail)
    try:
        settings = settings_for(tmp_path / "node", f"storage.endpoint={proxy.endpoint}")
        if staged:  # 503 SlowDown twice: botocore backs off and retries, the third GET succeeds
            assert (ensure_local(settings).data_dir / "glue_data" / "WNLI" / "train.tsv").is_file()
            assert (proxy.failed, proxy.seen) == (2, 3)
        else:  # 403: no retry, one clear line
            with pytest.raises(S3Error, match=r"s3://sweep-test/glue_data: access denied \(AccessDenied\)"):
                ensure_local(settings)
            assert (proxy.failed, proxy.seen) == (1, 1)
            assert not (tmp_path / "node" / "s3" / BUCKET / "glue_data").exists()
    finally:
        proxy.close()
