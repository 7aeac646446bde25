"""AdminControls alone: the token, and the owner of a pause that ends with its connection."""

from __future__ import annotations

from schedkit.components.io.admin_controls import AdminControls
from schedkit.components.io.io_struct import ControlReq


def test_admin_controls_need_the_token_and_others_do_not():
    admin = AdminControls("tok")
    for kind in ("pause", "continue", "flush"):
        assert "got none" in admin.refusal(ControlReq(type=kind))
        assert "got a different one" in admin.refusal(ControlReq(type=kind, token="nope"))
        assert admin.refusal(ControlReq(type=kind, token="tok")) is None
    assert admin.refusal(ControlReq(type="get_loads")) is None
    assert admin.refusal(ControlReq(type="abort", rid="r")) is None
    assert admin.refused == 6


def test_without_a_token_admin_controls_are_refused_to_everyone():
    admin = AdminControls(None)
    assert "started without one" in admin.refusal(ControlReq(type="pause", token="anything"))


def test_a_connected_pause_ends_with_its_owner_unless_taken_over():
    admin = AdminControls("tok")
    admin.accepted("a", ControlReq(type="pause", token="tok", while_connected=True))
    assert not admin.owner_left("b") and admin.owner_left("a") and not admin.owner_left("a")
    admin.accepted("a", ControlReq(type="pause", token="tok", while_connected=True))
    admin.accepted("b", ControlReq(type="continue", token="tok"))
    assert not admin.owner_left("a")
    admin.accepted("a", ControlReq(type="pause", token="tok", while_connected=True))
    admin.accepted("b", ControlReq(type="flush", token="tok"))  # a flush leaves the pause
    assert admin.owner_left("a")
