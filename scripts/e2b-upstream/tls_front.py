"""A TLS front for the E2B upstream measurement (scripts/e2b-upstream.sh):
terminates TLS with the given certificate on --listen and relays the bytes,
as they are, to the daemon on --to, as the TLS proxy in front of a
`--domain` daemon does in production (docs/setup.md). Test harness only."""

import argparse
import asyncio
import ssl


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--listen", required=True, help="host:port")
    p.add_argument("--to", required=True, help="host:port of the daemon")
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    a = p.parse_args()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(a.cert, a.key)
    to_host, to_port = a.to.rsplit(":", 1)

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(to_host, int(to_port))
        except OSError:
            cw.close()
            return
        await asyncio.gather(pipe(cr, uw), pipe(ur, cw))

    host, port = a.listen.rsplit(":", 1)
    server = await asyncio.start_server(handle, host, int(port), ssl=ctx)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
