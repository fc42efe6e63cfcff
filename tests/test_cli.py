"""The ``response-compaction`` command line, always through a real subprocess."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest

import response_compaction as rc
from response_compaction import sync
from response_compaction._cli._commands import DEFAULT_FALLBACK, DefaultSummary
from tests.fake_openai import FakeOpenAI, Hang, Status, summary_reply

REPO = Path(__file__).resolve().parent.parent
SUBCOMMANDS = ("compact", "read", "verify", "prune", "mcp", "demo")


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without any model configuration, plus ``extra``."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "RESPONSE_COMPACTION_"))
    }
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def cli(
    *args: str | Path,
    stdin: bytes | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    command: tuple[str, ...] = (sys.executable, "-m", "response_compaction"),
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*command, *map(str, args)],
        input=stdin,
        capture_output=True,
        env=env if env is not None else clean_env(),
        cwd=cwd,
        timeout=120,
        check=False,
    )


def compact(root: Path, document: Any, *extra: str) -> dict[str, Any]:
    done = cli("compact", "-", "--root", root, *extra, stdin=json.dumps(document).encode())
    assert done.returncode == 0, done.stderr.decode()
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def store_in_process(root: Path, document: Any) -> str:
    """Set up an entry through the library itself (quicker than a CLI run); its exact_ref."""
    harness = rc.Harness(fs=rc.LocalWorkspace(root))
    options = {"fallback": DEFAULT_FALLBACK, "ladder": "unused"}
    raw = msgspec.Raw(json.dumps(document).encode())
    return sync.response_compact(harness, raw, Any, DefaultSummary, options).receipt.exact_ref


def big_document(rows: int = 2000) -> dict[str, Any]:
    return {"rows": [{"id": i, "name": f"row {i}", "tags": ["a"]} for i in range(rows)]}


def entry_path(root: Path, ref: str) -> Path:
    hex_digest = ref.removeprefix("rc1:")
    return root / "response-compaction-v1" / "exact" / hex_digest[:2] / hex_digest


def test_help_on_every_subcommand() -> None:
    """``--help`` works on the command and on each subcommand, and names the subcommand."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = list(pool.map(lambda sub: cli(*sub, "--help"), [(), *[(s,) for s in SUBCOMMANDS]]))
    top, *subs = runs
    assert top.returncode == 0
    for name in SUBCOMMANDS:
        assert name in top.stdout.decode()
    for name, done in zip(SUBCOMMANDS, subs, strict=True):
        assert done.returncode == 0, done.stderr.decode()
        assert done.stdout.decode().startswith(f"usage: response-compaction {name}")
        assert done.stderr == b""


def test_console_script_and_schemas_from_the_working_directory(tmp_path: Path) -> None:
    """The installed ``response-compaction`` script loads ``--schema module:Type`` from the cwd."""
    script = Path(sys.executable).with_name("response-compaction")
    (tmp_path / "myschemas.py").write_text(
        textwrap.dedent(
            """
            import msgspec

            class Point(msgspec.Struct):
                x: int
                y: int
            """
        )
    )
    env = clean_env()
    del env["PYTHONPATH"]
    done = cli(
        "compact",
        "-",
        "--root",
        tmp_path / "root",
        "--schema",
        "myschemas:Point",
        stdin=b'{"y": 2, "x": 1}',
        env=env,
        cwd=tmp_path,
        command=(str(script),),
    )
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout)["output"] == {"kind": "exact", "value": {"x": 1, "y": 2}}
    bad = cli(
        "compact",
        "-",
        "--root",
        tmp_path / "root",
        "--schema",
        "myschemas:Point",
        stdin=b'{"x": "one", "y": 2}',
        env=env,
        cwd=tmp_path,
        command=(str(script),),
    )
    assert bad.returncode == 1
    assert bad.stdout == b""
    assert b"does not validate" in bad.stderr


def test_pydantic_schema_compacts_and_reads_back(tmp_path: Path) -> None:
    """``--schema`` naming a pydantic model prints the receipt and the value, no traceback."""
    (tmp_path / "pschemas.py").write_text(
        "from pydantic import BaseModel, Field\n\n"
        "class P(BaseModel):\n"
        "    x: int\n"
        "    y: str = Field(alias='why')\n"
    )
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join((str(REPO), str(tmp_path)))
    common = ("--root", tmp_path / "root", "--schema", "pschemas:P")
    done = cli("compact", "-", *common, stdin=b'{"x": 1, "why": "a"}', env=env)
    assert done.returncode == 0, done.stderr.decode()
    result = json.loads(done.stdout)
    assert result["output"] == {"kind": "exact", "value": {"x": 1, "why": "a"}}
    read = cli("read", result["receipt"]["exact_ref"], *common, env=env)
    assert (read.returncode, read.stdout) == (0, b'{"why":"a","x":1}\n'), read.stderr.decode()


def test_compact_small_then_read_it_back(tmp_path: Path) -> None:
    """A small document comes back exact; ``read`` prints its canonical JSON and exits 0."""
    result = compact(tmp_path, {"b": [1, 2.5, None], "a": "\u00e9"})
    assert result["output"] == {"kind": "exact", "value": {"a": "\u00e9", "b": [1, 2.5, None]}}
    receipt = result["receipt"]
    assert receipt["exact_cache"] == "stored"
    assert receipt["summary_cache"] == "not_needed"
    done = cli("read", receipt["exact_ref"], "--root", tmp_path)
    assert done.returncode == 0
    assert done.stdout == '{"a":"\u00e9","b":[1,2.5,null]}\n'.encode()
    assert done.stderr == b""


def test_compact_large_without_a_model_returns_the_fallback(tmp_path: Path) -> None:
    """Large input with no model configured: fallback, reason no_llm, and stderr says why."""
    source = tmp_path / "big.json"
    source.write_text(json.dumps(big_document()))
    done = cli("compact", source, "--root", tmp_path / "root", "--above", "1000")
    assert done.returncode == 0, done.stderr.decode()
    result = json.loads(done.stdout)
    assert result["output"]["kind"] == "fallback"
    assert result["output"]["value"]["critical_facts"] == []
    assert result["receipt"]["fallback_reason"] == "no_llm"
    assert result["receipt"]["exact_bytes"] > 1000
    stderr = done.stderr.decode()
    assert "no model configured" in stderr
    assert "RESPONSE_COMPACTION_MODEL" in stderr
    assert "\r" not in stderr  # no progress line when stderr is not a terminal


@pytest.mark.parametrize(
    ("overview", "code"), [("MY FALLBACK", 0), ("o" * 201, 1)], ids=["fits", "too long"]
)
def test_a_fallback_of_one_s_own_is_kept_for_a_server_that_is_not_openai(
    tmp_path: Path, overview: str, code: int
) -> None:
    """The default summary is asked for with bounds from a server not OpenAI's, and the
    user's --fallback, converted to it, was replaced by the default one; one that breaks the
    bounds is a usage error, not silently another fallback."""
    source = tmp_path / "big.json"
    source.write_text(json.dumps(big_document()))
    fallback = json.dumps({"overview": overview, "critical_facts": ["a"]})
    env = clean_env(OPENAI_BASE_URL="http://127.0.0.1:9/v1")
    done = cli("compact", source, "--root", tmp_path, "--above", "10", "--fallback", fallback,
               env=env)  # fmt: skip
    assert done.returncode == code, done.stderr.decode()
    if code == 0:
        assert json.loads(done.stdout)["output"]["value"]["overview"] == "MY FALLBACK"
    else:
        assert "--fallback must fit" in done.stderr.decode()


def test_compact_with_a_model_and_custom_schemas(tmp_path: Path) -> None:
    """With OPENAI_BASE_URL and --model set, large input is summarized by that model."""
    fallback = json.dumps({"overview": "kept", "critical_facts": []})
    document = {"rows": [{"id": i, "name": "x" * 30} for i in range(500)], "total": 500}
    with FakeOpenAI(fill_unscripted=True) as server:
        env = clean_env(OPENAI_BASE_URL=server.base_url)
        done = cli(
            "compact",
            "-",
            "--root",
            tmp_path,
            "--schema",
            "tests.schemas:Exact",
            "--summary-schema",
            "tests.schemas:Summary",
            "--fallback",
            fallback,
            "--model",
            "small-model",
            "--model",
            "big-model",
            "--instructions",
            "count the rows",
            stdin=json.dumps(document).encode(),
            env=env,
        )
    assert done.returncode == 0, done.stderr.decode()
    result = json.loads(done.stdout)
    assert result["output"]["kind"] == "summarized"
    assert set(result["output"]["value"]) == {"overview", "critical_facts"}
    assert result["receipt"]["route"] == "small-model"
    assert result["receipt"]["ladder"] == "default"
    assert [body["model"] for body in server.bodies()] == ["small-model"]
    assert "count the rows" in server.bodies()[0]["messages"][0]["content"]


@pytest.mark.parametrize(
    ("flags", "bounded", "temperature"),
    [
        ((), True, 0.0),
        (("--schema-dialect", "strict", "--temperature", "0.3"), False, 0.3),
        (("--schema-dialect", "full", "--temperature", "server"), True, None),
    ],
)
def test_model_flags_reach_the_request(
    tmp_path: Path, flags: tuple[str, ...], bounded: bool, temperature: float | None
) -> None:
    """The default summary's bounds go to a non-OpenAI server ('auto'); --temperature is sent."""
    with FakeOpenAI(fill_unscripted=True) as server:
        env = clean_env(OPENAI_BASE_URL=server.base_url, RESPONSE_COMPACTION_MODEL="local")
        done = cli("compact", "-", "--root", tmp_path, *flags, stdin=big_payload(), env=env)
        (body,) = server.bodies()
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout)["output"]["kind"] == "summarized"
    schema = body["response_format"]["json_schema"]["schema"]["properties"]
    assert ("maxLength" in schema["overview"]) is bounded
    assert ("maxItems" in schema["critical_facts"]) is bounded
    assert "at most 3 facts" in schema["critical_facts"]["description"]  # said either way
    assert body.get("temperature") == temperature


def test_ground_flag_rejects_an_invented_identifier(tmp_path: Path) -> None:
    """--ground FIELD: a summary naming an id the document lacks is 'ungrounded', next rung."""
    invented = {"overview": "see ticket INC-99999", "critical_facts": []}
    honest = {"overview": "rows of names", "critical_facts": []}
    with FakeOpenAI() as server:
        server.script("first", summary_reply(invented))
        server.script("second", summary_reply(honest))
        env = clean_env(OPENAI_BASE_URL=server.base_url)
        args = ("--model", "first", "--model", "second", "--ground", "overview")
        done = cli("compact", "-", "--root", tmp_path, *args, stdin=big_payload(), env=env)
    assert done.returncode == 0, done.stderr.decode()
    result = json.loads(done.stdout)
    assert result["output"]["value"] == honest
    outcomes = [a["outcome"] for a in result["receipt"]["attempts"]]
    assert outcomes == ["ungrounded", "ok"]
    assert "rung first ungrounded" in done.stderr.decode()


def big_payload() -> bytes:
    return json.dumps(big_document()).encode()


def test_failed_rungs_and_the_fallback_are_one_stderr_line_each(tmp_path: Path) -> None:
    """Each failed rung prints its route, outcome and cause; the fallback says why; exit 0."""
    with FakeOpenAI() as server:
        server.script("broken", Status(400, error={"type": "exceed_context_size_error"}))
        server.script("hung", Hang())
        env = clean_env(OPENAI_BASE_URL=server.base_url)
        done = cli(
            "compact",
            "-",
            "--root",
            tmp_path,
            "--model",
            "broken",
            "--model",
            "hung",
            "--rung-timeout-ms",
            "5000",  # the broken rung's two calls well inside it on a loaded machine
            "--shown-bytes",
            "4096",
            "--coverage",
            "head",
            stdin=json.dumps(big_document()).encode(),
            env=env,
        )
        prompts = [len(b["messages"][1]["content"].encode()) for b in server.bodies("broken")]
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stderr.decode().splitlines()
    assert lines == [
        lines[0],
        lines[1],
        lines[2],
        "response-compaction: the fallback was returned: timeout",
    ]
    assert re.fullmatch(
        r"response-compaction: rung broken error: HTTP 400 exceed_context_size_error \(\d+ ms\)",
        lines[0],
    )
    assert lines[1].startswith("response-compaction: rung broken retry error: HTTP 400")
    assert lines[2].startswith("response-compaction: rung hung timeout (")
    result = json.loads(done.stdout)
    assert result["output"]["kind"] == "fallback"
    assert prompts[0] <= 4096 + 400  # --shown-bytes bounds the head shown
    assert prompts[1] < prompts[0]


def test_progress_on_a_terminal(tmp_path: Path) -> None:
    """When stderr is a terminal, a large input shows a progress line there."""
    source = tmp_path / "big.json"
    source.write_text(json.dumps(big_document(90_000)))
    assert source.stat().st_size > 4 << 20
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "response_compaction", "compact", source, "--root", tmp_path],
            stdout=subprocess.PIPE,
            stderr=follower,
            env=clean_env(),
            timeout=120,
            check=False,
        )
        os.close(follower)
        follower = -1
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal has no writer left
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(leader)
        if follower != -1:
            os.close(follower)
    assert done.returncode == 0
    assert b"compacting" in seen
    assert json.loads(done.stdout)["receipt"]["fallback_reason"] == "no_llm"


def test_read_missing_exits_3(tmp_path: Path) -> None:
    """A well-formed reference that was never stored exits 3, nothing on stdout."""
    done = cli("read", "rc1:" + "ab" * 32, "--root", tmp_path)
    assert done.returncode == 3
    assert done.stdout == b""
    assert b"missing" in done.stderr


def test_read_malformed_exits_4(tmp_path: Path) -> None:
    """A malformed reference exits 4 with the detail on stderr."""
    done = cli("read", "../../etc/passwd", "--root", tmp_path)
    assert done.returncode == 4
    assert done.stdout == b""
    assert b"malformed exact_ref" in done.stderr


def test_verify_finds_a_tampered_entry(tmp_path: Path) -> None:
    """After one byte of a stored entry flips, verify counts it broken and exits non-zero."""
    kept = store_in_process(tmp_path, {"kept": True})
    tampered = store_in_process(tmp_path, {"tampered": [1, 2, 3]})
    clean = cli("verify", "--root", tmp_path)
    assert clean.returncode == 0
    assert json.loads(clean.stdout) | {"root": ""} == {
        "root": "",
        "found": 2,
        "expired": 0,
        "missing": 0,
        "broken": 0,
        "broken_entries": [],
    }

    path = entry_path(tmp_path, tampered)
    data = bytearray(path.read_bytes())
    data[3] ^= 0x01
    path.write_bytes(bytes(data))

    done = cli("verify", "--root", tmp_path)
    assert done.returncode == 4
    report = json.loads(done.stdout)
    assert (report["found"], report["broken"]) == (1, 1)
    assert report["broken_entries"][0]["key"] == tampered
    assert tampered.encode() in done.stderr
    with ThreadPoolExecutor(max_workers=2) as pool:
        read_tampered, read_kept = pool.map(
            lambda ref: cli("read", ref, "--root", tmp_path), [tampered, kept]
        )
    assert read_tampered.returncode == 4
    assert b"does not verify" in read_tampered.stderr
    assert read_kept.returncode == 0


def test_prune_removes_entries_beyond_the_bound(tmp_path: Path) -> None:
    """``prune --max-entries 1`` keeps the most recently used entry and reports what it freed."""
    refs = [store_in_process(tmp_path, {"n": i, "pad": "x" * 100}) for i in range(3)]
    done = cli("prune", "--root", tmp_path, "--max-entries", "1")
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout)
    assert report["removed"] == 2
    assert report["freed_bytes"] > 200
    assert report["remaining"] == {"exact": 1}
    harness = rc.Harness(fs=rc.LocalWorkspace(tmp_path))
    states = [sync.response_compaction_read_exact(harness, ref, Any).state for ref in refs]
    assert states == ["missing", "missing", "found"]


@pytest.mark.parametrize(("command", "code"), [("verify", 1), ("prune", 1), ("read", 3)], ids=str)
def test_a_root_with_no_store_is_said_and_not_made(tmp_path: Path, command: str, code: int) -> None:
    """A mistyped --root: verify and prune fail (an empty verify passed a check run against
    the wrong path), read says missing; none of them creates the directories."""
    root = tmp_path / "typo" / "deeper"
    args = ["rc1:" + "0" * 64] if command == "read" else []
    done = cli(command, *args, "--root", root)
    assert done.returncode == code, done.stderr.decode()
    assert f"no store at {root}".encode() in done.stderr
    assert not (tmp_path / "typo").exists()


def test_a_bound_of_no_entries_is_a_usage_error(tmp_path: Path) -> None:
    """``--max-entries 0`` emptied the store under prune (the library refuses a bound of 0)."""
    store_in_process(tmp_path, {"n": 1})
    for command in (["prune"], ["compact", "-"]):
        done = cli(*command, "--root", tmp_path, "--max-entries", "0", stdin=b"{}")
        assert done.returncode == 2, done.stderr.decode()
        assert b"must be at least 1" in done.stderr
    assert json.loads(cli("verify", "--root", tmp_path).stdout)["found"] == 1


def test_bad_input_and_bad_usage(tmp_path: Path) -> None:
    """Invalid JSON exits 1, a missing file exits 1, and a usage mistake exits 2."""
    not_json = cli("compact", "-", "--root", tmp_path, stdin=b"{nope")
    assert not_json.returncode == 1
    assert not_json.stdout == b""
    assert b"ValueError" in not_json.stderr
    absent = cli("compact", tmp_path / "absent.json", "--root", tmp_path)
    assert absent.returncode == 1
    assert b"No such file" in absent.stderr
    usage = cli("compact", "-", "--summary-schema", "tests.schemas:Summary", stdin=b"{}")
    assert usage.returncode == 2
    assert b"--fallback is required" in usage.stderr
    bad_type = cli("read", "rc1:x", "--schema", "no_such_module:Type")
    assert bad_type.returncode == 2
    assert b"cannot load" in bad_type.stderr


@pytest.mark.parametrize("with_model", [False, True], ids=["no-model", "model"])
def test_demo_round_trip(tmp_path: Path, with_model: bool) -> None:
    """The demo compacts a generated response, reads it back equal, and exits 0."""
    with FakeOpenAI(fill_unscripted=True) as server:
        env = clean_env(OPENAI_BASE_URL=server.base_url, RESPONSE_COMPACTION_MODEL="m1,m2")
        done = cli("demo", "--orders", "3000", "--root", tmp_path, env=env if with_model else None)
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode()
    assert "equal to what went in: True" in out
    assert "exact_cache=reused" in out
    if with_model:
        assert "-> summarized" in out
        assert '"route": "m1"' in out
        assert "summary_cache=hit" in out
    else:
        assert "-> fallback (no_llm)" in out
    assert (tmp_path / "response-compaction-v1").is_dir()


def test_prune_broken_removes_only_what_verify_finds_broken(tmp_path: Path) -> None:
    """``prune --broken`` deletes the tampered entry and keeps the intact one."""
    kept = store_in_process(tmp_path, {"kept": True})
    tampered = store_in_process(tmp_path, {"tampered": [1, 2, 3]})
    path = entry_path(tmp_path, tampered)
    data = bytearray(path.read_bytes())
    data[3] ^= 0x01
    path.write_bytes(bytes(data))

    done = cli("prune", "--broken", "--root", tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout)["removed"] == 1
    assert not path.exists()
    assert cli("verify", "--root", tmp_path).returncode == 0
    assert cli("read", kept, "--root", tmp_path).returncode == 0
    assert cli("read", tampered, "--root", tmp_path).returncode == 3


def test_demo_is_imported_only_when_it_runs() -> None:
    """Starting the CLI (parser and commands) does not import the demo's generator."""
    script = (
        "import sys; from response_compaction._cli import build_parser; "
        "build_parser().parse_args(['read', 'rc1:' + '0' * 64]); "
        "print('response_compaction._cli._demo' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout == "False\n"


def test_read_part_checks_the_schema_first(tmp_path: Path) -> None:
    """``read --schema T --pointer P`` is broken when the value is not a T, as without --pointer."""
    ref = store_in_process(tmp_path, {"x": [1, 2]})
    for extra in ((), ("--pointer", "/x")):
        done = cli("read", ref, "--root", tmp_path, "--schema", "tests.schemas:Exact", *extra)
        assert done.returncode == 4, done.stdout
        assert b"broken: exact entry does not verify" in done.stderr
    ok = cli("read", ref, "--root", tmp_path, "--schema", "typing:Any", "--pointer", "/x/1")
    assert (ok.returncode, json.loads(ok.stdout)["value"]) == (0, 2)


def test_read_pages_with_pointer_start_stop_and_max_bytes(tmp_path: Path) -> None:
    """``read --pointer --start --stop --max-bytes`` prints one bounded part, then pages on."""
    document = big_document(500)
    ref = store_in_process(tmp_path, document)
    done = cli("read", ref, "--root", tmp_path, "--pointer", "/rows", "--start", "10")
    assert done.returncode == 0, done.stderr.decode()
    part = json.loads(done.stdout)
    assert part["start"] == 10
    assert part["total_items"] == 500
    assert part["value"] == document["rows"][10 : part["stop"]]
    assert "json" not in part
    small = cli("read", ref, "--root", tmp_path, "--pointer", "/rows", "--max-bytes", "300")
    first = json.loads(small.stdout)
    assert len(json.dumps(first["value"], separators=(",", ":"))) <= 300
    nxt = cli("read", ref, "--root", tmp_path, "--pointer", "/rows", "--start", first["next_start"])
    assert json.loads(nxt.stdout)["value"][0] == document["rows"][first["next_start"]]
    window = cli("read", ref, "--root", tmp_path, "--pointer", "/rows/3/name")
    assert json.loads(window.stdout)["value"] == "row 3"
    bad = cli("read", ref, "--root", tmp_path, "--pointer", "/nope")
    assert bad.returncode == 1
    assert b"LookupError" in bad.stderr
    whole = cli("read", ref, "--root", tmp_path)
    assert json.loads(whole.stdout) == document
