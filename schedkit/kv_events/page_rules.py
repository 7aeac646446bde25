"""The page rules of a stream check: which pages a stream holds, per KV-cache group and medium,
and what an event may do with them.

A page is held per KV-cache group (vLLM's ``group_idx``: a hybrid model stores a page in
several) and per medium (a tier's copy of a page still on the GPU is no second store); its
parent may be held in any medium of its group. Under the ``vllm`` profile a page is held in
copies, as vLLM counts them: two requests that compute the same page at once each cache a
block under its hash and each block is stored and later removed on its own; a request with
``kv_cache_report_mode`` "full" re-reports the pages it reused as ``BlockStored`` (never
removed for it); the offload connector announces a shared page once per chunk that holds it
and asks consumers to count them. So a page stored again is one more copy there, and only a
removal of a page with no copy left is a problem. SGLang's radix tree stores a page once, so
under its profiles a page stored again without being removed is a problem.

What the checker may hold is bounded: at most ``max_pages`` (group, page) keys. A store past
that stops the page rules (they could only guess) until the page set is known again
(``AllBlocksCleared``, a publisher restart); the report says from which seq on.
"""

from __future__ import annotations

from schedkit.kv_events.attention_groups import MAIN_ATTENTION_KINDS
from schedkit.kv_events.event_structs import BlockRemoved, BlockStored
from schedkit.kv_events.findings import Findings

__all__ = ["DEFAULT_MAX_CHECKED_PAGES", "PageRules"]

# (group, page) keys held. Measured (64-bit hashes, one medium): 76 bytes a page without a
# group (SGLang), 132 with one (vLLM names group 0): 76-132 MiB at the bound.
DEFAULT_MAX_CHECKED_PAGES = 1 << 20

# A held page's media: one medium with one copy (the usual case, kept as the medium itself),
# else {medium: copies}.
_Media = str | None | dict


class PageRules:
    """Follows the pages of one stream and records in ``findings`` what breaks the rules."""

    def __init__(
        self, findings: Findings, *, profile: str, max_pages: int = DEFAULT_MAX_CHECKED_PAGES
    ) -> None:
        if max_pages < 1:
            raise ValueError(f"max_pages must be >= 1, got {max_pages}")
        self.findings = findings
        self.max_pages = max_pages
        self.counts_copies = profile == "vllm"
        self.unchecked: list[tuple[int, str]] = []  # (from seq, until what)
        self._held: dict[int | tuple[int, int], _Media] = {}
        self._off_since: int | None = None

    @property
    def partial(self) -> bool:
        """Whether the page rules were off for part of the stream."""
        return bool(self.unchecked) or self._off_since is not None

    @property
    def pages_held(self) -> int:
        """(page, medium) pairs held."""
        return sum(len(m) if type(m) is dict else 1 for m in self._held.values())

    def known_again(self, seq: int | None) -> None:
        """The page set is known again (cleared at ``seq``, or a new publisher: None)."""
        self._held.clear()
        if self._off_since is not None:
            until = "a publisher restart" if seq is None else f"seq {seq} cleared them"
            self.unchecked.append((self._off_since, f"until {until}"))
            self._off_since = None

    def stored(self, seq: int, event: BlockStored) -> None:
        """Check a BlockStored: its tokens, its parent, pages stored again."""
        hashes = event.block_hashes
        vllm = self.counts_copies
        # vLLM's sliding-window and Mamba groups skip the pages outside the window (a null
        # block): the event's tokens still cover them, so it may name fewer hashes, even none,
        # and its parent may be such a page.
        skips = vllm and event.kv_cache_spec_kind not in (None, *MAIN_ATTENTION_KINDS)
        if not hashes and not skips:
            text = f"seq {seq}: a BlockStored with no hashes"
            self.findings.record("hashes", seq, text, follows=False)
            return
        if not self._tokens_fit(event, skips):
            text = (
                f"seq {seq}: {len(event.token_ids)} token ids for {len(hashes)} hashes of "
                f"block_size {event.block_size}"
            )
            self.findings.record("tokens", seq, text, follows=False)
        if self._off_since is not None or not hashes:
            return
        group, medium = event.group_idx, event.medium
        held = self._held
        parent = event.parent_block_hash
        if parent is not None and not skips and _key(group, parent) not in held:
            text = f"seq {seq}: parent {parent} of {hashes[0]}{_in(group, None)} not stored"
            self.findings.record("parent", seq, text)
        for h in hashes:
            key = _key(group, h)
            media = held.get(key, _ABSENT)
            if media is _ABSENT:
                if len(held) >= self.max_pages:
                    self._off_since = seq
                    held.clear()
                    return
                held[key] = medium
            elif type(media) is dict:
                copies = media.get(medium, 0)
                if copies and not vllm:
                    self._again(seq, h, group, medium)
                else:
                    media[medium] = copies + 1
            elif media == medium:
                if vllm:
                    held[key] = {medium: 2}
                else:
                    self._again(seq, h, group, medium)
            else:
                held[key] = {media: 1, medium: 1}

    def removed(self, seq: int, event: BlockRemoved) -> None:
        """Check a BlockRemoved: each page was held in its medium."""
        if self._off_since is not None:
            return
        group, medium, held = event.group_idx, event.medium, self._held
        for h in event.block_hashes:
            key = _key(group, h)
            media = held.get(key, _ABSENT)
            if type(media) is dict and medium in media:
                copies = media[medium]
                if copies > 1:
                    media[medium] = copies - 1
                elif len(media) > 1:
                    del media[medium]
                else:
                    del held[key]
            elif media is not _ABSENT and type(media) is not dict and media == medium:
                del held[key]
            else:
                text = f"seq {seq}: removed {h}{_in(group, medium)}, which is not stored"
                self.findings.record("removed", seq, text)

    def lines(self) -> list[str]:
        """What the page rules could not check, as report lines."""
        stretches = [*self.unchecked]
        if self._off_since is not None:
            stretches.append((self._off_since, "on"))
        return [
            f"  pages not checked from seq {first} {until}: more than {self.max_pages} pages "
            f"held at once (--max-pages)"
            for first, until in stretches
        ]

    def _tokens_fit(self, event: BlockStored, skips: bool) -> bool:
        size, count, hashes = event.block_size, len(event.token_ids), len(event.block_hashes)
        if self.counts_copies and size == 0 and count == 0 and hashes == 1:
            # vLLM's offload connector announces a page it has no metadata for with no tokens.
            return event.parent_block_hash is None
        if size < 1:
            return False
        if skips:
            return count % size == 0 and count >= size * hashes
        return count == size * hashes

    def _again(self, seq: int, h: int, group: int | None, medium: str | None) -> None:
        text = f"seq {seq}: {h}{_in(group, medium)} stored again without being removed"
        self.findings.record("stored", seq, text)


_ABSENT = object()


def _key(group: int | None, h: int) -> int | tuple[int, int]:
    return h if group is None else (group, h)


def _in(group: int | None, medium: str | None) -> str:
    """Where a page is, when the stream names it: `` (group 1, CPU)``."""
    where = []
    if group is not None:
        where.append(f"group {group}")
    if medium is not None and medium != "GPU":
        where.append(medium)
    return f" ({', '.join(where)})" if where else ""
