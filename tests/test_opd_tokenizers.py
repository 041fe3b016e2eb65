"""OPD's teacher must read the student's ids as the same tokens: a teacher tokenizer of the same size
whose vocabulary differs (two entries swapped) is refused before anything starts, naming --rm-url and
a token that differs; the same tokenizer passes."""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slime.cli.args import parse_args
from slime.cli.preflight import PreflightError, check_opd_teacher
from slime.rollout.opd_tokenizers import tokenizer_difference
from slime.utils.processing_utils import load_tokenizer


@pytest.fixture
def swapped_tokenizer(tiny_model_dir, tmp_path):
    """The student's tokenizer with the ids of two ordinary tokens exchanged: same size, other meaning."""
    out = tmp_path / "teacher"
    out.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(tiny_model_dir / name, out / name)
    data = json.loads((out / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    vocab["hello"], vocab["world"] = vocab["world"], vocab["hello"]
    (out / "tokenizer.json").write_text(json.dumps(data))
    return out


def test_a_same_size_tokenizer_with_another_vocabulary_differs(tiny_model_dir, swapped_tokenizer):
    student, teacher = load_tokenizer(str(tiny_model_dir)), load_tokenizer(str(swapped_tokenizer))
    assert len(student) == len(teacher)
    difference = tokenizer_difference(student, teacher)
    assert difference is not None and ("'hello'" in difference or "'world'" in difference), difference
    assert tokenizer_difference(student, load_tokenizer(str(tiny_model_dir))) is None


class ModelInfo(BaseHTTPRequestHandler):
    tokenizer_path = ""

    def do_GET(self):  # noqa: N802 - http.server's name
        body = json.dumps({"model_path": self.tokenizer_path, "tokenizer_path": self.tokenizer_path}).encode()
        self.send_response(200 if self.path == "/get_model_info" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def teacher_at():
    servers = []

    def serve(tokenizer_path) -> str:
        handler = type("Handler", (ModelInfo,), {"tokenizer_path": str(tokenizer_path)})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/generate"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def opd_args(tiny_model_dir, rm_url):
    return parse_args(["--hf-checkpoint", str(tiny_model_dir), "--use-opd", "--opd-type", "sglang", "--rm-url", rm_url])


def test_preflight_refuses_a_teacher_with_another_tokenizer(tiny_model_dir, swapped_tokenizer, teacher_at):
    url = teacher_at(swapped_tokenizer)
    with pytest.raises(PreflightError) as e:
        check_opd_teacher(opd_args(tiny_model_dir, url))
    message = str(e.value)
    assert message.startswith(
        f"--rm-url {url}: the teacher's tokenizer ({swapped_tokenizer}) is not the "
        f"student's ({tiny_model_dir}): the student's token "
    ), message
    assert message.endswith("; its log-probs would be of other tokens")


def test_preflight_accepts_a_teacher_with_the_same_tokenizer(tiny_model_dir, tmp_path, teacher_at):
    same = tmp_path / "same"
    shutil.copytree(tiny_model_dir, same)
    check_opd_teacher(opd_args(tiny_model_dir, teacher_at(same)))
