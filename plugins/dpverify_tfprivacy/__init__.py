"""Placeholder until the plugin lands."""


def implementations():
    return []
