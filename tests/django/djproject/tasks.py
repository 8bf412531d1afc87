"""The project's Ratchet app: built without a URL, pointed at the project's database by
ratchet.contrib.django.get_app()."""

from typing import Any

from shop.models import Order

from ratchet import App

app = App()


@app.task(name="fulfil")
def fulfil(ctx: Any, order_id: int) -> dict[str, Any]:
    """Mark the order fulfilled (through the ORM, from the worker's task thread)."""
    Order.objects.filter(pk=order_id).update(status="fulfilled")
    return {"order_id": order_id}
