"""Who may pause, continue and flush a server: the clients presenting the admin token given at
start. And a pause that ends with the connection that asked for it."""

from __future__ import annotations

import hmac
from collections.abc import Hashable

import attrs

from schedkit.components.io.io_struct import ControlReq

__all__ = ["ADMIN_CONTROLS", "AdminControls"]

ADMIN_CONTROLS = frozenset({"pause", "continue", "flush"})


@attrs.define(slots=True, eq=False)
class AdminControls:
    """Checks control messages against ``token`` (None: admin controls refused to all) and
    keeps the owner of a ``while_connected`` pause."""

    token: str | None = attrs.field(repr=False)
    refused: int = 0
    pause_owner: Hashable | None = None

    def refusal(self, msg: ControlReq) -> str | None:
        """Why ``msg`` is refused, or None if it may go to the scheduler."""
        if msg.type not in ADMIN_CONTROLS:
            return None
        token, given = self.token, msg.token
        if token is not None and given is not None and hmac.compare_digest(given, token):
            return None
        self.refused += 1
        if token is None:
            why = "was started without one"
        else:
            why = "got none" if given is None else "got a different one"
        return (
            f"{msg.type} needs the admin token (ControlReq.token) and this server {why} "
            "(schedkit serve --admin-token)"
        )

    def accepted(self, client: Hashable, msg: ControlReq) -> None:
        """Note an accepted control message of ``client``: a ``while_connected`` pause makes it
        the owner; a later pause or continue takes over."""
        if msg.type == "pause" and msg.while_connected:
            self.pause_owner = client
        elif msg.type in ("pause", "continue"):
            self.pause_owner = None

    def owner_left(self, client: Hashable) -> bool:
        """Whether ``client`` owned the pause in force (which then ends)."""
        if client is not self.pause_owner or client is None:
            return False
        self.pause_owner = None
        return True
