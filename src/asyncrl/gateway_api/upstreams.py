"""Which upstream URLs the gateway accepts, in its flags and in `PUT /api/upstreams` alike: part of the wire
contract, so a caller can check a URL before it sends it."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from pydantic_core import PydanticCustomError


def check_upstream_urls(urls: Iterable[str]) -> tuple[str, ...]:
    """The upstream server roots (`server_root`: no trailing slash or `/v1`, duplicates dropped); a clear
    error otherwise.

    Shared by the configuration (flags) and `PUT /api/upstreams`, so both accept exactly the same URLs.
    """
    checked: dict[str, None] = {}
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise PydanticCustomError(
                "upstream_url", "upstream {url} must start with http:// or https://", {"url": repr(url)}
            )
        if not urlsplit(url).netloc or any(char.isspace() for char in url):
            raise PydanticCustomError(
                "upstream_url", "upstream {url} is not a URL with a host", {"url": repr(url)}
            )
        checked[server_root(url)] = None
    return tuple(checked)


OPENAI_BASE_SUFFIX = "/v1"
ENDPOINT_SUFFIXES = ("/chat/completions", "/completions", "/models")


def server_root(url: str) -> str:
    """The URL the gateway appends `/v1/<endpoint>` to, from a server root or an OpenAI base URL.

    vLLM's docs and every OpenAI client write the base URL with `/v1` (`http://host:8000/v1`); the gateway
    forwards to `{root}/v1/chat/completions`, so both spellings name the same server. An endpoint's own URL
    is refused: it would be forwarded to `.../chat/completions/v1/chat/completions` and get vLLM's bare 404.
    """
    root = url.rstrip("/")
    for suffix in ENDPOINT_SUFFIXES:
        if root.endswith(suffix):
            raise PydanticCustomError(
                "upstream_url",
                "upstream {url} is an endpoint's URL; give the server's base URL, e.g. {base}",
                {"url": repr(url), "base": repr(root[: -len(suffix)])},
            )
    if root.endswith(OPENAI_BASE_SUFFIX):
        root = root[: -len(OPENAI_BASE_SUFFIX)]
    return root
