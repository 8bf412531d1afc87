"""Integrations with frameworks, each optional (its framework is an extra):
:mod:`ratchet.contrib.django` (``pip install 'ratchet[django]'``).

They are faces like the CLI and the dashboard: they use the public names of
:mod:`ratchet` and :mod:`ratchet.control` only.
"""
