"""The agent server's append-only event log: numbering, reads from any point, a torn tail, waiting readers."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from executor.event_log import EventLog

REPOSITORY = Path(__file__).parent.parent


def test_records_are_numbered_from_one_and_read_after_any_sequence(tmp_path: Path) -> None:
    log = EventLog(str(tmp_path / "events.jsonl"))
    assert [log.append(b'{"n":%d}' % n) for n in range(5)] == [1, 2, 3, 4, 5]
    assert log.read(0) == [b'{"n":%d}' % n for n in range(5)]
    assert log.read(3) == [b'{"n":3}', b'{"n":4}']
    assert log.read(1, limit=2) == [b'{"n":1}', b'{"n":2}']
    assert log.read(5) == []


def test_nothing_is_dropped_past_upstreams_1024_entry_ring(tmp_path: Path) -> None:
    log = EventLog(str(tmp_path / "events.jsonl"))
    for n in range(3000):
        log.append(b"%d" % n)
    assert log.read(0, limit=1) == [b"0"]
    assert len(log.read(0)) == 3000


def test_a_reopened_log_keeps_its_records_and_cuts_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(str(path))
    log.append(b"one")
    log.append(b"two")
    log.close()
    with path.open("ab") as file:
        file.write(b'{"half')  # the executor killed mid-write
    reopened = EventLog(str(path))
    assert len(reopened) == 2
    assert reopened.append(b"three") == 3
    assert reopened.read(1) == [b"two", b"three"]


def test_a_record_with_a_newline_is_refused(tmp_path: Path) -> None:
    log = EventLog(str(tmp_path / "events.jsonl"))
    with pytest.raises(ValueError, match="one line"):
        log.append(b"a\nb")
    assert len(log) == 0


def test_a_waiting_reader_wakes_for_a_new_record_and_for_the_close(tmp_path: Path) -> None:
    async def scenario() -> None:
        log = EventLog(str(tmp_path / "events.jsonl"))
        waiter = asyncio.create_task(log.wait(0, timeout=30))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        log.append(b"x")
        await asyncio.wait_for(waiter, 5)
        closing = asyncio.create_task(log.wait(1, timeout=30))
        await asyncio.sleep(0.01)
        log.close()
        await asyncio.wait_for(closing, 5)
        assert log.closed

    asyncio.run(scenario())


def test_a_write_past_a_file_size_limit_leaves_the_log_whole(tmp_path: Path) -> None:
    """A record that does not fit (disk full, RLIMIT_FSIZE) is taken back: the records before it read as they were,
    and the next one lands after them (in a child, so the limit is not this process's)."""
    script = f"""
import resource, signal
from executor.event_log import EventLog
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
log = EventLog({str(tmp_path / "events.jsonl")!r})
log.append(b'{{"n":1}}')
resource.setrlimit(resource.RLIMIT_FSIZE, (100, resource.RLIM_INFINITY))
try:
    log.append(b'{{"pad":"' + b"b" * 200 + b'"}}')
except OSError as exc:
    print("refused", exc.errno)
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
print(log.append(b'{{"n":2}}'), log.read(0))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPOSITORY)
    assert done.stdout.splitlines() == ["refused 27", "2 [b'{\"n\":1}', b'{\"n\":2}']"]
    assert EventLog(str(tmp_path / "events.jsonl")).read(0) == [b'{"n":1}', b'{"n":2}']
