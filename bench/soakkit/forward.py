"""A small TCP forwarder, run as its own process in the root network namespace:
``python -m soakkit.forward LISTEN_HOST:PORT=TARGET_HOST:PORT ...``.

Each pair binds ``LISTEN`` (a veth address of the root namespace) and copies bytes both
ways to ``TARGET`` (a loopback service: PostgreSQL listens on 127.0.0.1 only, and so does
the counting service). Prints ``READY`` once every listener is bound; exits when its
standard input closes (the soak went away) or on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable

__all__ = ["main", "parse_pair"]

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def parse_pair(text: str) -> tuple[tuple[str, int], tuple[str, int]]:
    """``"10.23.10.1:5432=127.0.0.1:5432"`` -> ``(("10.23.10.1", 5432), ("127.0.0.1", 5432))``.

    Raises:
        ValueError: not ``HOST:PORT=HOST:PORT``.
    """
    listen, sep, target = text.partition("=")
    if not sep:
        raise ValueError(f"expected LISTEN_HOST:PORT=TARGET_HOST:PORT, got {text!r}")

    def split(part: str) -> tuple[str, int]:
        host, colon, port = part.rpartition(":")
        if not colon or not host:
            raise ValueError(f"expected HOST:PORT, got {part!r}")
        return host, int(port)

    return split(listen), split(target)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _serve(pairs: list[tuple[tuple[str, int], tuple[str, int]]]) -> None:
    def handler_for(target: tuple[str, int]) -> Handler:
        async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
            try:
                tr, tw = await asyncio.wait_for(asyncio.open_connection(*target), 5.0)
            except (OSError, TimeoutError):
                cw.close()
                return
            await asyncio.gather(_pipe(cr, tw), _pipe(tr, cw))

        return handle

    servers = []
    for listen, target in pairs:
        servers.append(await asyncio.start_server(handler_for(target), *listen,
                                                  reuse_address=True))
    print("READY", flush=True)
    loop = asyncio.get_running_loop()
    stdin_closed = loop.run_in_executor(None, sys.stdin.buffer.read)
    await stdin_closed
    for s in servers:
        s.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point: forward every ``LISTEN=TARGET`` pair until stdin closes."""
    pairs = [parse_pair(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not pairs:
        print("usage: python -m soakkit.forward LISTEN_HOST:PORT=TARGET_HOST:PORT ...",
              file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
