"""What a stream check found, grouped so that the report stays short and puts causes first.

Problems of one kind share a line (the first instance, then how many more and their first
seqs). A cause (lost history, an undecodable payload, a live-order anomaly the recovered
stream could not undo) leaves the page set incomplete: page problems that come after it count
under it, as problems that follow from it, until the page set is known again.
"""

from __future__ import annotations

import attrs

__all__ = ["Finding", "Findings"]

_SEQS_SHOWN = 5  # seqs listed for the further instances of one kind of problem
# Report order: what breaks everything first, page rules last.
_ORDER = (
    "frames",
    "shape",
    "lost",
    "duplicated",
    "rewound",
    "reordered",
    "rank",
    "hashes",
    "tokens",
)


@attrs.define
class Finding:
    """One kind of problem: the first instance's text, how many more there were (the first
    few of their seqs), and how many problems followed from it (with the first)."""

    text: str
    more: int = 0
    seqs: list[int] = attrs.Factory(list)
    follow: int = 0
    follow_example: str = ""


# kind, seq, text, follows (a page problem an earlier cause may explain), cause; None where
# the page set became known again
_Entry = tuple[str, int, str, bool, bool] | None


class Findings:
    """The problems found so far, by kind (``by_kind``) and cause.

    While a live frame is handled (``hold``), what is recorded waits until the frame is
    judged (``release``): if the frame itself is at fault, it is the cause of what its
    handling turned up.
    """

    def __init__(self) -> None:
        self.by_kind: dict[str, Finding] = {}
        self.unsure: Finding | None = None  # the cause the page set is incomplete by
        self._held: list[_Entry] | None = None

    def __bool__(self) -> bool:
        return bool(self.by_kind)

    @property
    def count(self) -> int:
        """Problems found, not counting those that follow from another."""
        return sum(1 + f.more for f in self.by_kind.values())

    @property
    def follow(self) -> int:
        """Problems that follow from another."""
        return sum(f.follow for f in self.by_kind.values())

    def record(
        self, kind: str, seq: int, text: str, *, follows: bool = True, cause: bool = False
    ) -> None:
        """Note a problem. ``follows``: a page problem that an earlier cause may explain;
        ``cause``: the page set is incomplete from here on."""
        entry = (kind, seq, text, follows and not cause, cause)
        if self._held is None:
            self._file(*entry)
        else:
            self._held.append(entry)

    def known_again(self) -> None:
        """The page set is known again (cleared, or a new publisher)."""
        if self._held is None:
            self.unsure = None
        else:
            self._held.append(None)

    def hold(self) -> None:
        """Keep what is recorded until ``release``."""
        self._held = []

    def release(self, cause: tuple[str, int, str, bool] | None = None) -> None:
        """File what was held; with ``cause`` (kind, seq, text, and whether the page set is
        incomplete after it), file that first and count under it what a cause may explain."""
        held, self._held = self._held or [], None
        if cause is None:
            for entry in held:
                if entry is None:
                    self.unsure = None
                else:
                    self._file(*entry)
            return
        kind, seq, text, unsure = cause
        finding = self._file(kind, seq, text, False, unsure)
        for entry in held:
            if entry is None:  # the cause comes after the frame: it decides
                continue
            if entry[3] or entry[4]:
                finding.follow += 1
                finding.follow_example = finding.follow_example or entry[2]
            else:
                self._file(*entry)

    def add(self, kind: str, text: str) -> None:
        """A problem that stands alone, with no seq (e.g. a count of bad frames)."""
        self.by_kind[kind] = Finding(text)

    def _file(self, kind: str, seq: int, text: str, follows: bool, cause: bool) -> Finding:
        if follows and self.unsure is not None:
            finding = self.unsure
            finding.follow += 1
            finding.follow_example = finding.follow_example or text
            return finding
        finding = self.by_kind.get(kind)
        if finding is None:
            finding = self.by_kind[kind] = Finding(text)
        else:
            finding.more += 1
            if len(finding.seqs) < _SEQS_SHOWN:
                finding.seqs.append(seq)
        if cause:
            self.unsure = finding
        return finding

    def lines(self) -> list[str]:
        """One line per kind, causes first, each with a line for what follows from it."""
        lines = []
        for kind in sorted(self.by_kind, key=_place):
            finding = self.by_kind[kind]
            line = f"  {finding.text}"
            if finding.more:
                seqs = ", ".join(map(str, finding.seqs))
                etc = ", ..." if finding.more > len(finding.seqs) else ""
                line += f" (and {finding.more} more like it: seqs {seqs}{etc})"
            lines.append(line)
            if finding.follow:
                lines.append(
                    f"    then {finding.follow} problems that follow from it, e.g. "
                    f"{finding.follow_example}"
                )
        return lines


def _place(kind: str) -> int:
    head = kind.split()[0]
    return _ORDER.index(head) if head in _ORDER else len(_ORDER)
