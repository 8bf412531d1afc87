"""Management commands of :mod:`ratchet.contrib.django`."""
