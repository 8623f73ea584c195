"""GET/POST /files through the real e2b SDK and raw httpx: bodies, encodings, errors, signatures."""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Iterator

import httpx
import pytest
from e2b import AuthenticationException, FileNotFoundException, InvalidArgumentException

from tests.executor_fixtures import Envd, envd_fixture, run_executor, workdir_fixture  # noqa: F401 - fixtures

MIB = 1024 * 1024


def test_text_round_trip(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    info = sandbox.files.write(f"{workdir}/hello.txt", "hello wörld")
    assert (info.name, info.path) == ("hello.txt", f"{workdir}/hello.txt")
    assert sandbox.files.read(f"{workdir}/hello.txt") == "hello wörld"


def test_one_mib_of_binary_survives_multipart_and_octet_stream(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    data = os.urandom(MIB)
    sandbox.files.write(f"{workdir}/multipart.bin", data)
    sandbox.files.write(f"{workdir}/raw.bin", io.BytesIO(data))  # a file object goes as octet-stream
    assert sandbox.files.read(f"{workdir}/multipart.bin", format="bytes") == data
    assert bytes(sandbox.files.read(f"{workdir}/raw.bin", format="bytes")) == data


def test_gzip_upload_and_gzip_download(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    data = b"compressible " * 10_000
    sandbox.files.write(f"{workdir}/z.txt", data, gzip=True)
    assert sandbox.files.read(f"{workdir}/z.txt", format="bytes", gzip=True) == data
    with envd.client() as client:
        response = client.get("/files", params={"path": f"{workdir}/z.txt"}, headers={"Accept-Encoding": "gzip"})
    assert response.headers["content-encoding"] == "gzip"
    assert int(response.headers.get("content-length", "0")) < len(data)
    assert response.content == data  # httpx undid the gzip


def test_a_download_that_does_not_compress_is_sent_as_it_is(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    data = os.urandom(300_000) + b"compressible " * 10_000  # the first 64 KiB decide
    sandbox.files.write(f"{workdir}/random.bin", data)
    assert sandbox.files.read(f"{workdir}/random.bin", format="bytes") == data
    with envd.client() as client:
        response = client.get("/files", params={"path": f"{workdir}/random.bin"}, headers={"Accept-Encoding": "gzip"})
    assert "content-encoding" not in response.headers
    assert response.headers["content-length"] == str(len(data))
    assert response.content == data


def test_write_files_uploads_several_files_in_one_multipart_request(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    written = sandbox.files.write_files(
        [{"path": f"{workdir}/m/a.txt", "data": "A"}, {"path": f"{workdir}/m/b.txt", "data": "B"}]
    )
    assert [entry.path for entry in written] == [f"{workdir}/m/a.txt", f"{workdir}/m/b.txt"]
    assert [sandbox.files.read(f"{workdir}/m/{name}") for name in ("a.txt", "b.txt")] == ["A", "B"]


def test_path_query_parameter_wins_over_the_part_filename(envd: Envd, workdir: str) -> None:
    files = {"file": ("ignored-name.txt", b"content", "text/plain")}
    with envd.client() as client:
        response = client.post("/files", params={"path": f"{workdir}/chosen.txt"}, files=files)
    assert response.status_code == 200
    assert response.json() == [{"name": "chosen.txt", "type": "file", "path": f"{workdir}/chosen.txt"}]


def test_download_sets_type_disposition_and_length(envd: Envd, workdir: str) -> None:
    envd.sandbox().files.write(f"{workdir}/page.html", "<p>hi</p>")
    with envd.client(**{"Accept-Encoding": "identity"}) as client:
        response = client.get("/files", params={"path": f"{workdir}/page.html"})
        head = client.head("/files", params={"path": f"{workdir}/page.html"})
    assert response.headers["content-type"] == "text/html"
    assert response.headers["content-disposition"] == 'inline; filename="page.html"'
    assert (response.headers["content-length"], response.content) == ("9", b"<p>hi</p>")
    assert (head.status_code, head.headers["content-length"], head.content) == (200, "9", b"")


def test_uploads_are_owned_by_the_named_user(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    assert sandbox.commands.run(f"chmod 777 {workdir}").exit_code == 0  # nobody writes there with its own rights
    sandbox.files.write(f"{workdir}/owned/by/nobody.txt", "x", user="nobody")
    assert sandbox.files.get_info(f"{workdir}/owned/by/nobody.txt").owner == "nobody"
    assert sandbox.files.get_info(f"{workdir}/owned").owner == "nobody"
    sandbox.files.remove(f"{workdir}/owned", user="nobody")  # its own: the default user may not remove them


def test_missing_file_is_404_and_a_directory_is_400(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    with pytest.raises(FileNotFoundException):
        sandbox.files.read(f"{workdir}/missing.txt")
    with pytest.raises(InvalidArgumentException, match="is a directory"):
        sandbox.files.read(workdir)
    with envd.client() as client:
        response = client.get("/files", params={"path": f"{workdir}/missing.txt"})
    assert response.status_code == 404
    assert response.json() == {"code": 404, "message": f"path '{workdir}/missing.txt' does not exist"}


def test_unknown_user_is_401(envd: Envd, workdir: str) -> None:
    with pytest.raises(AuthenticationException):
        envd.sandbox().files.write(f"{workdir}/x", "x", user="no-such-user")


def test_wrong_token_is_401_on_files_and_rpcs(envd: Envd, workdir: str) -> None:
    with envd.client(**{"X-Access-Token": "wrong"}) as client:
        download = client.get("/files", params={"path": f"{workdir}/x"})
        rpc = client.post("/process.Process/List", json={})
    assert download.status_code == 401
    assert rpc.status_code == 401
    assert rpc.json() == {
        "code": 401,
        "message": "unauthorized access, please provide a valid access token or method signing if supported",
    }


def test_signed_urls_work_without_the_token(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    upload = sandbox.upload_url(f"{workdir}/signed.txt", use_signature_expiration=60)
    download = sandbox.download_url(f"{workdir}/signed.txt", use_signature_expiration=60)
    with httpx.Client(timeout=30, headers=envd.routing_headers()) as client:  # no X-Access-Token
        assert client.post(upload, files={"file": ("signed.txt", b"via signature")}).status_code == 200
        assert client.get(download).content == b"via signature"
        assert client.get(download.replace("signature=v1_", "signature=v1_x")).status_code == 401
        assert client.get(download.replace("&signature=", "&nosignature=")).status_code == 401


def test_expired_signature_is_401(envd: Envd, workdir: str) -> None:
    expired = envd.sandbox().download_url(f"{workdir}/x", use_signature_expiration=-10)
    with httpx.Client(timeout=30, headers=envd.routing_headers()) as client:
        response = client.get(expired)
    assert (response.status_code, response.json()["message"]) == (401, "signature is already expired")


def test_unsupported_upload_content_type_is_400(envd: Envd, workdir: str) -> None:
    with envd.client() as client:
        response = client.post(
            "/files", params={"path": f"{workdir}/x"}, content=b"x", headers={"Content-Type": "text/plain"}
        )
    assert response.status_code == 400


def test_unsupported_content_encoding_is_400_and_leaves_the_file_alone(envd: Envd, workdir: str) -> None:
    envd.sandbox().files.write(f"{workdir}/kept.txt", "original")
    headers = {"Content-Type": "application/octet-stream", "Content-Encoding": "br"}
    with envd.client() as client:
        response = client.post("/files", params={"path": f"{workdir}/kept.txt"}, content=b"x", headers=headers)
    assert response.status_code == 400
    assert envd.sandbox().files.read(f"{workdir}/kept.txt") == "original"


def test_octet_stream_upload_needs_a_path(envd: Envd) -> None:
    with envd.client() as client:
        response = client.post("/files", content=b"x", headers={"Content-Type": "application/octet-stream"})
    assert (response.status_code, "path query parameter is required" in response.json()["message"]) == (400, True)


def test_metadata_headers_become_the_files_metadata_in_the_answer_stat_and_list(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    written = sandbox.files.write(f"{workdir}/tagged.txt", "x", metadata={"Owner": "alice", "purpose": "a b"})
    assert written.metadata == {"owner": "alice", "purpose": "a b"}  # keys lower-cased, as envd does
    assert sandbox.files.get_info(f"{workdir}/tagged.txt").metadata == written.metadata
    assert [entry.metadata for entry in sandbox.files.list(workdir)] == [written.metadata]


def test_an_upload_replaces_the_whole_metadata_set(envd: Envd, workdir: str) -> None:
    sandbox = envd.sandbox()
    sandbox.files.write(f"{workdir}/f", "1", metadata={"a": "1", "b": "2"})
    assert sandbox.files.write(f"{workdir}/f", "2", metadata={"b": "3"}).metadata == {"b": "3"}
    sandbox.files.write(f"{workdir}/f", io.BytesIO(b"3"))  # octet-stream, no metadata: the set is emptied
    assert sandbox.files.get_info(f"{workdir}/f").metadata is None


def test_every_file_of_a_multipart_upload_gets_the_metadata(envd: Envd, workdir: str) -> None:
    written = envd.sandbox().files.write_files(
        [{"path": f"{workdir}/a", "data": "A"}, {"path": f"{workdir}/b", "data": "B"}], metadata={"batch": "7"}
    )
    assert [entry.metadata for entry in written] == [{"batch": "7"}, {"batch": "7"}]


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({"X-Metadata-" + "k" * 247: "v"}, "exceeds 246 bytes"),
        ({f"X-Metadata-k{i}": "v" * 1000 for i in range(5)}, "exceeds 4096 bytes"),
        ({"X-Metadata-k": "tab\tinside"}, "non-printable-ASCII"),
    ],
    ids=["key too long", "set too large", "value not printable"],
)
def test_invalid_metadata_is_400_in_e2bs_shape_and_writes_nothing(
    envd: Envd, workdir: str, headers: dict[str, str], reason: str
) -> None:
    raw = {"Content-Type": "application/octet-stream"} | headers
    with envd.client() as client:
        response = client.post("/files", params={"path": f"{workdir}/refused"}, content=b"x", headers=raw)
    assert (response.status_code, response.json()["code"], reason in response.json()["message"]) == (400, 400, True)
    assert not envd.sandbox().files.exists(f"{workdir}/refused")


def test_metadata_set_inside_the_sandbox_is_reported(envd: Envd, workdir: str) -> None:
    """`user.e2b.*` xattrs are the metadata whoever set them: here a program inside, on the sandbox's own disk."""
    sandbox = envd.sandbox()
    sandbox.files.write(f"{workdir}/inside.txt", "x")
    script = f"import os; os.setxattr('{workdir}/inside.txt', 'user.e2b.origin', b'inside')"
    assert sandbox.commands.run(f'python3 -c "{script}"').exit_code == 0
    assert sandbox.files.get_info(f"{workdir}/inside.txt").metadata == {"origin": "inside"}


@pytest.fixture(scope="module")
def small_limit() -> Iterator[Envd]:
    with run_executor("--max-upload-bytes", "1024") as running:
        yield running


@pytest.fixture
def small_limit_dir(small_limit: Envd) -> Iterator[str]:
    sandbox = small_limit.sandbox()
    path = f"/tmp/executor-tests/limit-{uuid.uuid4().hex}"
    sandbox.files.make_dir(path)
    yield path
    sandbox.files.remove(path)


def _chunks(total: int) -> Iterator[bytes]:
    for _ in range(total // 256):
        yield b"x" * 256


def test_uploads_over_the_limit_are_413(small_limit: Envd, small_limit_dir: str) -> None:
    raw = {"Content-Type": "application/octet-stream"}
    with small_limit.client() as client:
        declared = client.post("/files", params={"path": f"{small_limit_dir}/a"}, content=b"x" * 2048, headers=raw)
        # chunked: no Content-Length to check up front; what arrived before the limit stays (as in envd)
        streamed = client.post("/files", params={"path": f"{small_limit_dir}/b"}, content=_chunks(4096), headers=raw)
    assert declared.status_code == streamed.status_code == 413
    assert streamed.json()["message"] == "upload is larger than the limit of 1024 bytes"


def test_uploads_within_the_limit_pass(small_limit: Envd, small_limit_dir: str) -> None:
    sandbox = small_limit.sandbox()
    sandbox.files.write(f"{small_limit_dir}/ok", b"y" * 500, gzip=True)  # the limit counts decompressed bytes
    assert sandbox.files.read(f"{small_limit_dir}/ok") == "y" * 500


def test_a_proc_file_whose_size_says_nothing_is_sent_whole(envd: Envd) -> None:
    """/proc files report size 0: the download is chunked, not cut to 0 bytes, gzip asked or not."""
    with envd.client() as client:
        for encoding in ("gzip", "identity"):
            response = client.get("/files", params={"path": "/proc/self/status"}, headers={"Accept-Encoding": encoding})
            assert response.status_code == 200
            assert b"Name:" in response.content
