"""Test doubles of the swap_for_mock example."""
