"""`aamp login|logout|whoami`: sign in with a password for an API token kept in a login
profile (`aamp.client.login`, `aamp.client.profiles`), sign out (the token is revoked), and
say who the CLI acts as.

    aamp login [--url URL] [--profile NAME] [--username NAME] [--password-stdin]
    aamp logout [--profile NAME]
    aamp whoami

The profile named (or `default`) becomes the default one, which every later command uses
unless AAMP_TOKEN is set (`aamp.client.find_credentials`); AAMP_PROFILE picks another.
"""

from __future__ import annotations

import argparse
import sys

TYPE_CHECKING = False  # typing's own costs ~15 ms of start-up: see aamp.cli
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    from aamp.client import Client
    from aamp.config import Settings

    T = TypeVar("T")


def login_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="the control plane, http://HOST:PORT (default: AAMP_HOST:PORT)")
    p.add_argument("--profile", help="the profile to store the token in (default: default)")
    p.add_argument("--username", help="asked for when not given")
    p.add_argument(
        "--password-stdin", action="store_true", help="read the password from stdin's first line"
    )


def logout_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", help="the profile to sign out of (default: the default one)")


def login(args: argparse.Namespace, settings: Settings) -> int:
    from aamp.client import login as sign_in

    username = args.username or input("username: ").strip()
    if args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        import getpass

        password = getpass.getpass(f"password for {username}: ")
    name, held = _client_errors(
        lambda: sign_in(
            settings.env, args.url or settings.api_url, username, password, profile=args.profile
        )
    )
    print(
        f"logged in to {held['url']} as {username} (profile {name}; token {held['token_id']}, "
        f"expires {(held.get('expires_at') or 'never')[:10]})"
    )
    return 0


def logout(args: argparse.Namespace, settings: Settings) -> int:
    from aamp.client import logout as sign_out

    name = _client_errors(lambda: sign_out(settings.env, args.profile))
    print(f"logged out of profile {name}; its token is revoked")
    return 0


def whoami(client: Client, args: argparse.Namespace) -> int:
    me = client.whoami()
    print(f"{me['username']} ({me['role']}) at {client.base}")
    return 0


def _client_errors(work: Callable[[], T]) -> T:
    """The client's refusals as the command's error (`aamp: MESSAGE`, exit 1)."""
    from aamp.cli.command import CommandError
    from aamp.client import ClientError

    try:
        return work()
    except ClientError as exc:
        raise CommandError(exc.message) from None
