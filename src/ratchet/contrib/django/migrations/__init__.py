"""Django migrations of ratchet.contrib.django: only the admin page's permission."""
