"""No models: Ratchet's tables are the ledger's (made by ``manage.py migrate`` through the
``pre_migrate`` signal, which Django sends only to apps with a models module)."""
