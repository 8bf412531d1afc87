"""The test project's own app: an Order model."""
