"""How the download script divides its work: a span per missing chunk, and near the end an
idle connection taking the back half of the largest span in flight, never a byte twice."""

from __future__ import annotations

from kimik3_operator.programs.download import (
    READ_SIZE,
    STEAL_MIN_BYTES,
    ChunkMap,
    RepoFile,
    Span,
    Target,
    steal,
    work_items,
)

MIB = 1024 * 1024


def _target(tmp: str, size: int, chunk: int = 16 * MIB, done: tuple[int, ...] = ()) -> Target:
    chunks = ChunkMap(f"{tmp}/blob.incomplete", size, chunk)
    for index in done:
        chunks.done[index] = 1
    return Target("m/x", RepoFile("w.safetensors", size, "a" * 64, "b" * 40), "u", "blob", chunks)


def test_a_span_for_each_missing_chunk_in_file_order(tmp_path: object) -> None:
    first = _target(str(tmp_path), 40 * MIB, done=(1,))
    second = _target(str(tmp_path), 5 * MIB)
    spans = work_items([first, second])
    assert [(s.target is first, s.index, s.at, s.end) for s in spans] == [
        (True, 0, 0, 16 * MIB),
        (True, 2, 32 * MIB, 40 * MIB),
        (False, 0, 0, 5 * MIB),
    ]
    assert first.pieces_left == {0: 1, 2: 1} and second.pieces_left == {0: 1}


def test_an_idle_connection_takes_the_back_half_of_the_largest_span(tmp_path: object) -> None:
    target = _target(str(tmp_path), 64 * MIB, chunk=64 * MIB)
    (span,) = work_items([target])
    span.at = 10 * MIB  # its owner has written this far
    small = Span(target, 0, 0, 2 * MIB)
    taken = steal([small, span])
    assert taken is not None and taken.index == 0 and taken.end == 64 * MIB
    # The owner keeps what it is reading now and half of the rest; nothing overlaps.
    assert span.end == taken.at >= span.at + READ_SIZE
    assert taken.at - span.at - READ_SIZE in ((64 - 11) * MIB // 2, (64 - 11) * MIB // 2 + 1)
    # The chunk is whole only when both halves are in.
    assert target.pieces_left[0] == 2


def test_nothing_worth_a_request_is_taken(tmp_path: object) -> None:
    target = _target(str(tmp_path), 64 * MIB, chunk=64 * MIB)
    (span,) = work_items([target])
    span.at = span.end - READ_SIZE - STEAL_MIN_BYTES + 1
    assert steal([span]) is None and target.pieces_left[0] == 1
    assert steal([]) is None
